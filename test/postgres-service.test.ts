/**
 * The service on the Postgres store, over real HTTP on loopback: two service instances ("replicas") on
 * one PostgreSQL database. What one ingests the other cites; collections and metadata filters reach the
 * store from /query, chat's `rag` and the documents routes; a malformed filter is a 400.
 */
import assert from 'node:assert/strict';
import type { AddressInfo } from 'node:net';
import type { Server } from 'node:http';
import { after, before, describe, test } from 'node:test';
import { loadModels, RagService, type Models } from '../src/service/rag.js';
import { createApp } from '../src/server/app.js';
import { createLogger } from '../src/server/logging.js';
import { smallCorpus, tempDir, testConfig } from './helpers.js';
import { startTestPostgres, type TestPostgres } from './postgres.js';

const MODEL = 'decoder-gqa';

let pgServer: TestPostgres;
let models: Models;
const services: RagService[] = [];
const servers: Server[] = [];
let A: string;
let B: string;

async function replica(url: string, corpus: string): Promise<string> {
  const cfg = testConfig({ RAGGUARD_STORE: url, RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: corpus, RAGGUARD_PROFILE_RUN: 'false' });
  models ??= await loadModels(cfg);
  const service = await RagService.start(cfg, models);
  services.push(service);
  const server = createApp(service, { logger: createLogger('silent') }).listen(0, '127.0.0.1');
  await new Promise<void>((r) => server.once('listening', () => r()));
  servers.push(server);
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

async function call(base: string, method: string, path: string, body?: unknown): Promise<{ status: number; body: any }> {
  const res = await fetch(base + path, {
    method, headers: body === undefined ? {} : { 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: res.status, body: await res.json() };
}

before(async () => {
  pgServer = await startTestPostgres();
  const url = await pgServer.database();
  const corpus = await smallCorpus(0, ['quotas', 'syslog']);
  A = await replica(url, corpus);
  // The second replica finds the corpus already there: it ingests nothing.
  B = await replica(url, corpus);
});

after(async () => {
  for (const s of servers) await new Promise((r) => s.close(r));
  for (const s of services) await s.store.close();
  await pgServer?.stop();
});

const ZORBLAX = 'The zorblaxd daemon listens on TCP port 4711 and writes its journal to /var/log/zorblax.log.';

describe('the service on Postgres, two replicas', () => {
  test('the store is Postgres and both replicas see the corpus once', async () => {
    const [ha, hb] = await Promise.all([call(A, 'GET', '/healthz'), call(B, 'GET', '/healthz')]);
    assert.equal(ha.body.store, 'postgres');
    assert.equal(ha.body.documents, 2);
    assert.deepEqual([hb.body.documents, hb.body.chunks], [ha.body.documents, ha.body.chunks]);
  });

  test('a document ingested through replica A is cited by replica B', async () => {
    const ingest = await call(A, 'POST', '/documents', { doc_id: 'zorblax', title: 'The zorblaxd daemon', text: ZORBLAX });
    assert.equal(ingest.status, 201);
    const q = await call(B, 'POST', '/query', { query: 'Which port does zorblaxd listen on?', max_new_tokens: 4 });
    assert.equal(q.status, 200);
    assert.equal(q.body.citations[0].doc_id, 'zorblax');
    assert.equal(q.body.citations[0].title, 'The zorblaxd daemon');
    assert.equal(q.body.citations[0].collection, 'default');
    // A duplicate through the other replica: 409, as on one.
    assert.equal((await call(B, 'POST', '/documents', { doc_id: 'zorblax', text: 'again' })).status, 409);
  });

  test('collections: a query, a listing and a read in one collection never see another', async () => {
    const docs = (c: string) => Array.from({ length: 6 }, (_, i) => ({
      doc_id: `note-${i}`, title: `Note ${i} of ${c}`, collection: c, metadata: { team: c, n: i },
      text: `Glacier ice core sample ${i} was drilled at station ${c}-${i}; it holds air bubbles from ${1000 + i * 37} years ago.`,
    }));
    assert.equal((await call(A, 'POST', '/documents', { documents: [...docs('tenant-a'), ...docs('tenant-b')] })).status, 201);
    for (const [c, other] of [['tenant-a', 'tenant-b'], ['tenant-b', 'tenant-a']] as const) {
      const q = await call(B, 'POST', '/query', { query: 'glacier ice core air bubbles', collection: c, top_k: 8, max_new_tokens: 2 });
      assert.equal(q.status, 200);
      assert.ok(q.body.citations.length >= 1);
      for (const cit of q.body.citations) {
        assert.equal(cit.collection, c);
        assert.ok(!cit.title.includes(other));
      }
      const list = await call(B, 'GET', `/documents?collection=${c}`);
      assert.equal(list.body.total, 6);
      assert.ok(list.body.documents.every((d: { collection: string; metadata: { team: string } }) => d.collection === c && d.metadata.team === c));
    }
    // The default collection holds none of them.
    const plain = await call(B, 'POST', '/query', { query: 'glacier ice core air bubbles', top_k: 8, max_new_tokens: 2 });
    for (const cit of plain.body.citations) assert.equal(cit.collection, 'default');
    assert.equal((await call(B, 'GET', '/documents/note-1')).status, 404);
    assert.equal((await call(B, 'GET', '/documents/note-1?collection=tenant-a')).body.title, 'Note 1 of tenant-a');
  });

  test('a metadata filter keeps top_k full, on /query and on chat\'s rag', async () => {
    const q = await call(A, 'POST', '/query', {
      query: 'glacier ice core', collection: 'tenant-a', filter: { metadata: { n: { in: [1, 3, 5] } } }, top_k: 3, max_new_tokens: 2,
    });
    assert.equal(q.status, 200);
    assert.equal(q.body.retrieval.hits, 3, 'top_k full inside the filter');
    for (const cit of q.body.citations) assert.match(cit.doc_id, /^note-[135]$/);
    const chat = await call(B, 'POST', '/v1/chat/completions', {
      model: MODEL, messages: [{ role: 'user', content: 'glacier ice core air bubbles' }], max_tokens: 2, temperature: 0,
      rag: { top_k: 4, rerank_top_n: 4, filter: { collection: 'tenant-b', metadata: { n: 2 } } },
    });
    assert.equal(chat.status, 200);
    assert.deepEqual(chat.body.citations.map((c: { doc_id: string; collection: string }) => `${c.collection}/${c.doc_id}`), ['tenant-b/note-2']);
  });

  test('a malformed filter or collection is a 400 with {error: {code, message}}', async () => {
    const bad = [
      { filter: { metadata: { n: { in: [] } } } },
      { filter: { metadata: { 'bad key!': 1 } } },
      { filter: { metadata: { n: { gt: 1 } } } },
      { filter: { metadata: { n: [1, 2] } } },
      { filter: { unknown: 1 } },
      { collection: '../etc' },
      { collection: 'tenant-a', filter: { collection: 'tenant-b' } },
    ];
    for (const extra of bad) {
      const r = await call(A, 'POST', '/query', { query: 'glacier', max_new_tokens: 2, ...extra });
      assert.equal(r.status, 400, JSON.stringify(extra));
      assert.equal(typeof r.body.error.code, 'string');
      assert.equal(typeof r.body.error.message, 'string');
    }
    const chat = await call(A, 'POST', '/v1/chat/completions', {
      model: MODEL, messages: [{ role: 'user', content: 'glacier' }], max_tokens: 2, rag: { filter: { metadata: { x: { in: 'a' } } } },
    });
    assert.equal(chat.status, 400);
    assert.equal((await call(A, 'GET', '/documents?collection=no%20spaces')).status, 400);
    assert.equal((await call(A, 'POST', '/documents', { text: 'x', metadata: { nested: { a: 1 } } })).status, 400);
  });

  test('documents CRUD on one replica is what the other reads', async () => {
    const created = await call(A, 'PUT', '/documents/vehicle?collection=fleet', { title: 'Vehicle', text: 'The yellow submarine Nautilus-7 dives in the Mariana trench.', metadata: { kind: 'sub' } });
    assert.equal(created.status, 201);
    assert.deepEqual(created.body.document, { doc_id: 'vehicle', title: 'Vehicle', chunks: 1, collection: 'fleet' });
    const read = await call(B, 'GET', '/documents/vehicle?collection=fleet');
    assert.equal(read.body.metadata.kind, 'sub');
    assert.match(read.body.chunks[0].text, /submarine/);
    const replaced = await call(B, 'PUT', '/documents/vehicle', { collection: 'fleet', title: 'Balloon', text: 'The red balloon Zephyr-3 climbs above the Sahara.' });
    assert.equal(replaced.status, 200);
    const q = await call(A, 'POST', '/query', { query: 'red balloon Sahara', collection: 'fleet', max_new_tokens: 2 });
    assert.equal(q.body.citations[0].title, 'Balloon');
    assert.ok(q.body.citations.every((c: { text: string }) => !c.text.includes('submarine')));
    assert.equal((await call(A, 'DELETE', '/documents/vehicle?collection=fleet')).status, 200);
    assert.equal((await call(B, 'GET', '/documents/vehicle?collection=fleet')).status, 404);
    assert.equal((await call(B, 'DELETE', '/documents/vehicle?collection=fleet')).status, 404);
    assert.equal((await call(B, 'GET', '/documents?collection=fleet')).body.total, 0);
  });
});
