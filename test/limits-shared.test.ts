/**
 * Per-key limits held once across replicas: three server instances (each its own service, limits and
 * HTTP server on loopback, the shipped test models) on one real PostgreSQL (test/postgres.ts). A key
 * limited to N requests a minute gets N 200s in all, whichever replicas its requests reach, the rest 429
 * rate_limited with Retry-After and the error body; embeddings, rerank and score are charged their input
 * tokens and a key that has used its tokens is refused on another replica; a streamed generation whose
 * client goes away is charged the tokens it computed.
 */
import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { createApp } from '../src/server/app.js';
import { createLogger } from '../src/server/logging.js';
import { metricsFor } from '../src/server/metrics.js';
import { KeyLimits, limitsFor } from '../src/server/rate-limits.js';
import { PostgresUsageStore } from '../src/server/limit-store.js';
import { HttpError, toHttpError } from '../src/server/errors.js';
import { keyTenant } from '../src/server/tenant.js';
import { loadModels, RagService } from '../src/service/rag.js';
import { callJson, holdRuns, tempDir, testConfig } from './helpers.js';
import { startTestPostgres, type TestPostgres } from './postgres.js';

const LIMITED = 'limited-key-0000001';
const METER = 'meter-key-00000002';
const THRIFTY = 'thrifty-key-000003';
const STREAMER = 'streamer-key-00004';
const OPS = 'ops-admin-key-00005';
const N = 5;
const KEYS = [
  { name: 'limited', key: LIMITED, collections: ['default'], rate_per_minute: N },
  { name: 'meter', key: METER, collections: ['default'], tokens_per_minute: 1_000_000 },
  { name: 'thrifty', key: THRIFTY, collections: ['default'], tokens_per_minute: 10 },
  { name: 'streamer', key: STREAMER, collections: ['default'], tokens_per_minute: 1_000_000 },
  { name: 'ops', key: OPS, collections: '*', admin: true },
];

let pgServer: TestPostgres;
let db: pg.Client;
const replicas: { service: RagService; server: Server; base: string }[] = [];
let ids: { decoder: string; embedder: string; reranker: string };

async function call(base: string, key: string, method: string, route: string, body?: unknown) {
  return callJson(base, key, method, route, body);
}

/** The key's tokens in the current window, as the database holds them. */
async function tokensOf(name: string): Promise<number> {
  const { rows } = await db.query<{ tokens: string }>(
    "SELECT tokens FROM ragguard_key_usage WHERE key_name = $1 AND window_start = date_trunc('minute', clock_timestamp())", [name]);
  return Number(rows[0]?.tokens ?? 0);
}

/** Waits for a window with at least `s` seconds left, so that a burst does not straddle two windows. */
async function windowWithRoom(s: number): Promise<void> {
  const left = 60_000 - (Date.now() % 60_000);
  if (left < s * 1000) await new Promise((r) => setTimeout(r, left + 200));
}

before(async () => {
  pgServer = await startTestPostgres();
  const url = await pgServer.database();
  const dir = await tempDir();
  const keysFile = path.join(dir, 'keys.json');
  await writeFile(keysFile, JSON.stringify(KEYS));
  const cfg = testConfig({ RAGGUARD_STORE: url, RAGGUARD_CORPUS_DIR: '', RAGGUARD_PROFILE_RUN: 'false', RAGGUARD_KEYS_FILE: keysFile, RAGGUARD_INDEX_DIR: path.join(dir, 'index') });
  const models = await loadModels(cfg);
  // One after the other: the first creates the schema (migration 4 included), the others find it current.
  for (let i = 0; i < 3; i++) {
    const service = await RagService.start(cfg, models);
    const server = createApp(service, { logger: createLogger('silent') }).listen(0, '127.0.0.1');
    await new Promise((r) => server.once('listening', r));
    replicas.push({ service, server, base: `http://127.0.0.1:${(server.address() as AddressInfo).port}` });
  }
  db = new pg.Client({ connectionString: url });
  await db.connect();
  const m = await call(replicas[0]!.base, OPS, 'GET', '/v1/models');
  assert.equal(m.status, 200, m.text);
  const [decoder, embedder, reranker] = (m.body['data'] as { id: string }[]).map((d) => d.id);
  ids = { decoder: decoder!, embedder: embedder!, reranker: reranker! };
});

after(async () => {
  await db?.end();
  for (const r of replicas) {
    r.server.closeAllConnections();
    await new Promise((res) => r.server.close(res));
    await r.service.close();
    await limitsFor(r.service).store.close();
  }
  await pgServer?.stop();
});

describe('limits shared by three replicas through PostgreSQL', () => {
  test(`a key limited to ${N} requests a minute gets ${N} 200s in all, the rest 429 rate_limited with Retry-After`, async () => {
    for (const r of replicas) assert.equal(limitsFor(r.service).store.kind, 'postgres');
    await windowWithRoom(20);
    // Four requests to each replica at once: twelve in all.
    const replies = await Promise.all(replicas.flatMap((r) => Array.from({ length: 4 }, () => call(r.base, LIMITED, 'GET', '/v1/models'))));
    const ok = replies.filter((r) => r.status === 200);
    const refused = replies.filter((r) => r.status === 429);
    assert.equal(ok.length, N, replies.map((r) => r.status).join(' '));
    assert.equal(refused.length, 12 - N);
    for (const r of refused) {
      assert.equal(r.body['error']['code'], 'rate_limited');
      assert.match(r.body['error']['message'], /limited.*5 requests per minute/);
      const wait = Number(r.headers.get('retry-after'));
      assert.ok(Number.isInteger(wait) && wait >= 1 && wait <= 60, `Retry-After ${wait}`);
      assert.equal(r.body['error']['retry_after_seconds'], wait);
    }
    // Still refused on every replica; other keys are not held back.
    for (const r of replicas) assert.equal((await call(r.base, LIMITED, 'GET', '/v1/models')).status, 429);
    assert.equal((await call(replicas[1]!.base, METER, 'GET', '/v1/models')).status, 200);
    const { rows } = await db.query<{ requests: string }>("SELECT requests FROM ragguard_key_usage WHERE key_name = 'limited'");
    assert.equal(Number(rows[0]!.requests), N, 'a refused request takes nothing');
  });

  test('embeddings, rerank and score are charged their input tokens, wherever they run', async () => {
    await windowWithRoom(20);
    const before = await tokensOf('meter');
    const e = await call(replicas[0]!.base, METER, 'POST', '/v1/embeddings', { model: ids.embedder, input: ['disk quotas on ext4', 'the sticky bit'] });
    assert.equal(e.status, 200, e.text);
    const r = await call(replicas[1]!.base, METER, 'POST', '/v1/rerank', { model: ids.reranker, query: 'disk', documents: ['quota', 'printer setup'] });
    assert.equal(r.status, 200, r.text);
    const s = await call(replicas[2]!.base, METER, 'POST', '/v1/score', { model: ids.reranker, text_1: 'disk', text_2: ['quota', 'cron'] });
    assert.equal(s.status, 200, s.text);
    const used = e.body['usage']['total_tokens'] + r.body['usage']['total_tokens'] + s.body['usage']['total_tokens'];
    assert.ok(e.body['usage']['total_tokens'] > 0 && r.body['usage']['total_tokens'] > 0 && s.body['usage']['total_tokens'] > 0);
    for (const x of replicas) await limitsFor(x.service).settled('meter');
    assert.equal(await tokensOf('meter') - before, used);
  });

  test('a key that used its tokens on one replica is refused 429 token_limit on the others, embeddings included', async () => {
    await windowWithRoom(20);
    const first = await call(replicas[0]!.base, THRIFTY, 'POST', '/v1/embeddings', { model: ids.embedder, input: 'a text long enough to use more than ten tokens of the allowance' });
    assert.equal(first.status, 200, first.text);
    assert.ok(first.body['usage']['total_tokens'] >= 10);
    await limitsFor(replicas[0]!.service).settled('thrifty');
    for (const [i, route, body] of [[1, '/v1/embeddings', { model: ids.embedder, input: 'disk' }], [2, '/v1/score', { model: ids.reranker, text_1: 'a', text_2: 'b' }],
      [1, '/v1/completions', { model: ids.decoder, prompt: 'disk', max_tokens: 1 }]] as const) {
      const r = await call(replicas[i]!.base, THRIFTY, 'POST', route, body);
      assert.equal(r.status, 429, `${route}: ${r.text}`);
      assert.equal(r.body['error']['code'], 'token_limit');
      assert.ok(Number(r.headers.get('retry-after')) >= 1);
    }
  });

  test('a streamed generation whose client goes away is charged what it computed', async () => {
    await windowWithRoom(30);
    const replica = replicas[2]!;
    const prompt = 'Context:\n[1] apt: a package tool\n\nQuestion: What is apt?\nAnswer:';
    // The prompt's tokens, from an unlimited key's reply (the operator's usage is not the streamer's).
    const probe = await call(replica.base, OPS, 'POST', '/v1/completions', { model: ids.decoder, prompt, max_tokens: 1 });
    assert.equal(probe.status, 200, probe.text);
    const promptTokens = probe.body['usage']['prompt_tokens'] as number;
    const ended: { failed: boolean; salt: string | undefined }[] = [];
    const metrics = metricsFor(replica.service);
    const told = metrics.onSequenceEnded!;
    metrics.onSequenceEnded = (seq, failed) => {
      ended.push({ failed, salt: seq.cacheSalt });
      told(seq, failed);
    };
    try {
      const before = await tokensOf('streamer');
      // At the stream's first token the engine is held between steps (the run gate), the client leaves,
      // and the sequence ends at the engine's next barrier, unfinished.
      const engine = replica.service.engine;
      const observer = engine.observer!;
      let held: Promise<() => void> | undefined;
      engine.observer = {
        ...observer,
        token: (seq, now) => {
          if (seq.cacheSalt === 'key:streamer') held ??= holdRuns();
          observer.token(seq, now);
        },
      };
      const aborter = new AbortController();
      const reply = fetch(`${replica.base}/v1/completions`, {
        method: 'POST', signal: aborter.signal,
        headers: { authorization: `Bearer ${STREAMER}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: ids.decoder, prompt, max_tokens: 200, temperature: 0, stream: true }),
      }).then((r) => r.text());
      let release: () => void;
      try {
        for (let i = 0; i < 600 && held === undefined; i++) await new Promise((r) => setTimeout(r, 50));
        assert.ok(held, 'a token was generated');
        release = await held;
      } finally {
        engine.observer = observer;
      }
      aborter.abort();
      await assert.rejects(reply, 'the client left before the end');
      await new Promise((r) => setTimeout(r, 300));
      release();
      let charged = 0;
      for (let i = 0; i < 100 && charged === before; i++) {
        await new Promise((r) => setTimeout(r, 100));
        await limitsFor(replica.service).settled('streamer');
        charged = await tokensOf('streamer');
      }
      const spent = charged - before;
      assert.deepEqual(ended.filter((x) => x.salt === 'key:streamer').map((x) => x.failed), [true], 'the sequence ended unfinished');
      assert.ok(spent >= promptTokens + 1 && spent < promptTokens + 200, `charged ${spent} for a prompt of ${promptTokens} tokens`);
    } finally {
      metrics.onSequenceEnded = told;
    }
  });

  test('a database that does not answer: a limited key gets 503 store_unavailable with Retry-After, not a 500', async () => {
    const store = new PostgresUsageStore('postgres://ragguard@127.0.0.1:1/none', { connectTimeoutMs: 1000 });
    try {
      const limits = new KeyLimits(store, {}, () => undefined);
      const t = keyTenant({ name: 'k', sha256: '', collections: '*', ratePerMinute: 5, tokensPerMinute: undefined, admin: false }, false);
      const e = await limits.admitRequest(t).then(() => assert.fail('counted without a database'), (err: unknown) => toHttpError(err));
      assert.ok(e instanceof HttpError);
      assert.equal(e.status, 503);
      assert.equal(e.code, 'store_unavailable');
      assert.ok(Number(e.headers['Retry-After']) >= 1);
      // A key without limits is never counted: no database needed.
      const free = keyTenant({ name: 'f', sha256: '', collections: '*', ratePerMinute: undefined, tokensPerMinute: undefined, admin: false }, false);
      assert.equal(await limits.admitRequest(free), undefined);
    } finally {
      await store.close();
    }
  });
});
