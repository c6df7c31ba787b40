/**
 * The operator's routes and tenants, over real HTTP on loopback (the shipped test models, a real faiss
 * index): /metrics and /debug/* are for admin keys only (401 without a key, 403 for a key without admin,
 * each with the error body); an admin key scoped to collections reads its own keys' series on /metrics
 * and its collections' figures on /debug/memory, not the store's; /healthz gives document and chunk counts
 * only to an admin key; RAGGUARD_KEYS_FILE is read again on SIGHUP and when the file changes (a key
 * added works, a key removed is 401, a bad file keeps the keys in force).
 */
import assert from 'node:assert/strict';
import { rename, writeFile } from 'node:fs/promises';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { createApp } from '../src/server/app.js';
import { readKeysFile } from '../src/config/keys-file.js';
import { reloadKeysOnChange } from '../src/server/key-reload.js';
import { createLogger } from '../src/server/logging.js';
import { loadModels, RagService } from '../src/service/rag.js';
import { callJson, tempDir, testConfig } from './helpers.js';

const ADMIN = 'operator-admin-key-01';
const OPS = 'ops-every-collection-02';
const ALPHA_ADMIN = 'alpha-admin-key-00003';
const ALPHA_READER = 'alpha-reader-key-0004';
const BETA = 'beta-reader-key-00005';
const GAMMA = 'gamma-new-key-0000006';
const KEYS = [
  { name: 'ops', key: OPS, collections: '*', admin: true },
  { name: 'alpha-admin', key: ALPHA_ADMIN, collections: ['alpha'], admin: true },
  { name: 'alpha-reader', key: ALPHA_READER, collections: ['alpha'], rate_per_minute: 1000 },
  { name: 'beta', key: BETA, collections: ['beta'], tokens_per_minute: 100000 },
];

let base: string;
let server: Server;
let service: RagService;
let keysFile: string;

async function call(key: string | undefined, method: string, route: string, body?: unknown) {
  return callJson(base, key, method, route, body);
}

function refused(r: { status: number; body: Record<string, any> }, status: number, code: string): void {
  assert.equal(r.status, status, JSON.stringify(r.body));
  assert.equal(r.body['error']['code'], code);
  assert.ok(String(r.body['error']['message']).length > 0);
}

const doc = (collection: string, i: number) => ({ doc_id: `${collection}-${i}`, title: `${collection} ${i}`, text: `${collection} note ${i}: disk quotas and cron jobs.`, collection });

before(async () => {
  const dir = await tempDir();
  keysFile = path.join(dir, 'keys.json');
  await writeFile(keysFile, JSON.stringify(KEYS));
  const cfg = testConfig({
    RAGGUARD_INDEX_DIR: path.join(dir, 'index'), RAGGUARD_CORPUS_DIR: '', RAGGUARD_PROFILE_RUN: 'false',
    RAGGUARD_KEYS_FILE: keysFile, RAGGUARD_ADMIN_KEY: ADMIN,
  });
  service = await RagService.start(cfg, await loadModels(cfg));
  server = createApp(service, { logger: createLogger('silent') }).listen(0, '127.0.0.1');
  await new Promise((r) => server.once('listening', r));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const w = await call(ADMIN, 'POST', '/documents', { documents: [doc('alpha', 1), doc('alpha', 2), doc('beta', 1), doc('beta', 2), doc('beta', 3)] });
  assert.equal(w.status, 201, w.text);
  // Each key's series in /metrics.
  for (const k of [ALPHA_ADMIN, ALPHA_READER, BETA, OPS]) assert.equal((await call(k, 'GET', '/documents?limit=1')).status, 200);
});

after(async () => {
  server.closeAllConnections();
  await new Promise((r) => server.close(r));
  await service.close();
});

describe('/metrics and /debug/* are for admin keys', () => {
  test('no key: 401; a key without admin: 403; each with the error body', async () => {
    for (const route of ['/metrics', '/debug/memory']) {
      const none = await call(undefined, 'GET', route);
      refused(none, 401, 'unauthorized');
      assert.match(none.headers.get('www-authenticate') ?? '', /^Bearer/);
      refused(await call(ALPHA_READER, 'GET', route), 403, 'forbidden');
      refused(await call(BETA, 'GET', route), 403, 'forbidden');
      assert.equal((await call(ADMIN, 'GET', route)).status, 200);
      assert.equal((await call(OPS, 'GET', route)).status, 200);
    }
  });

  test("/metrics: a key of every collection reads every key's series; a scoped admin only its own keys'", async () => {
    const series = (text: string) => new Set([...text.matchAll(/^ragguard:key_requests_total\{key="([^"]+)"/gm)].map((m) => m[1]));
    const all = series((await call(OPS, 'GET', '/metrics')).text);
    for (const k of ['ops', 'alpha-admin', 'alpha-reader', 'beta']) assert.ok(all.has(k), `ops sees ${k}`);
    const scoped = await call(ALPHA_ADMIN, 'GET', '/metrics');
    assert.equal(scoped.status, 200);
    assert.deepEqual([...series(scoped.text)].sort(), ['alpha-admin', 'alpha-reader']);
    assert.ok(!/key="(beta|ops|admin)"/.test(scoped.text), 'no other key named');
    // The server's own figures stay.
    assert.match(scoped.text, /^ragguard:admission_queue_requests\{/m);
  });

  test("/debug/memory: a scoped admin gets its collections' documents and chunks, not the store's figures", async () => {
    const full = (await call(OPS, 'GET', '/debug/memory')).body;
    assert.ok(full['components'].some((c: { name: string }) => c.name === 'faiss_index'));
    assert.equal(typeof full['native']['faiss_index_bytes'], 'number');
    assert.equal(full['tenant'], undefined);
    const mine = await call(ALPHA_ADMIN, 'GET', '/debug/memory');
    assert.equal(mine.status, 200, mine.text);
    assert.equal(mine.body['tenant']['key'], 'alpha-admin');
    assert.equal(mine.body['tenant']['collections'].length, 1);
    assert.equal(mine.body['tenant']['collections'][0]['collection'], 'alpha');
    assert.equal(mine.body['tenant']['collections'][0]['documents'], 2);
    assert.ok(mine.body['tenant']['collections'][0]['chunks'] >= 2);
    assert.ok(!mine.body['components'].some((c: { name: string }) => c.name === 'faiss_index'));
    for (const f of ['faiss_index_bytes', 'store_predicted_bytes', 'expected_growth_bytes']) assert.equal(mine.body['native'][f], undefined, f);
    assert.equal(mine.body['trend'], undefined);
    assert.equal(mine.body['adapters']['loaded'], undefined);
    assert.ok(!mine.text.includes('beta'), 'nothing of the other tenant');
    assert.equal(mine.body['components_total_bytes'], mine.body['components'].reduce((s: number, c: { bytes: number }) => s + c.bytes, 0));
  });
});

describe('/healthz', () => {
  test('counts only for an admin key: the whole store for one of every collection, its own for a scoped one', async () => {
    for (const key of [undefined, ALPHA_READER, BETA, 'not-a-key-at-all']) {
      const h = await call(key, 'GET', '/healthz');
      assert.equal(h.status, 200);
      assert.equal(h.body['status'], 'ok');
      assert.ok(!('documents' in h.body) && !('chunks' in h.body), `no counts for ${key ?? 'no key'}: ${h.text}`);
    }
    for (const key of [ADMIN, OPS]) assert.equal((await call(key, 'GET', '/healthz')).body['documents'], 5);
    const scoped = await call(ALPHA_ADMIN, 'GET', '/healthz');
    assert.equal(scoped.body['documents'], 2);
    // HEAD and express's own route ('/healthz/') alike.
    assert.ok(!('documents' in (await call(undefined, 'GET', '/healthz/')).body));
    assert.equal((await call(OPS, 'GET', '/healthz/')).body['documents'], 5);
  });
});

describe('keys reloaded', () => {
  const until = async (what: string, ok: () => Promise<boolean>) => {
    for (let i = 0; i < 100; i++) {
      if (await ok()) return;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.fail(`never: ${what}`);
  };

  test('on SIGHUP: a key added works, a key removed is 401; a bad file keeps the keys in force', async () => {
    assert.equal((await call(GAMMA, 'GET', '/documents?limit=1')).status, 401);
    // Written aside and renamed over, as an operator's tooling does; the change is picked up by SIGHUP
    // or by the watch, whichever comes first: both are the reload.
    const next = [...KEYS.filter((k) => k.name !== 'beta'), { name: 'gamma', key: GAMMA, collections: ['beta'] }];
    await writeFile(`${keysFile}.new`, JSON.stringify(next));
    await rename(`${keysFile}.new`, keysFile);
    process.kill(process.pid, 'SIGHUP');
    await until('gamma is a key', async () => (await call(GAMMA, 'GET', '/documents?limit=1')).status === 200);
    refused(await call(BETA, 'GET', '/documents?limit=1'), 401, 'invalid_api_key');
    const listed = await call(GAMMA, 'GET', '/documents?limit=10');
    assert.equal(listed.body['total'], 3, 'the new key in its collection');
    // A bad file: the keys in force stay.
    await writeFile(keysFile, '[{"name": "broken"');
    process.kill(process.pid, 'SIGHUP');
    await new Promise((r) => setTimeout(r, 300));
    assert.equal((await call(GAMMA, 'GET', '/documents?limit=1')).status, 200);
    assert.equal((await call(ALPHA_READER, 'GET', '/documents?limit=1')).status, 200);
  });

  test('SIGHUP alone (the file not watched): nothing changes until the signal', async () => {
    const file = path.join(await tempDir(), 'keys.json');
    await writeFile(file, JSON.stringify(KEYS));
    const cfg = { keysFile: file, keys: readKeysFile(file) };
    const logged: string[] = [];
    const r = reloadKeysOnChange(cfg, (m) => logged.push(m), { watch: false })!;
    try {
      await writeFile(file, JSON.stringify([{ name: 'gamma', key: GAMMA, collections: ['beta'] }]));
      await new Promise((res) => setTimeout(res, 300));
      assert.equal(cfg.keys.length, KEYS.length);
      const hup = new Promise((res) => process.once('SIGHUP', res));
      process.kill(process.pid, 'SIGHUP');
      await hup;
      assert.deepEqual(cfg.keys.map((k) => k.name), ['gamma']);
      assert.match(logged.join('\n'), /reloaded .*keys\.json: 1 key \(gamma\)/);
    } finally {
      r.close();
    }
  });

  test('when the file changes, without a signal', async () => {
    await writeFile(keysFile, JSON.stringify(KEYS));
    await until('beta is a key again', async () => (await call(BETA, 'GET', '/documents?limit=1')).status === 200);
    refused(await call(GAMMA, 'GET', '/documents?limit=1'), 401, 'invalid_api_key');
  });
});
