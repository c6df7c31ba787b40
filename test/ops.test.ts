/**
 * Operating the server: /metrics (vLLM's names after `ragguard:`, values that move with a query), request
 * ids and the one JSON log line per request, bearer auth per route class, CORS. The real app on the
 * shipped models over loopback (supertest).
 */
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { before, describe, test } from 'node:test';
import request from 'supertest';
import type { Express } from 'express';
import { loadModels, RagService, type Models } from '../src/service/rag.js';
import { createApp } from '../src/server/app.js';
import { createLogger } from '../src/server/logging.js';
import { smallCorpus, tempDir, testConfig, faiss } from './helpers.js';

const DOCS = ['task-scheduling-cron-atd', 'apt-cache', 'quotas'];
const API = 'api-key-0123456789';
const ADMIN = 'admin-key-0123456789';
let models: Models;
let service: RagService;
let app: Express;
const lines: Record<string, unknown>[] = [];

/** A pino destination that keeps each JSON line. */
const sink = new Writable({
  write(chunk: Buffer, _enc, cb) {
    for (const l of chunk.toString('utf8').split('\n')) if (l.trim()) lines.push(JSON.parse(l) as Record<string, unknown>);
    cb();
  },
});

async function serviceWith(env: Record<string, string>): Promise<RagService> {
  const cfg = testConfig({ RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, DOCS), RAGGUARD_PROFILE_RUN: 'false', ...env });
  return RagService.start(cfg, models);
}

/** One sample's value from Prometheus text: `name{labels} value`, labels matched as a substring. */
function sample(text: string, name: string, labels = '', absent?: number): number {
  const line = text.split('\n').find((l) => l.startsWith(name) && (l[name.length] === ' ' || l[name.length] === '{') && l.includes(labels));
  if (!line && absent !== undefined) return absent;
  assert.ok(line, `no sample ${name}{${labels}}`);
  return Number(line.slice(line.lastIndexOf(' ') + 1));
}

before(async () => {
  const cfg = testConfig({ RAGGUARD_PROFILE_RUN: 'false' });
  models = await loadModels(cfg);
  service = await serviceWith({});
  app = createApp(service, { logger: createLogger('info', sink) });
});

describe('/metrics', () => {
  const VLLM = ['num_requests_running', 'num_requests_waiting', 'kv_cache_usage_perc', 'num_preemptions_total', 'prompt_tokens_total',
    'generation_tokens_total', 'time_to_first_token_seconds', 'inter_token_latency_seconds', 'time_per_output_token_seconds', 'e2e_request_latency_seconds', 'request_success_total'];

  test("vLLM's metric names after ragguard: (model_name label), and the guard's own", async () => {
    const res = await request(app).get('/metrics').expect(200);
    assert.match(res.headers['content-type'] ?? '', /text\/plain/);
    for (const n of VLLM) assert.match(res.text, new RegExp(`^# TYPE ragguard:${n} (gauge|counter|histogram)$`, 'm'), n);
    assert.match(res.text, /^ragguard:num_requests_running\{model_name="decoder-gqa"\} 0$/m);
    for (const n of ['guard_admissions_total', 'guard_reshapes_total', 'guard_predicted_bytes', 'guard_reserved_bytes', 'memory_budget_bytes', 'memory_component_bytes', 'kv_cache_blocks']) {
      assert.match(res.text, new RegExp(`^# TYPE ragguard:${n} `, 'm'), n);
    }
    assert.equal(sample(res.text, 'ragguard:memory_budget_bytes'), service.budget.budgetBytes);
    assert.equal(sample(res.text, 'ragguard:memory_component_bytes', 'component="kv_pool"'), service.engine.pool.bytes);
    assert.equal(sample(res.text, 'ragguard:kv_cache_blocks', 'state="total"'), service.blocks.stats().totalBlocks);
    // ONNX Runtime's live bytes in malloc's blocks: part of them, and part of malloc's in-use figure.
    const inMalloc = sample(res.text, 'ragguard:onnxruntime_host_bytes', 'kind="live_in_malloc"');
    assert.ok(inMalloc > 0 && inMalloc <= sample(res.text, 'ragguard:onnxruntime_host_bytes', 'kind="live"'), `${inMalloc}`);
    assert.ok(inMalloc <= sample(res.text, 'ragguard:native_memory_bytes', 'kind="malloc_in_use"'));
  });

  test('values move after a query: tokens, TTFT, ITL, e2e, success, admissions, predicted bytes', async () => {
    const before = (await request(app).get('/metrics').expect(200)).text;
    const q = await request(app).post('/query').send({ query: 'How do I stop a user from using cron?', max_new_tokens: 8 }).expect(200);
    const after = (await request(app).get('/metrics').expect(200)).text;
    // A labelled series appears with its first count: absent before is 0.
    const delta = (name: string, labels = '') => sample(after, name, labels) - sample(before, name, labels, 0);
    const { prompt_tokens: p, completion_tokens: c } = q.body.usage as { prompt_tokens: number; completion_tokens: number };
    assert.equal(delta('ragguard:prompt_tokens_total'), p);
    // Every prompt token is looked up in the prefix cache; a hit is a token whose KV block was reused.
    assert.equal(delta('ragguard:prefix_cache_queries'), p);
    assert.ok(delta('ragguard:prefix_cache_hits') <= p);
    assert.equal(delta('ragguard:generation_tokens_total'), c);
    assert.equal(delta('ragguard:time_to_first_token_seconds_count'), 1);
    // One interval per sampled token after the first (the end-of-sequence token, when sampled, is one).
    const itl = delta('ragguard:inter_token_latency_seconds_count');
    assert.ok(itl === c - 1 || itl === c, `${itl} inter-token latencies for ${c} tokens`);
    assert.equal(delta('ragguard:time_per_output_token_seconds_count'), itl);
    assert.equal(delta('ragguard:e2e_request_latency_seconds_count'), 1);
    assert.ok(delta('ragguard:e2e_request_latency_seconds_sum') > 0);
    assert.equal(delta('ragguard:request_success_total', `finished_reason="${q.body.finish_reason as string}"`), 1);
    assert.equal(delta('ragguard:guard_admissions_total', `decision="${q.body.guard.decision as string}"`), 1);
    assert.equal(delta('ragguard:guard_predicted_bytes_sum'), q.body.guard.predicted_bytes);
    assert.equal(delta('ragguard:http_requests_total', 'route="/query",status="200"'), 1);
    assert.equal(sample(after, 'ragguard:num_requests_running'), 0);
    assert.equal(sample(after, 'ragguard:admission_queue_requests', 'state="waiting"'), 0);
  });

  test('prefix-cache counters: the same query again reuses its prompt\'s full KV blocks, counted as hits', async () => {
    const ask = () => request(app).post('/query').send({ query: 'How do I list the packages installed on Debian?', max_new_tokens: 2 }).expect(200);
    await ask();
    const before = (await request(app).get('/metrics').expect(200)).text;
    const q = await ask();
    const after = (await request(app).get('/metrics').expect(200)).text;
    const delta = (name: string) => sample(after, name, '') - sample(before, name, '', 0);
    const p = (q.body.usage as { prompt_tokens: number }).prompt_tokens;
    assert.equal(delta('ragguard:prefix_cache_queries'), p);
    const hits = delta('ragguard:prefix_cache_hits');
    const block = service.cfg.kvBlockSize;
    // Every full block of the repeated prompt but a last one that holds its final token is reused.
    assert.ok(hits >= Math.floor((p - 1) / block) * block - block && hits > 0 && hits <= p, `${hits} hits of ${p} prompt tokens (blocks of ${block})`);
  });
});

describe('request ids and logs', () => {
  test("a request's id is the client's X-Request-Id, returned and on its one log line", async () => {
    const res = await request(app).get('/healthz').set('X-Request-Id', 'client-id-42').expect(200);
    assert.equal(res.headers['x-request-id'], 'client-id-42');
    const mine = lines.filter((l) => l['req_id'] === 'client-id-42');
    assert.equal(mine.length, 1);
    assert.equal(mine[0]!['status'], 200);
    assert.equal(mine[0]!['method'], 'GET');
    assert.equal(mine[0]!['route'], '/healthz');
    assert.equal(typeof mine[0]!['latency_ms'], 'number');
  });

  test('without one (or with a malformed one) a UUID is made', async () => {
    const a = await request(app).get('/healthz').expect(200);
    const b = await request(app).get('/healthz').set('X-Request-Id', 'bad id with spaces').expect(200);
    for (const r of [a, b]) assert.match(r.headers['x-request-id'] ?? '', /^[0-9a-f-]{36}$/);
    assert.notEqual(a.headers['x-request-id'], b.headers['x-request-id']);
  });

  test('client errors are one line with code and message and no stack', async () => {
    const bad = await request(app).post('/query').set('Content-Type', 'application/json').send('{"query": ').expect(400);
    const id = bad.headers['x-request-id'];
    const mine = lines.filter((l) => l['req_id'] === id);
    assert.equal(mine.length, 1);
    assert.deepEqual(mine[0]!['error'], { code: 'invalid_json', message: 'request body is not valid JSON' });
    assert.equal(mine[0]!['err'], undefined);
    assert.equal(mine[0]!['level'], 30);
    assert.ok(!JSON.stringify(mine[0]).includes('    at '), 'no stack');
  });

  test('a server error is one line at level error, with the stack', async () => {
    // A store whose search throws: the route fails inside, as a bug would.
    const broken = await serviceWith({});
    faiss(broken).search = () => { throw new Error('search exploded'); };
    const app2 = createApp(broken, { logger: createLogger('info', sink) });
    const res = await request(app2).post('/query').send({ query: 'anything at all', max_new_tokens: 2 }).expect(500);
    assert.deepEqual(res.body, { error: { code: 'internal', message: 'internal error' } });
    const mine = lines.filter((l) => l['req_id'] === res.headers['x-request-id']);
    assert.equal(mine.length, 1);
    assert.equal(mine[0]!['level'], 50);
    const err = mine[0]!['err'] as { message: string; stack: string };
    assert.equal(err.message, 'search exploded');
    assert.match(err.stack, /at /);
  });
});

describe('auth', () => {
  let keyed: Express;
  before(async () => {
    keyed = createApp(await serviceWith({ RAGGUARD_API_KEY: API, RAGGUARD_ADMIN_KEY: ADMIN }), { logger: createLogger('silent') });
  });

  const errorIs = (res: request.Response, status: number, code: string) => {
    assert.equal(res.status, status, JSON.stringify(res.body));
    assert.equal(res.body.error.code, code);
    assert.ok(res.body.error.message.length > 0);
  };

  test('health and readiness need no key', async () => {
    await request(keyed).get('/healthz').expect(200);
  });

  test('api routes: 401 without a key or with a wrong one; the API key or the admin key pass', async () => {
    for (const [method, path] of [['get', '/metrics'], ['get', '/documents'], ['post', '/query']] as const) {
      const none = await request(keyed)[method](path).send({});
      errorIs(none, 401, 'unauthorized');
      assert.match(none.headers['www-authenticate'] ?? '', /^Bearer/);
      errorIs(await request(keyed)[method](path).set('Authorization', 'Bearer nope-nope-nope').send({}), 401, 'invalid_api_key');
      errorIs(await request(keyed)[method](path).set('Authorization', `Basic ${API}`).send({}), 401, 'invalid_api_key');
    }
    // /metrics is the operator's: the API key is 403 there, the admin key passes.
    errorIs(await request(keyed).get('/metrics').set('Authorization', `Bearer ${API}`), 403, 'forbidden');
    await request(keyed).get('/metrics').set('Authorization', `Bearer ${ADMIN}`).expect(200);
    await request(keyed).get('/documents').set('Authorization', `Bearer ${ADMIN}`).expect(200);
    // Authorized, then validated as usual.
    errorIs(await request(keyed).post('/query').set('Authorization', `Bearer ${API}`).send({}), 400, 'invalid_body');
  });

  test('admin routes (document writes, /debug/*): the API key is 403, the admin key passes', async () => {
    const writes = [
      () => request(keyed).post('/documents').send({ doc_id: 'auth-doc', text: 'Some text about keys.' }),
      () => request(keyed).put('/documents/auth-doc').send({ text: 'Some other text about keys.' }),
      () => request(keyed).delete('/documents/auth-doc'),
      () => request(keyed).get('/debug/memory'),
    ];
    for (const w of writes) {
      errorIs(await w(), 401, 'unauthorized');
      errorIs(await w().set('Authorization', `Bearer ${API}`), 403, 'forbidden');
    }
    await request(keyed).post('/documents').set('Authorization', `Bearer ${ADMIN}`).send({ doc_id: 'auth-doc', text: 'Some text about keys.' }).expect(201);
    await request(keyed).put('/documents/auth-doc').set('Authorization', `Bearer ${ADMIN}`).send({ text: 'Other text about keys.' }).expect(200);
    await request(keyed).delete('/documents/auth-doc').set('Authorization', `Bearer ${ADMIN}`).expect(200);
    await request(keyed).get('/debug/memory').set('Authorization', `Bearer ${ADMIN}`).expect(200);
  });

  test('with only an API key, admin routes take it', async () => {
    const only = createApp(await serviceWith({ RAGGUARD_API_KEY: API }), { logger: createLogger('silent') });
    errorIs(await request(only).get('/debug/memory'), 401, 'unauthorized');
    await request(only).get('/debug/memory').set('Authorization', `Bearer ${API}`).expect(200);
  });

  test('without keys everything is open (the default)', async () => {
    await request(app).get('/debug/memory').expect(200);
    await request(app).get('/metrics').expect(200);
  });

  test('config: short keys, whitespace, and an admin key equal to the API key are refused', () => {
    assert.throws(() => testConfig({ RAGGUARD_API_KEY: 'short' }), /RAGGUARD_API_KEY/);
    assert.throws(() => testConfig({ RAGGUARD_ADMIN_KEY: 'has a space in it' }), /RAGGUARD_ADMIN_KEY/);
    assert.throws(() => testConfig({ RAGGUARD_API_KEY: API, RAGGUARD_ADMIN_KEY: API }), /must differ/);
    assert.throws(() => testConfig({ RAGGUARD_CORS_ORIGINS: 'example.com' }), /RAGGUARD_CORS_ORIGINS/);
  });
});

describe('CORS', () => {
  test('off by default: no CORS headers, even for a preflight', async () => {
    const res = await request(app).options('/query').set('Origin', 'https://app.example.com').set('Access-Control-Request-Method', 'POST');
    assert.equal(res.headers['access-control-allow-origin'], undefined);
    const get = await request(app).get('/healthz').set('Origin', 'https://app.example.com').expect(200);
    assert.equal(get.headers['access-control-allow-origin'], undefined);
  });

  test('configured origins: allowed ones get the headers and a keyless preflight; others none', async () => {
    const c = createApp(await serviceWith({ RAGGUARD_API_KEY: API, RAGGUARD_CORS_ORIGINS: 'https://app.example.com, http://localhost:3000' }), { logger: createLogger('silent') });
    const pre = await request(c).options('/query').set('Origin', 'https://app.example.com').set('Access-Control-Request-Method', 'POST')
      .set('Access-Control-Request-Headers', 'authorization,content-type').expect(204);
    assert.equal(pre.headers['access-control-allow-origin'], 'https://app.example.com');
    assert.match(pre.headers['access-control-allow-headers'] ?? '', /Authorization/);
    assert.match(pre.headers['access-control-allow-methods'] ?? '', /POST/);
    const get = await request(c).get('/metrics').set('Origin', 'http://localhost:3000').set('Authorization', `Bearer ${API}`).expect(200);
    assert.equal(get.headers['access-control-allow-origin'], 'http://localhost:3000');
    assert.match(get.headers['access-control-expose-headers'] ?? '', /X-Request-Id/);
    const other = await request(c).get('/healthz').set('Origin', 'https://evil.example.com').expect(200);
    assert.equal(other.headers['access-control-allow-origin'], undefined);
    const otherPre = await request(c).options('/query').set('Origin', 'https://evil.example.com').set('Access-Control-Request-Method', 'POST');
    assert.equal(otherPre.headers['access-control-allow-origin'], undefined);
  });
});
