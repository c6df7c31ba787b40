/**
 * The HTTP API end to end: the real app on the shipped models, a real faiss index on disk, over
 * loopback with supertest. Covers ingest, query, restart persistence and every error reply.
 */
import assert from 'node:assert/strict';
import { before, describe, test } from 'node:test';
import request from 'supertest';
import type { Express } from 'express';
import type { Config } from '../src/config/config.js';
import { loadModels, RagService, type Models } from '../src/service/rag.js';
import { createApp } from '../src/server/app.js';
import { invalidUtf8Offset } from '../src/server/json-body.js';
import { cp, mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { faiss, ROOT, smallCorpus, tempDir, testConfig } from './helpers.js';

const DOCS = ['task-scheduling-cron-atd', 'apt-cache', 'quotas', 'rights-management', 'ipv6', 'syslog'];
let cfg: Config;
let models: Models;
let service: RagService;
let app: Express;

interface ErrorBody {
  error: { code: string; message: string };
}

function assertError(res: request.Response, status: number, code: string): void {
  assert.equal(res.status, status, JSON.stringify(res.body));
  const body = res.body as ErrorBody;
  assert.equal(body.error.code, code);
  assert.equal(typeof body.error.message, 'string');
  assert.ok(body.error.message.length > 0);
}

before(async () => {
  cfg = testConfig({ RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, DOCS) });
  models = await loadModels(cfg);
  service = await RagService.start(cfg, models);
  app = createApp(service);
});

describe('health and query', () => {
  test('GET /healthz reports the ingested sample corpus and the providers', async () => {
    const res = await request(app).get('/healthz').expect(200);
    assert.equal(res.body.status, 'ok');
    assert.equal(res.body.documents, DOCS.length);
    assert.ok(res.body.chunks > DOCS.length);
    assert.deepEqual(res.body.providers, { embedder: 'cpu', reranker: 'cpu', decoder: 'cpu' });
    // The default decoder: the shipped one in the genai layout, run through ONNX Runtime's C API.
    assert.deepEqual(res.body.decoder, { layout: 'genai', run_path: 'direct' });
  });

  test('POST /query answers with citations, usage and stage timings', async () => {
    const res = await request(app)
      .post('/query')
      .send({ query: 'How can I stop one particular user from scheduling cron jobs?', max_new_tokens: 24 })
      .expect(200);
    const b = res.body;
    assert.equal(typeof b.answer, 'string');
    assert.ok(b.answer.length > 0);
    assert.ok(b.citations.length >= 1 && b.citations.length <= cfg.defaultRerankTopN);
    for (const c of b.citations) {
      assert.ok(DOCS.includes(c.doc_id));
      assert.equal(typeof c.chunk_id, 'number');
      assert.equal(typeof c.score, 'number');
      assert.ok(c.text.length > 0);
    }
    assert.ok(b.citations.some((c: { doc_id: string }) => c.doc_id === 'task-scheduling-cron-atd'), 'the cron document is cited');
    assert.ok(b.usage.prompt_tokens > 0 && b.usage.prompt_tokens <= cfg.promptBudgetTokens);
    assert.ok(b.usage.completion_tokens >= 1 && b.usage.completion_tokens <= 24);
    for (const k of ['embed', 'search', 'rerank', 'generate']) assert.ok(b.timings_ms[k] >= 0, k);
    assert.ok(b.retrieval.after_dedupe <= b.retrieval.after_prune && b.retrieval.after_prune <= b.retrieval.hits);
  });

  test('request knobs are honoured: top_k, rerank_top_n, max_new_tokens', async () => {
    const res = await request(app)
      .post('/query')
      .send({ query: 'disk quota limits for a user', top_k: 4, rerank_top_n: 1, max_new_tokens: 3 })
      .expect(200);
    assert.equal(res.body.retrieval.hits, 4);
    assert.equal(res.body.citations.length, 1);
    assert.ok(res.body.usage.completion_tokens <= 3);
  });

  test('greedy answers are deterministic; seeded sampling is repeatable', async () => {
    const q = { query: 'What does the sticky bit do?', max_new_tokens: 12 };
    const a = await request(app).post('/query').send(q).expect(200);
    const b = await request(app).post('/query').send(q).expect(200);
    assert.equal(a.body.answer, b.body.answer);
    const s = { ...q, temperature: 1.0, seed: 42 };
    const c = await request(app).post('/query').send(s).expect(200);
    const d = await request(app).post('/query').send(s).expect(200);
    assert.equal(c.body.answer, d.body.answer);
  });
});

describe('LoRA adapters', () => {
  const q = { query: 'What does the sticky bit do?', max_new_tokens: 16 };

  test('a request names an adapter: it generates with it, in a slot the budget counts, and it is unloaded after', async () => {
    const base = await request(app).post('/query').send(q).expect(200);
    const res = await request(app).post('/query').send({ ...q, adapter: 'demo-r8' }).expect(200);
    assert.equal(res.body.adapter.name, 'demo-r8');
    assert.match(res.body.adapter.key, /^demo-r8@[0-9a-f]{16}$/);
    assert.notEqual(res.body.answer, base.body.answer, 'the adapter changes the answer');
    assert.deepEqual(res.body.citations.map((c: { chunk_id: number }) => c.chunk_id), base.body.citations.map((c: { chunk_id: number }) => c.chunk_id), 'retrieval is the base model\'s');
    // Its weights live in the slots allocated at start-up (a component of the budget, like the KV pool):
    // the request itself is predicted as the base model's, both counting their rows of gathered slots.
    const stage = (r: request.Response, st: string) => r.body.guard.as_run.predicted_stage_bytes[st] as number;
    assert.equal(stage(res, 'decode'), stage(base, 'decode'));
    assert.ok(service.adapterSlotBytes > 0);
    assert.equal(service.workspaceBytes, service.budget.budgetBytes - service.weightBytes - service.adapterSlotBytes - service.engine.pool.bytes - service.store.indexBytes - service.allocatorWarmBytes);
    // The KV depends on the adapter: the base model's cached prompt is no hit for it, its own is.
    assert.ok(base.body.guard.as_run.cached_prompt_tokens > 0, 'asked before in this file: a prefix hit');
    assert.equal(res.body.guard.as_run.cached_prompt_tokens, 0);
    const again = await request(app).post('/query').send({ ...q, adapter: 'demo-r8' }).expect(200);
    assert.equal(again.body.answer, res.body.answer, 'greedy with an adapter is deterministic');
    assert.ok(again.body.guard.as_run.cached_prompt_tokens > 0, 'a hit on the same adapter\'s blocks');
    const m = (await request(app).get('/debug/memory').expect(200)).body;
    assert.deepEqual(m.adapters.loaded, [], 'nothing stays loaded');
    assert.equal(m.adapters.slots.free, m.adapters.slots.max_loras, 'every slot free again');
    assert.ok(m.adapters.loads >= 2 && m.adapters.loads === m.adapters.unloads, JSON.stringify(m.adapters));
  });

  test('concurrent requests with different adapters and none are each answered as alone', async () => {
    const names = [undefined, 'demo-r8', 'demo-qv-r4', 'demo-r8'];
    const alone: string[] = [];
    for (const a of names) alone.push((await request(app).post('/query').send({ ...q, adapter: a }).expect(200)).body.answer);
    const together = await Promise.all(names.map((a) => request(app).post('/query').send({ ...q, adapter: a })));
    assert.deepEqual(together.map((r) => r.status), [200, 200, 200, 200]);
    assert.deepEqual(together.map((r) => r.body.answer), alone);
    assert.deepEqual(service.adapters.stats().loaded, []);
  });

  test('with every adapter slot held, a request for another waits, then gets 503 adapters_busy with Retry-After', async () => {
    const dir = await tempDir('ragguard-adapters-');
    for (const n of ['b1', 'b2', 'b3', 'b4', 'b5']) await cp(path.join(ROOT, 'models', 'adapters', 'demo-qv-r4'), path.join(dir, n), { recursive: true });
    const busy = new RagService({ ...cfg, adapterDir: dir, queueTimeoutMs: 300 }, models, service.store);
    const held = await Promise.all(['b1', 'b2', 'b3', 'b4'].map((n) => busy.adapters.acquire(n)));
    const res = await request(createApp(busy)).post('/query').send({ ...q, adapter: 'b5' });
    assertError(res, 503, 'adapters_busy');
    assert.ok(Number(res.headers['retry-after']) >= 1);
    for (const l of held) l.release();
    const ok = await request(createApp(busy)).post('/query').send({ ...q, adapter: 'b5' }).expect(200);
    assert.equal(ok.body.adapter.name, 'b5');
    assert.equal(busy.adapters.stats().slots.free, 4);
  });

  test('a malformed adapter is 422 adapter_invalid; adapters off is 400 adapter_not_found', async () => {
    const dir = await tempDir('ragguard-adapters-');
    await mkdir(path.join(dir, 'broken'));
    await writeFile(path.join(dir, 'broken', 'adapter_config.json'), JSON.stringify({ peft_type: 'LORA', use_dora: true }));
    await writeFile(path.join(dir, 'broken', 'adapter_model.safetensors'), '');
    const other = createApp(new RagService({ ...cfg, adapterDir: dir }, models, service.store));
    assertError(await request(other).post('/query').send({ ...q, adapter: 'broken' }), 422, 'adapter_invalid');
    const off = createApp(new RagService({ ...cfg, adapterDir: '' }, models, service.store));
    const res = await request(off).post('/query').send({ ...q, adapter: 'demo-r8' });
    assertError(res, 400, 'adapter_not_found');
    assert.match(res.body.error.message, /RAGGUARD_ADAPTER_DIR/);
  });
});

describe('documents', () => {
  const fact = 'The zorblaxd daemon listens on TCP port 4711 and writes its journal to /var/log/zorblax.log. ' +
    'To restart zorblaxd, run systemctl restart zorblaxd as root.';

  test('POST /documents ingests, and the new text is retrievable', async () => {
    const res = await request(app).post('/documents').send({ doc_id: 'zorblax', title: 'The zorblaxd daemon', text: fact }).expect(201);
    assert.deepEqual(res.body.documents, [{ doc_id: 'zorblax', title: 'The zorblaxd daemon', chunks: 1, collection: 'default' }]);
    const q = await request(app).post('/query').send({ query: 'Which port does zorblaxd listen on?', max_new_tokens: 8 }).expect(200);
    assert.equal(q.body.citations[0].doc_id, 'zorblax');
  });

  test('a batch of documents is chunked with overlap; ids are derived when absent', async () => {
    const long = Array.from({ length: 400 }, (_, i) => `word${i % 37} item${i}`).join(' ');
    const res = await request(app)
      .post('/documents')
      .send({ documents: [{ text: long }, { doc_id: 'short-one', text: 'A short note about nothing.' }] })
      .expect(201);
    const [a, b] = res.body.documents;
    assert.match(a.doc_id, /^doc-[0-9a-f]{16}$/);
    assert.ok(a.chunks > 3);
    assert.equal(b.doc_id, 'short-one');
  });

  test('an existing doc_id is a 409, and nothing of the batch is ingested', async () => {
    const before = faiss(service).documentCount;
    const res = await request(app).post('/documents').send({ documents: [{ doc_id: 'fresh', text: 'x y z' }, { doc_id: 'zorblax', text: fact }] });
    assertError(res, 409, 'document_exists');
    assert.equal(faiss(service).documentCount, before);
    assert.equal(faiss(service).has('fresh'), false);
  });

  test('ingest progress counts documents embedded while the batch is not yet visible', async () => {
    const seen: { done: number; visible: number }[] = [];
    const embed = models.embedder.embed.bind(models.embedder);
    const before = faiss(service).documentCount;
    models.embedder.embed = async (texts) => {
      seen.push({ done: service.ingestProgress?.done ?? -1, visible: faiss(service).documentCount });
      return embed(texts);
    };
    try {
      await service.ingest([{ docId: 'progress-a', text: 'alpha beta gamma' }, { docId: 'progress-b', text: 'delta epsilon' }]);
    } finally {
      models.embedder.embed = embed;
    }
    assert.deepEqual(seen, [{ done: 0, visible: before }, { done: 1, visible: before }]);
    assert.deepEqual(service.ingestProgress, { done: 2, of: 2 });
    assert.equal(faiss(service).documentCount, before + 2);
  });

  test('the index survives a restart, without re-ingesting the corpus', async () => {
    const restarted = await RagService.start(cfg, models);
    assert.equal(faiss(restarted).documentCount, faiss(service).documentCount);
    assert.equal(faiss(restarted).chunkCount, faiss(service).chunkCount);
    const q = await request(createApp(restarted)).post('/query').send({ query: 'zorblaxd journal log file', max_new_tokens: 4 }).expect(200);
    assert.equal(q.body.citations[0].doc_id, 'zorblax');
  });
});

describe('errors are a status plus {error: {code, message}}', () => {
  const cases: [string, unknown, number, string][] = [
    ['missing query', {}, 400, 'invalid_field'],
    ['empty query', { query: '   ' }, 400, 'invalid_field'],
    ['top_k zero', { query: 'x', top_k: 0 }, 400, 'invalid_field'],
    ['top_k over the limit', { query: 'x', top_k: 100000 }, 400, 'invalid_field'],
    ['fractional max_new_tokens', { query: 'x', max_new_tokens: 2.5 }, 400, 'invalid_field'],
    ['negative temperature', { query: 'x', temperature: -1 }, 400, 'invalid_field'],
    ['unknown field', { query: 'x', topk: 3 }, 400, 'unknown_field'],
    ['array body', [1, 2], 400, 'invalid_body'],
    ['unknown adapter', { query: 'x', adapter: 'legal-v2' }, 400, 'adapter_not_found'],
    ['query over the token limit', { query: 'why '.repeat(200) }, 413, 'query_too_long'],
  ];
  for (const [name, body, status, code] of cases) {
    test(`POST /query: ${name} -> ${status} ${code}`, async () => {
      assertBodyError(await request(app).post('/query').send(body as object), status, code);
    });
  }

  /** Validation problems come all at once: 400 invalid_body listing each one with its own code (schemas.ts). */
  function assertBodyError(res: request.Response, status: number, code: string): void {
    if (code !== 'invalid_field' && code !== 'unknown_field') return assertError(res, status, code);
    assertError(res, 400, 'invalid_body');
    const errors = (res.body as { error: { errors: { code: string }[] } }).error.errors;
    assert.ok(errors.some((e) => e.code === code), JSON.stringify(errors));
  }

  test('malformed JSON -> 400 invalid_json', async () => {
    assertError(await request(app).post('/query').set('content-type', 'application/json').send('{"query": '), 400, 'invalid_json');
  });

  test('a JSON body that is not valid UTF-8 -> 400 invalid_json naming the byte offset, on every JSON route', async () => {
    // Latin-1's é (0xe9) where UTF-8 was claimed: body-parser alone would answer with U+FFFD in its place.
    const latin1 = (json: string) => {
      const at = json.indexOf('\u00e9');
      return { body: Buffer.concat([Buffer.from(json.slice(0, at)), Buffer.from([0xe9]), Buffer.from(json.slice(at + 1))]), at: Buffer.byteLength(json.slice(0, at)) };
    };
    const routes: [string, string, string][] = [
      ['post', '/query', JSON.stringify({ query: 'caf\u00e9 quotas', max_new_tokens: 2 })],
      ['post', '/query', JSON.stringify({ query: 'caf\u00e9 quotas', max_new_tokens: 2, stream: true })],
      ['post', '/v1/chat/completions', JSON.stringify({ model: 'x', messages: [{ role: 'user', content: 'caf\u00e9' }] })],
      ['post', '/v1/completions', JSON.stringify({ model: 'x', prompt: 'caf\u00e9' })],
      ['post', '/v1/embeddings', JSON.stringify({ model: 'x', input: 'caf\u00e9' })],
      ['post', '/v1/rerank', JSON.stringify({ query: 'caf\u00e9', documents: ['a'] })],
      ['post', '/documents', JSON.stringify({ doc_id: 'cafe', text: 'caf\u00e9' })],
      ['put', '/documents/cafe', JSON.stringify({ text: 'caf\u00e9' })],
    ];
    for (const [method, route, json] of routes) {
      const { body, at } = latin1(json);
      // The bytes as they are (superagent would otherwise serialise a Buffer as JSON).
      const res = await request(app)[method as 'post' | 'put'](route).set('content-type', 'application/json').serialize((b: unknown) => b as string).send(body);
      assertError(res, 400, 'invalid_json');
      const error = (res.body as { error: { message: string; byte_offset: number } }).error;
      assert.equal(error.byte_offset, at, route);
      assert.match(error.message, new RegExp(`offset ${at}\\b`), route);
    }
    // Valid UTF-8 of every length still parses: 2, 3 and 4 byte characters.
    const ok = await request(app).post('/query').set('content-type', 'application/json').serialize((b: unknown) => b as string)
      .send(Buffer.from(JSON.stringify({ query: 'caf\u00e9 \u20ac \u{1F600} quotas', max_new_tokens: 2 })));
    assert.equal(ok.status, 200, JSON.stringify(ok.body));
  });

  test('invalidUtf8Offset agrees with a strict decoder, and finds the first bad byte', () => {
    const cases: [number[], number][] = [
      [[0x61, 0x62], -1], [[0xc3, 0xa9], -1], [[0xe2, 0x82, 0xac], -1], [[0xf0, 0x9f, 0x98, 0x80], -1],
      [[0x61, 0xe9, 0x62], 1], [[0x61, 0xc3], 1], [[0xe2, 0x82], 0], [[0xc0, 0x80], 0], [[0xe0, 0x80, 0x80], 0],
      [[0xed, 0xa0, 0x80], 0], [[0xf4, 0x90, 0x80, 0x80], 0], [[0xf5, 0x80, 0x80, 0x80], 0], [[0x80], 0], [[0x61, 0xf0, 0x9f, 0x41], 1],
      [[0xe2, 0x82, 0xac, 0x80], 3],
    ];
    const strict = new TextDecoder('utf-8', { fatal: true });
    for (const [bytes, at] of cases) {
      const b = Uint8Array.from(bytes);
      assert.equal(invalidUtf8Offset(b), at, bytes.map((x) => x.toString(16)).join(' '));
      let valid = true;
      try {
        strict.decode(b);
      } catch {
        valid = false;
      }
      assert.equal(valid, at === -1, bytes.map((x) => x.toString(16)).join(' '));
    }
  });

  test('POST /documents validation', async () => {
    assertBodyError(await request(app).post('/documents').send({ text: '' }), 400, 'invalid_field');
    assertBodyError(await request(app).post('/documents').send({ doc_id: '../etc/passwd', text: 'x' }), 400, 'invalid_field');
    assertBodyError(await request(app).post('/documents').send({ documents: [] }), 400, 'invalid_field');
  });

  test('unknown route -> 404 not_found', async () => {
    assertError(await request(app).get('/nope'), 404, 'not_found');
  });

  test('a body over RAGGUARD_MAX_DOCUMENT_BYTES -> 413 payload_too_large', async () => {
    const small = new RagService({ ...cfg, maxDocumentBytes: 1024 }, models, service.store);
    const res = await request(createApp(small)).post('/documents').send({ text: 'x'.repeat(5000) });
    assertError(res, 413, 'payload_too_large');
  });

  test('a full queue sheds load with 503 and Retry-After', async () => {
    const busy = new RagService({ ...cfg, maxConcurrentQueries: 1, maxQueueLength: 0 }, models, service.store);
    const busyApp = createApp(busy);
    const body = { query: 'apt-cache search', max_new_tokens: 32 };
    const replies = await Promise.all([0, 1, 2].map(() => request(busyApp).post('/query').send(body)));
    const statuses = replies.map((r) => r.status).sort();
    assert.equal(statuses[0], 200);
    const shed = replies.filter((r) => r.status === 503);
    assert.ok(shed.length >= 1, `statuses ${statuses.join(',')}`);
    for (const r of shed) {
      assertError(r, 503, 'queue_full');
      assert.ok(Number(r.headers['retry-after']) >= 1);
    }
  });
});
