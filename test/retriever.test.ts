/** The first stage through the service: dense, lexical and hybrid retrieval; rerank off keeps the fused order. */
import assert from 'node:assert/strict';
import { before, test } from 'node:test';
import request from 'supertest';
import { loadModels, RagService, type Models } from '../src/service/rag.js';
import { Retriever } from '../src/retrieval/retriever.js';
import { createApp } from '../src/server/app.js';
import { smallCorpus, tempDir, testConfig, faiss } from './helpers.js';

const DOCS = ['apt-cache', 'quotas', 'ipv6', 'task-scheduling-cron-atd', 'rights-management'];
const ALL = { collection: 'default' };
let models: Models;
let service: RagService;

before(async () => {
  const cfg = testConfig({ RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, DOCS), RAGGUARD_PROFILE_RUN: 'false', RAGGUARD_RERANK: 'false' });
  models = await loadModels(cfg);
  service = await RagService.start(cfg, models);
});

test('every mode finds the document of a keyword question; hybrid scores are reciprocal-rank sums', async () => {
  const q = 'Which command changes the disk quota limits of a user? edquota';
  const qv = await models.embedder.embed([q]);
  for (const mode of ['dense', 'lexical', 'hybrid'] as const) {
    const r = new Retriever(service.store, { ...service.cfg, retrieval: mode });
    const { hits, pruned } = await r.search(qv, q, 5, ALL);
    assert.ok(hits.length > 0 && hits.length <= 5, mode);
    assert.equal(hits[0]!.chunk.docId, 'quotas', mode);
    assert.ok(pruned.length <= hits.length);
    for (let i = 1; i < hits.length; i++) assert.ok(hits[i - 1]!.score >= hits[i]!.score, `${mode}: best first`);
    if (mode === 'hybrid') {
      const { rrfK, rrfDenseWeight, rrfLexicalWeight } = service.cfg;
      assert.ok(hits[0]!.score <= (rrfDenseWeight + rrfLexicalWeight) / (rrfK + 1) + 1e-12);
    }
  }
});

test('a chunk ingested after start-up is found by BM25 at once', async () => {
  await service.ingest([{ docId: 'zorblax', title: 'The zorblaxd daemon', text: 'zorblaxd listens on port 7411 and reads /etc/zorblax.conf.' }]);
  const q = 'zorblaxd port';
  const r = new Retriever(service.store, { ...service.cfg, retrieval: 'lexical' });
  assert.equal((await r.search(await models.embedder.embed([q]), q, 3, ALL)).hits[0]?.chunk.docId, 'zorblax');
  assert.equal((await service.retriever.search(await models.embedder.embed([q]), q, 3, ALL)).hits[0]?.chunk.docId, 'zorblax');
});

test('rerank off: no pair is scored, citations keep the fused order and score', async () => {
  const res = await request(createApp(service)).post('/query').send({ query: 'How do I cancel an at job? atrm', max_new_tokens: 4, rerank_top_n: 3 }).expect(200);
  const b = res.body;
  assert.equal(b.guard.as_run.reranked_pairs, 0);
  assert.deepEqual(b.guard.as_run.rerank_runs, []);
  assert.ok(b.citations.length >= 1);
  for (const c of b.citations) assert.equal(c.score, c.retrieval_score);
  for (let i = 1; i < b.citations.length; i++) assert.ok(b.citations[i - 1].score >= b.citations[i].score);
  assert.equal(b.citations[0].doc_id, 'task-scheduling-cron-atd');
});

test('a paced hybrid search gives the event loop its turns and stays right when a removal lands between its two sides', async () => {
  const q = 'Which command changes the disk quota limits of a user? edquota';
  const qv = await models.embedder.embed([q]);
  const r = new Retriever(service.store, { ...service.cfg, retrieval: 'hybrid' });
  let turns = 0;
  const same = await r.searchPaced(qv, q, 5, ALL, async () => {
    turns++;
  });
  assert.ok(turns >= 1, 'a turn between the lexical and the dense search');
  assert.deepEqual(same.hits.map((h) => [h.chunk.id, h.score]), (await r.search(qv, q, 5, ALL)).hits.map((h) => [h.chunk.id, h.score]));
  // The first document's removal, between the two sides (faiss compacts its index): chunk ids are
  // stable, so the fusion still matches the same chunks on both sides, as a search after the removal does.
  const first = faiss(service).documents(0, 1)[0]!.docId;
  assert.notEqual(first, 'quotas');
  let removed = false;
  const paced = await r.searchPaced(qv, q, 5, ALL, async () => {
    if (removed) return;
    removed = true;
    await service.store.remove('default', first);
  });
  const after = await r.search(qv, q, 5, ALL);
  assert.equal(paced.hits[0]!.chunk.docId, 'quotas');
  assert.deepEqual(paced.hits.map((h) => [h.chunk.id, h.score]), after.hits.map((h) => [h.chunk.id, h.score]));
  for (const h of paced.hits) assert.equal(faiss(service).chunk(h.chunk.id), h.chunk, 'hits are the store\'s chunks as they are now');
});
