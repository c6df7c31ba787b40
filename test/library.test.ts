/**
 * ragguard as a library (src/index.ts): the service with no HTTP at all, and its router mounted inside
 * another express app beside that app's own routes. The test models (helpers.ts TEST_ENV), an index in a
 * temporary directory, a two-document corpus.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import express from 'express';
import request from 'supertest';
import { ClosedError, createRagguard, InvalidRequestError, TooLargeError, type Ragguard } from '../src/index.js';
import { smallCorpus, tempDir, TEST_ENV } from './helpers.js';

let rg: Ragguard;
const FACT = 'The quartermaster of the Zephyr Lantern Guild is Orsolya Brandt, appointed in 1987.';

before(async () => {
  rg = await createRagguard({
    env: { ...TEST_ENV, RAGGUARD_PROFILE_RUN: 'false' },
    config: { indexDir: await tempDir(), corpusDir: await smallCorpus(2) },
  });
});
after(async () => {
  await rg.close();
});

test('the service without HTTP: ingest, query with a citation of what was ingested, generate, and the guard applies', async () => {
  assert.equal(rg.config.profileRun, false, 'env settings reach the configuration');
  const [doc] = await rg.ingest([{ docId: 'zephyr-guild', title: 'Zephyr Lantern Guild', text: FACT }]);
  assert.equal(doc!.doc_id, 'zephyr-guild');
  const r = await rg.query({ query: 'Who is the quartermaster of the Zephyr Lantern Guild?', maxNewTokens: 8 });
  assert.ok(r.citations.some((c) => c.doc_id === 'zephyr-guild'), `citations: ${r.citations.map((c) => c.doc_id).join(', ')}`);
  assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 8);
  const g = await rg.generate({ messages: [{ role: 'user', content: 'Say hello.' }], maxNewTokens: 5 });
  assert.ok(g.usage.promptTokens > 0 && g.usage.completionTokens > 0 && g.usage.completionTokens <= 5);
  assert.ok(['stop', 'length'].includes(g.finishReason));
  // A request past the decoder's positions is refused as the HTTP routes refuse it, with the same code.
  await assert.rejects(rg.generate({ prompt: 'x', maxNewTokens: rg.service.models.decoder.shape.maxPositions }),
    (e: unknown) => e instanceof TooLargeError && e.code === 'context_too_long');
  await assert.rejects(rg.generate({}), (e: unknown) => e instanceof InvalidRequestError && e.code === 'invalid_body');
});

test('the router mounted under a path of another express app, beside its own routes', async () => {
  const app = express();
  app.get('/hello', (_req, res) => res.json({ hello: 'world' }));
  app.use('/rag', rg.router());
  app.get('/after', (_req, res) => res.type('text').send('still the host app'));

  assert.deepEqual((await request(app).get('/hello').expect(200)).body, { hello: 'world' });
  assert.equal((await request(app).get('/after').expect(200)).text, 'still the host app');
  const health = await request(app).get('/rag/healthz').expect(200);
  assert.equal(health.body.status, 'ok');
  const q = await request(app).post('/rag/query').send({ query: 'Who is the quartermaster of the Zephyr Lantern Guild?', max_new_tokens: 4 }).expect(200);
  assert.ok(Array.isArray(q.body.citations) && q.body.citations.length > 0);
  const models = await request(app).get('/rag/v1/models').expect(200);
  assert.equal(models.body.object, 'list');
  const bad = await request(app).post('/rag/query').send({ query: 42 }).expect(400);
  assert.equal(typeof bad.body.error.code, 'string');
  const missing = await request(app).get('/rag/nope').expect(404);
  assert.equal(missing.body.error.code, 'not_found');
});

test('a closed instance refuses new work', async () => {
  const other = await createRagguard({ env: { ...TEST_ENV, RAGGUARD_PROFILE_RUN: 'false' }, config: { indexDir: await tempDir(), corpusDir: '' } });
  await other.close();
  await assert.rejects(other.query({ query: 'anything' }), (e: unknown) => e instanceof ClosedError && e.code === 'closed');
});
