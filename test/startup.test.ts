/**
 * Ready at once: the server listens before its service exists (real HTTP on loopback, the server
 * started in this process by the library's serve()), answers /healthz, says on /readyz which phase it is in and how
 * far, refuses the rest with 503 `starting` and Retry-After, and serves once ready. The phases are held
 * open by the test: model loading by a loader that waits for it, the ingest by the run gate.
 */
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import { after, before, describe, test } from 'node:test';
import request from 'supertest';
import type { Config } from '../src/config/config.js';
import { loadModels, type Models } from '../src/service/rag.js';
import { createLogger } from '../src/server/logging.js';
import { serve, type Serving } from '../src/index.js';
import { holdRuns, smallCorpus, tempDir, testConfig, faiss } from './helpers.js';

/**
 * A loader that hands over `models` only when the test opens it, saying one model is loaded meanwhile;
 * `called` resolves once the start has called it (after the service's modules are loaded).
 */
function heldLoader(models: Models) {
  let open!: () => void;
  let fail!: (e: Error) => void;
  let reached!: () => void;
  const called = new Promise<void>((r) => (reached = r));
  const gate = new Promise<void>((resolve, reject) => {
    open = resolve;
    fail = reject;
  });
  const load = async (_cfg: Config, onLoaded: (done: number, of: number) => void) => {
    onLoaded(1, 3);
    reached();
    await gate;
    onLoaded(3, 3);
    return models;
  };
  return { load, open, fail, called };
}

/** GET /readyz until `until` holds of its body; each try is a request, never a clock. */
async function readyzUntil(base: string, until: (body: Record<string, unknown>) => boolean): Promise<Record<string, unknown>> {
  for (;;) {
    const res = await request(base).get('/readyz');
    const body = res.body as Record<string, unknown>;
    if (until(body)) return body;
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('a server that is still starting', () => {
  let cfg: Config;
  let models: Models;
  before(async () => {
    cfg = testConfig({ RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(3), RAGGUARD_PROFILE_RUN: 'false' });
    models = await loadModels(cfg);
  });

  let serving: Serving | undefined;
  after(async () => {
    if (serving) await serving.stop('SIGTERM');
  });

  test('answers /healthz, says its phase and progress on /readyz, refuses queries with 503 starting and Retry-After, then serves', async () => {
    const loader = heldLoader(models);
    serving = await serve({ config: cfg, logger: createLogger('silent'), loadModels: loader.load });
    const base = `http://127.0.0.1:${serving.port}`;
    // Listening before the service's modules are loaded: alive already.
    await request(base).get('/healthz').expect(200);

    // Loading: held by the loader.
    await loader.called;
    const health = await request(base).get('/healthz').expect(200);
    assert.equal(health.body.status, 'ok');
    assert.equal(health.body.ready, false);
    assert.equal(health.body.phase, 'loading');
    const loading = await request(base).get('/readyz').expect(503);
    assert.equal(loading.body.status, 'starting');
    assert.equal(loading.body.phase, 'loading');
    assert.deepEqual(loading.body.progress, { done: 1, of: 3, unit: 'models' });
    assert.equal(loading.body.error.code, 'starting');
    assert.ok(Number(loading.headers['retry-after']) > 0);

    const query = await request(base).post('/query').send({ query: 'sticky bit', max_new_tokens: 2 }).expect(503);
    assert.equal(query.body.error.code, 'starting');
    assert.match(query.body.error.message, /starting: loading \(1 of 3 models\).*\/readyz/);
    assert.ok(Number(query.headers['retry-after']) > 0, 'Retry-After on a refused query');
    const chat = await request(base).post('/v1/chat/completions').send({ model: 'x', messages: [{ role: 'user', content: 'hi' }] }).expect(503);
    assert.equal(chat.body.error.code, 'starting');
    await request(base).get('/v1/models').expect(503);
    const docs = await request(base).post('/documents').send({ documents: [{ text: 'x' }] }).expect(503);
    assert.equal(docs.body.error.code, 'starting');
    // What can be said before the service exists.
    const metrics = await request(base).get('/metrics').expect(200);
    assert.match(metrics.text, /ragguard:startup_phase\{phase="loading"\} 1/);
    assert.match(metrics.text, /process_resident_memory_bytes/);
    const memory = await request(base).get('/debug/memory').expect(503);
    assert.equal(memory.body.error.code, 'starting');
    assert.ok(memory.body.process.rss > 0);

    // Ingesting the corpus: every model run waits at the gate, so no document is done yet.
    const release = await holdRuns();
    loader.open();
    let ingesting: Record<string, unknown>;
    try {
      ingesting = await readyzUntil(base, (b) => b['phase'] === 'ingesting' && b['progress'] !== undefined);
      assert.equal((await request(base).post('/query').send({ query: 'sticky bit' }).expect(503)).body.error.code, 'starting');
      assert.equal((await request(base).get('/healthz').expect(200)).body.phase, 'ingesting');
    } finally {
      release();
    }
    assert.deepEqual(ingesting['progress'], { done: 0, of: 3, unit: 'documents' });

    const { service } = await serving.ready;
    assert.equal(faiss(service).documentCount, 3);
    assert.deepEqual((await request(base).get('/readyz').expect(200)).body, { status: 'ready' });
    const answered = await request(base).post('/query').send({ query: 'sticky bit', max_new_tokens: 2 }).expect(200);
    assert.equal(typeof answered.body.answer, 'string');
    assert.equal((await request(base).get('/healthz').expect(200)).body.documents, 3);
    assert.ok((await request(base).get('/debug/memory').expect(200)).body.budget.bytes > 0);
    assert.equal(serving.startup.ready, true);
    assert.deepEqual(Object.keys(serving.startup.durations()).sort(), ['ingesting', 'loading', 'total', 'warming']);
  });

  test('an idle keep-alive connection outlives Node\'s 5 s default (RAGGUARD_KEEPALIVE_TIMEOUT_MS), so a router reusing it is not cut', async () => {
    assert.ok(serving, 'the server of the test before');
    assert.equal(cfg.keepAliveTimeoutMs, 65000);
    const socket = connect(serving.port, '127.0.0.1');
    let closed = false;
    socket.on('close', () => (closed = true));
    let got = '';
    socket.on('data', (d: Buffer) => (got += d.toString('latin1')));
    const get = async () => {
      const from = got.length;
      socket.write('GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n');
      while (!/HTTP\/1\.1 200[\s\S]*\r\n\r\n[\s\S]*\}/.test(got.slice(from))) {
        assert.equal(closed, false, 'the connection was closed');
        await new Promise((r) => setTimeout(r, 20));
      }
    };
    await get();
    await new Promise((r) => setTimeout(r, 6000));
    assert.equal(closed, false, 'closed while idle for 6 s');
    await get();
    socket.destroy();
  });
});

test('while starting: keys are checked as once ready, probes stay open, a stop closes the port, a failed start rejects', async () => {
  const cfg = testConfig({ RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: '', RAGGUARD_PROFILE_RUN: 'false', RAGGUARD_API_KEY: 'key-while-starting' });
  const loader = heldLoader(undefined as unknown as Models);
  const serving = await serve({ config: cfg, logger: createLogger('silent'), loadModels: loader.load });
  const base = `http://127.0.0.1:${serving.port}`;
  await loader.called;
  try {
    await request(base).get('/healthz').expect(200);
    await request(base).get('/readyz').expect(503);
    assert.equal((await request(base).post('/query').send({ query: 'q' }).expect(401)).body.error.code, 'unauthorized');
    await request(base).post('/query').set('Authorization', 'Bearer key-while-starting').send({ query: 'q' }).expect(503);
  } finally {
    assert.equal(await serving.stop('SIGTERM'), 0);
  }
  assert.equal(serving.server.listening, false);
  loader.fail(new Error('no models here'));
  await assert.rejects(serving.ready, /no models here/);
});
