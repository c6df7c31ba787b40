/**
 * The database failing and returning, on a real PostgreSQL stopped the way a crash stops it (pg_ctl stop
 * -m immediate) and started again on the same data: while it is down the store says so
 * (StoreUnavailableError, ready() false with the reason) and the service answers the requests that need
 * it with 503 store_unavailable and Retry-After, never 500 internal; GET /healthz still answers (the
 * process is alive); once the database is back the same instances serve again without a restart, and
 * nothing acknowledged before the outage is lost.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp } from 'node:fs/promises';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { promisify } from 'node:util';
import pg from 'pg';
import { normalize } from '../src/retrieval/embedder.js';
import { PostgresStore } from '../src/retrieval/postgres-store.js';
import { StoreUnavailableError } from '../src/retrieval/retrieval-store.js';
import { createApp } from '../src/server/app.js';
import { createLogger } from '../src/server/logging.js';
import { loadModels, RagService } from '../src/service/rag.js';
import { ROOT, smallCorpus, tempDir, testConfig } from './helpers.js';

const run = promisify(execFile);
const D = 8;

/** A PostgreSQL of our own (scripts/postgres.sh), so that it can be stopped and started on the same data. */
let dir: string;
let url: string;

/** As a crash stops it (immediate shutdown), its data kept; then started again on the same port. */
async function stopDatabase(): Promise<void> {
  await run('bash', [path.join(ROOT, 'scripts', 'postgres.sh'), 'crash', dir], { cwd: ROOT });
}

async function startDatabase(): Promise<void> {
  await run('bash', [path.join(ROOT, 'scripts', 'postgres.sh'), 'restart', dir], { cwd: ROOT });
}

before(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'ragguard-pg-outage-'));
  url = (await run('bash', [path.join(ROOT, 'scripts', 'postgres.sh'), 'start', dir], { cwd: ROOT })).stdout.trim();
});
/** A new database on the server (each test its own: the store's vectors are 8-dimensional, the service's 128). */
async function database(name: string): Promise<string> {
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name}`);
  await admin.end();
  const u = new URL(url);
  u.pathname = `/${name}`;
  return u.toString();
}

after(async () => {
  if (dir) await run('bash', [path.join(ROOT, 'scripts', 'postgres.sh'), 'stop', dir], { cwd: ROOT }).catch(() => undefined);
});

const unit = (seed: number) => {
  const v = Float32Array.from({ length: D }, (_, i) => Math.sin(seed * 7 + i * 3));
  normalize(v);
  return v;
};

test('the store while the database is down: StoreUnavailableError and ready() with the reason; then back, nothing lost', async () => {
  const store = await PostgresStore.open(await database('outage_store'), D, { bm25: { k1: 1.2, b: 0.75 }, connectTimeoutMs: 2000, log: () => undefined });
  try {
    await store.addBatch([{ doc: { docId: 'before', title: 'Before', bytes: 10, collection: 'outage' }, chunks: [{ text: 'written before the outage', tokens: 4 }], vectors: unit(1) }]);
    assert.deepEqual(await store.ready(), { ok: true });
    await stopDatabase();
    const down = [
      store.searchDense(unit(1), 3, { collection: 'outage' }),
      store.searchLexical('outage', 3, { collection: 'outage' }),
      store.get('outage', 'before'),
      store.counts('outage'),
      store.addBatch([{ doc: { docId: 'during', title: 'During', bytes: 1, collection: 'outage' }, chunks: [{ text: 'x', tokens: 1 }], vectors: unit(2) }]),
    ];
    for (const [i, p] of down.entries()) {
      await assert.rejects(p, (e) => e instanceof StoreUnavailableError && /unavailable/.test(e.message), `call ${i}`);
    }
    const r = await store.ready();
    assert.equal(r.ok, false);
    assert.match((r as { reason: string }).reason, /PostgreSQL at 127\.0\.0\.1:\d+\/outage_store is unavailable/);
    await startDatabase();
    assert.deepEqual(await store.ready(), { ok: true });
    assert.equal((await store.searchDense(unit(1), 1, { collection: 'outage' }))[0]?.chunk.docId, 'before');
    assert.deepEqual((await store.searchLexical('outage', 3, { collection: 'outage' })).map((h) => h.chunk.docId), ['before']);
    assert.equal(await store.get('outage', 'during'), undefined, 'the write refused during the outage left nothing');
  } finally {
    await store.close();
  }
});

/** The server's processes (the postmaster and its children) stopped or continued: a database that does not answer at all. */
async function signalDatabase(signal: 'SIGSTOP' | 'SIGCONT'): Promise<void> {
  const { readFile } = await import('node:fs/promises');
  const postmaster = Number((await readFile(path.join(dir, 'data', 'postmaster.pid'), 'utf8')).split('\n')[0]);
  const { stdout } = await run('ps', ['-o', 'pid=', '--ppid', String(postmaster)]);
  const pids = [postmaster, ...stdout.split('\n').map((x) => Number(x.trim())).filter((x) => x > 0)];
  for (const pid of signal === 'SIGSTOP' ? pids : [...pids].reverse()) process.kill(pid, signal);
}

test('a database that does not answer at all: the counts a probe reads give up after their wait, a search after its timeout; then it serves again', async () => {
  const store = await PostgresStore.open(await database('outage_silent'), D, {
    bm25: { k1: 1.2, b: 0.75 }, connectTimeoutMs: 1000, statementTimeoutMs: 500, poolSize: 2, log: () => undefined,
  });
  try {
    await store.addBatch([{ doc: { docId: 'kept', title: 'Kept', bytes: 1 }, chunks: [{ text: 'kept text', tokens: 2 }], vectors: unit(3) }]);
    await signalDatabase('SIGSTOP');
    try {
      // No answer, no error from the server: each call ends on this side's limits, never hangs (the write
      // above left no cached counts).
      await assert.rejects(store.counts(), (e) => e instanceof StoreUnavailableError && /did not answer within/.test(e.message));
      await assert.rejects(store.searchDense(unit(3), 1, { collection: 'default' }), StoreUnavailableError);
      const r = await store.ready();
      assert.equal(r.ok, false);
    } finally {
      await signalDatabase('SIGCONT');
    }
    assert.deepEqual(await store.ready(), { ok: true });
    assert.equal((await store.searchDense(unit(3), 1, { collection: 'default' }))[0]?.chunk.docId, 'kept');
    assert.deepEqual(await store.counts(), { documents: 1, chunks: 1 });
  } finally {
    await store.close();
  }
});

test('the service while the database is down: 503 store_unavailable with Retry-After, /healthz alive, /readyz 503 with the reason; serving and ready again once it returns', async () => {
  const cfg = testConfig({
    RAGGUARD_STORE: await database('outage_service'), RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, ['quotas']),
    RAGGUARD_PROFILE_RUN: 'false', RAGGUARD_PG_CONNECT_TIMEOUT_MS: '2000',
  });
  const service = await RagService.start(cfg, await loadModels(cfg));
  const server: Server = createApp(service, { logger: createLogger('silent') }).listen(0, '127.0.0.1');
  await new Promise<void>((r) => server.once('listening', () => r()));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const call = async (method: string, p: string, body?: unknown) => {
    const res = await fetch(base + p, { method, headers: body === undefined ? {} : { 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body) });
    return { status: res.status, retryAfter: res.headers.get('retry-after'), body: await res.json() as any };
  };
  try {
    const ok = await call('POST', '/query', { query: 'How are disk quotas enforced?', max_new_tokens: 2 });
    assert.equal(ok.status, 200);
    assert.equal((await call('GET', '/readyz')).status, 200);
    assert.equal((await call('POST', '/documents', { doc_id: 'acked', text: 'An acknowledged document about zorblax.' })).status, 201);
    await stopDatabase();
    try {
      for (const [method, p, body] of [
        ['POST', '/query', { query: 'How are disk quotas enforced?', max_new_tokens: 2 }],
        ['POST', '/documents', { doc_id: 'refused', text: 'Written while the database is down.' }],
        ['GET', '/documents/acked', undefined],
      ] as const) {
        const r = await call(method, p, body);
        assert.equal(r.status, 503, `${method} ${p}: ${JSON.stringify(r.body)}`);
        assert.equal(r.body.error.code, 'store_unavailable', `${method} ${p}`);
        assert.ok(Number(r.retryAfter) > 0, `${method} ${p}: Retry-After ${r.retryAfter}`);
      }
      const health = await call('GET', '/healthz');
      assert.equal(health.status, 200, 'the process is alive');
      // Readiness takes the replica out of rotation, saying why.
      const ready = await call('GET', '/readyz');
      assert.equal(ready.status, 503, JSON.stringify(ready.body));
      assert.equal(ready.body.error.code, 'store_unavailable');
      assert.match(ready.body.error.message, /^not ready: /);
      assert.ok(Number(ready.retryAfter) > 0);
    } finally {
      await startDatabase();
    }
    const again = await call('POST', '/query', { query: 'How are disk quotas enforced?', max_new_tokens: 2 });
    assert.equal(again.status, 200, JSON.stringify(again.body));
    assert.equal((await call('GET', '/readyz')).status, 200, 'ready again');
    assert.equal((await call('GET', '/documents/acked')).status, 200, 'acknowledged before the outage: still there');
    assert.equal((await call('GET', '/documents/refused')).status, 404, 'refused during the outage: not there');
  } finally {
    await new Promise((r) => server.close(r));
    await service.store.close();
  }
});
