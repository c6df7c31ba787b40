/**
 * Document routes: list (paged), get, replace (re-chunk, re-embed), delete; the index and the store stay
 * consistent (retrieval finds the new text, never the old), and everything survives a restart.
 */
import assert from 'node:assert/strict';
import { before, describe, test } from 'node:test';
import request from 'supertest';
import type { Express } from 'express';
import type { Config } from '../src/config/config.js';
import { loadModels, RagService, type Models } from '../src/service/rag.js';
import { createApp } from '../src/server/app.js';
import { createLogger } from '../src/server/logging.js';
import { faiss, smallCorpus, tempDir, testConfig } from './helpers.js';

const DOCS = ['apt-cache', 'quotas', 'rights-management', 'syslog'];
let cfg: Config;
let models: Models;
let service: RagService;
let app: Express;

const SUBMARINE = 'The yellow submarine Nautilus-7 dives to eleven thousand metres in the Mariana trench every spring.';
const BALLOON = 'The red hot-air balloon Zephyr-3 climbs to nine thousand metres above the Sahara every autumn.';

before(async () => {
  cfg = testConfig({ RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, DOCS), RAGGUARD_PROFILE_RUN: 'false' });
  models = await loadModels(cfg);
  service = await RagService.start(cfg, models);
  app = createApp(service, { logger: createLogger('silent') });
});

/** The doc ids of the search hits for `q` (the index as queries see it). */
async function searchDocs(s: RagService, q: string, k = 50): Promise<string[]> {
  const v = await s.models.embedder.embed([q]);
  return faiss(s).search(v, k).map((h) => h.chunk.docId);
}

/** Every document's chunks are its own, in order, and every chunk belongs to a document. */
function assertConsistent(s: RagService): void {
  let n = 0;
  for (const d of faiss(s).documents(0, 1 << 30)) {
    for (const [ord, id] of d.chunkIds.entries()) {
      const c = faiss(s).chunk(id);
      assert.equal(c.id, id);
      assert.equal(c.docId, d.docId);
      assert.equal(c.ord, ord);
      n++;
    }
  }
  assert.equal(n, faiss(s).chunkCount);
}

describe('documents', () => {
  test('GET /documents pages through every document in insertion order', async () => {
    const all = await request(app).get('/documents').expect(200);
    assert.equal(all.body.total, DOCS.length);
    assert.deepEqual(all.body.documents.map((d: { doc_id: string }) => d.doc_id), DOCS);
    assert.equal(all.body.next_offset, null);
    for (const d of all.body.documents) assert.ok(d.chunks >= 1 && d.bytes > 0 && d.title.length > 0);
    const seen: string[] = [];
    let offset: number | null = 0;
    while (offset !== null) {
      const page = await request(app).get('/documents').query({ limit: 3, offset }).expect(200);
      assert.ok(page.body.documents.length <= 3);
      seen.push(...page.body.documents.map((d: { doc_id: string }) => d.doc_id));
      offset = page.body.next_offset as number | null;
    }
    assert.deepEqual(seen, DOCS);
    const bad = await request(app).get('/documents').query({ limit: 0, offset: -1, cursor: 'x' }).expect(400);
    assert.equal(bad.body.error.code, 'invalid_field');
    assert.equal(bad.body.error.problems.length, 3, 'every problem at once');
  });

  test('GET /documents/:id gives its chunks; an unknown id is 404', async () => {
    const res = await request(app).get('/documents/quotas').expect(200);
    assert.equal(res.body.doc_id, 'quotas');
    assert.equal(res.body.chunks.length, faiss(service).document('quotas')!.chunkIds.length);
    assert.ok(res.body.chunks.every((c: { text: string; ord: number }, i: number) => c.text.length > 0 && c.ord === i));
    const none = await request(app).get('/documents/nope').expect(404);
    assert.equal(none.body.error.code, 'document_not_found');
    await request(app).get('/documents/..bad').expect(400);
  });

  test('PUT creates (201), then replaces (200): re-chunked and re-embedded, the old text gone from the index', async () => {
    const created = await request(app).put('/documents/vehicle').send({ title: 'Vehicle', text: SUBMARINE }).expect(201);
    assert.deepEqual(created.body, { document: { doc_id: 'vehicle', title: 'Vehicle', chunks: 1, collection: 'default' }, replaced: false });
    assert.equal((await searchDocs(service, 'yellow submarine Mariana trench', 1))[0], 'vehicle');
    const chunksBefore = faiss(service).chunkCount;
    const long = Array.from({ length: 30 }, () => BALLOON).join(' ');
    const replaced = await request(app).put('/documents/vehicle').send({ title: 'Balloon', text: long }).expect(200);
    assert.equal(replaced.body.replaced, true);
    assert.ok(replaced.body.document.chunks > 1, 're-chunked');
    assert.equal(faiss(service).chunkCount, chunksBefore - 1 + replaced.body.document.chunks);
    const got = await request(app).get('/documents/vehicle').expect(200);
    assert.equal(got.body.title, 'Balloon');
    assert.ok(got.body.chunks.every((c: { text: string }) => !c.text.includes('submarine')));
    assert.equal((await searchDocs(service, 'red hot-air balloon over the Sahara', 1))[0], 'vehicle');
    // The submarine's vector is gone: no hit carries its text.
    const v = await service.models.embedder.embed(['yellow submarine Mariana trench']);
    assert.ok(faiss(service).search(v, faiss(service).chunkCount).every((h) => !h.chunk.text.includes('submarine')));
    assertConsistent(service);
    const errs = await request(app).put('/documents/vehicle').send({ text: '  ', extra: 1 }).expect(400);
    assert.equal(errs.body.error.problems.length, 2);
    await request(app).put('/documents/vehicle').send({ doc_id: 'other', text: 'x' }).expect(400);
  });

  test('DELETE removes a document from the store and the index; the chunks left keep their ids', async () => {
    const total = faiss(service).chunkCount;
    const gone = faiss(service).document('apt-cache')!.chunkIds.length;
    const res = await request(app).delete('/documents/apt-cache').expect(200);
    assert.deepEqual(res.body, { doc_id: 'apt-cache', collection: 'default', deleted: true, chunks: gone });
    assert.equal(faiss(service).chunkCount, total - gone);
    assert.ok(!(await searchDocs(service, 'apt-cache search package names')).includes('apt-cache'));
    assertConsistent(service);
    // Retrieval over the compacted index still finds the right documents.
    assert.equal((await searchDocs(service, 'disk quota limits for users', 1))[0], 'quotas');
    assert.equal((await request(app).delete('/documents/apt-cache').expect(404)).body.error.code, 'document_not_found');
    await request(app).get('/documents/apt-cache').expect(404);
    // The id is free again: POST takes it.
    await request(app).post('/documents').send({ doc_id: 'apt-cache', text: 'apt-cache shows package metadata.' }).expect(201);
  });

  test('a query that found chunks before their document was removed still resolves their titles', async () => {
    await request(app).put('/documents/transient').send({ title: 'Transient', text: 'A short-lived note about glacier ice cores.' }).expect(201);
    const v = await service.models.embedder.embed(['glacier ice cores']);
    const hit = faiss(service).search(v, 1)[0]!;
    assert.equal(hit.chunk.docId, 'transient');
    await request(app).delete('/documents/transient').expect(200);
    // A hit carries its document's title (rag.ts: reranker pairs and citations), so a query in flight needs no lookup.
    assert.equal(hit.chunk.title, 'Transient');
    assert.equal(faiss(service).document('transient'), undefined);
    assert.equal(faiss(service).has('transient'), false);
  });

  test('a query after the writes answers from the current documents', async () => {
    const res = await request(app).post('/query').send({ query: 'Which balloon climbs above the Sahara?', max_new_tokens: 4 }).expect(200);
    assert.equal(res.body.citations[0].doc_id, 'vehicle');
  });

  test('everything persists: a restart finds the same documents, chunks and search results', async () => {
    const list = (await request(app).get('/documents').query({ limit: 1000 }).expect(200)).body;
    const restarted = await RagService.start(cfg, models);
    const app2 = createApp(restarted, { logger: createLogger('silent') });
    assert.deepEqual((await request(app2).get('/documents').query({ limit: 1000 }).expect(200)).body, list);
    assert.deepEqual((await request(app2).get('/documents/vehicle').expect(200)).body, (await request(app).get('/documents/vehicle').expect(200)).body);
    assert.equal(faiss(restarted).chunkCount, faiss(service).chunkCount);
    assertConsistent(restarted);
    assert.deepEqual(await searchDocs(restarted, 'red balloon', 5), await searchDocs(service, 'red balloon', 5));
  });

  test('a write that cannot be persisted leaves the store as it was', async () => {
    const s = await RagService.start(testConfig({ RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, DOCS), RAGGUARD_PROFILE_RUN: 'false' }), models);
    const a = createApp(s, { logger: createLogger('silent') });
    const before = { docs: faiss(s).documents(0, 100), chunks: faiss(s).chunkCount, hits: await searchDocs(s, 'system log messages', 10) };
    faiss(s).persist = () => Promise.reject(new Error('disk full'));
    await request(a).delete('/documents/syslog').expect(500);
    await request(a).put('/documents/quotas').send({ text: SUBMARINE }).expect(500);
    assert.deepEqual(faiss(s).documents(0, 100), before.docs);
    assert.equal(faiss(s).chunkCount, before.chunks);
    assert.deepEqual(await searchDocs(s, 'system log messages', 10), before.hits);
    assertConsistent(s);
  });
});
