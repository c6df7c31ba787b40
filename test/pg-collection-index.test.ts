/**
 * The Postgres store's dense index per collection (src/retrieval/pg-collection-index.ts), on a real
 * PostgreSQL with pgvector: a collection past the threshold gets its own partial HNSW index, built by the
 * store in the background; the planner uses it for that collection's searches (EXPLAIN of the store's own
 * statement, with the search's settings), while a small collection is scanned exactly through the btree on
 * collection, and no search touches a whole-table graph (there is none). Recall against exact search in
 * the indexed collection, hits from it alone. A role with DML rights only opens, writes and searches (its
 * large collection exactly, having said once that it may not build the index); `ragguard migrate` then
 * builds it.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, test } from 'node:test';
import pg from 'pg';
import { seededRandom } from '../src/generate/sampler.js';
import { normalize } from '../src/retrieval/embedder.js';
import { COLLECTION_INDEX_ROWS, collectionEfSearchExpr, collectionIndexName } from '../src/retrieval/pg-collection-index.js';
import { denseStatement } from '../src/retrieval/pg-search.js';
import { grantServerRole, migrateDatabase, PostgresStore } from '../src/retrieval/postgres-store.js';
import type { NewDocument } from '../src/retrieval/retrieval-store.js';
import { startTestPostgres, type TestPostgres } from './postgres.js';

// The embedder's dimension: the planner weighs a graph against an exact scan by the table's real size
// (with a handful of tiny rows it sorts a sequential scan, whatever the indexes).
const D = 384;
const BM25 = { k1: 1.2, b: 0.75 };
const quiet = () => undefined;
let server: TestPostgres;
const APP = `ragguard_ci_app_${randomBytes(4).toString('hex')}`;

before(async () => {
  server = await startTestPostgres();
});
after(async () => {
  const admin = new pg.Client({ connectionString: server.url });
  await admin.connect().then(async () => {
    await admin.query(`DROP OWNED BY ${APP}`).catch(() => undefined);
    await admin.query(`DROP ROLE IF EXISTS ${APP}`).catch(() => undefined);
    await admin.end();
  }, () => undefined);
  await server?.stop();
});

function unit(next: () => number): Float32Array {
  const v = Float32Array.from({ length: D }, () => next() * 2 - 1);
  normalize(v);
  return v;
}

/**
 * A vector as an embedder's are: near one of TOPICS directions (cosine about 0.55 to it), as texts cluster
 * by what they are about. Uniform random vectors have no neighbourhoods for a graph to follow: at the
 * candidates a collection of 5,000 gets (the rule: 200) their recall@10 is about 0.94, where
 * the embedder's own vectors reach exact search's (bench:scale-real). These still need the candidates:
 * at an ef_search of 10 the recall below is 0.67.
 */
const TOPICS = 8;
const topics = Array.from({ length: TOPICS }, (_, i) => unit(seededRandom(1000 + i)));
function topical(next: () => number): Float32Array {
  const t = topics[Math.floor(next() * TOPICS)]!;
  const noise = unit(next);
  const v = Float32Array.from({ length: D }, (_, j) => t[j]! + 1.5 * noise[j]!);
  normalize(v);
  return v;
}

/** `n` one-chunk documents in `collection`, their vectors kept in `points`. */
async function fill(store: PostgresStore, collection: string, n: number, next: () => number, points: Map<string, Float32Array>, from = 0): Promise<void> {
  let batch: NewDocument[] = [];
  for (let i = from; i < from + n; i++) {
    const v = topical(next);
    const docId = `${collection}-${i}`;
    points.set(docId, v);
    batch.push({ doc: { docId, title: docId, bytes: 1, collection }, chunks: [{ text: `chunk ${i}`, tokens: 2 }], vectors: v });
    if (batch.length === 250 || i === from + n - 1) {
      await store.addBatch(batch);
      batch = [];
    }
  }
}

/** The plan of the store's dense statement for `collection`, with a search's settings. */
async function plan(url: string, collection: string, query: Float32Array): Promise<string> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    await c.query('BEGIN READ ONLY; SET LOCAL hnsw.iterative_scan = relaxed_order; SET LOCAL hnsw.ef_search = 1000');
    const { rows } = await c.query<{ 'QUERY PLAN': string }>(`EXPLAIN ${denseStatement(query, 10, { collection })}`);
    await c.query('COMMIT');
    return rows.map((r) => r['QUERY PLAN']).join('\n');
  } finally {
    await c.end();
  }
}

async function analyze(url: string): Promise<void> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  await c.query('ANALYZE');
  await c.end();
}

test('a collection past the threshold gets its own HNSW index, which its searches use; a small one is scanned exactly', async () => {
  const url = await server.database();
  const store = await PostgresStore.open(url, D, { bm25: BM25, collectionIndexRows: 4000, log: quiet });
  const next = seededRandom(7);
  const points = new Map<string, Float32Array>();
  try {
    // Written in turns, as tenants do: a collection's rows spread over the table.
    for (let turn = 0; turn < 5; turn++) {
      await fill(store, 'big', 1000, next, points, turn * 1000);
      await fill(store, 'other', 1000, next, points, turn * 1000);
      for (let o = 0; o < 3; o++) await fill(store, `o${o}`, 600, next, points, turn * 600);
    }
    await fill(store, 'small', 300, next, points);
    await store.indexesBuilt();
    assert.ok(store.hasCollectionIndex('big'), 'big has its own index');
    assert.ok(store.hasCollectionIndex('other'), 'other has its own index');
    assert.ok(!store.hasCollectionIndex('small') && !store.hasCollectionIndex('o0'), 'small and o0 are under the threshold');
    await analyze(url);

    const c = new pg.Client({ connectionString: url });
    await c.connect();
    const { rows: indexes } = await c.query<{ indexname: string; indexdef: string }>(
      "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'ragguard_chunks' AND indexdef LIKE '%hnsw%' ORDER BY indexname");
    await c.end();
    // No graph over the whole table: each is one collection's.
    assert.deepEqual(indexes.map((r) => r.indexname).sort(), [collectionIndexName('big'), collectionIndexName('other')].sort());
    for (const r of indexes) assert.match(r.indexdef, /WHERE \(collection = '(big|other)'::text\)/);

    const q = topical(next);
    const big = await plan(url, 'big', q);
    assert.match(big, new RegExp(`Index Scan using ${collectionIndexName('big')}`), big);
    // One scan of the chunks: the planner weighs every partial index once per reference to the table.
    assert.equal(big.match(/ on ragguard_chunks\b/g)?.length, 1, big);
    const small = await plan(url, 'small', q);
    assert.doesNotMatch(small, /ragguard_chunks_hnsw_/, small);
    assert.match(small, /ragguard_chunks_document/, `the small collection is read through the btree on collection:\n${small}`);

    // Recall@10 against exact search within the collection, hits from it alone.
    let found = 0;
    const queries = 20;
    for (let i = 0; i < queries; i++) {
      const query = topical(next);
      const hits = await store.searchDense(query, 10, { collection: 'big' });
      assert.equal(hits.length, 10);
      for (const h of hits) assert.equal(h.chunk.collection, 'big');
      const exact = new Set([...points].filter(([id]) => id.startsWith('big-'))
        .map(([id, v]) => ({ id, s: v.reduce((acc, x, j) => acc + x * query[j]!, 0) }))
        .sort((a, b) => b.s - a.s).slice(0, 10).map((x) => x.id));
      found += hits.filter((h) => exact.has(h.chunk.docId)).length;
      // The small collection: exact, so exactly its 10 nearest.
      const smallHits = await store.searchDense(query, 10, { collection: 'small' });
      const smallExact = [...points].filter(([id]) => id.startsWith('small-'))
        .map(([id, v]) => ({ id, s: v.reduce((acc, x, j) => acc + x * query[j]!, 0) }))
        .sort((a, b) => b.s - a.s).slice(0, 10).map((x) => x.id);
      assert.deepEqual(smallHits.map((h) => h.chunk.docId), smallExact);
    }
    assert.ok(found / (10 * queries) >= 0.95, `recall@10 in the indexed collection ${found / (10 * queries)}`);
  } finally {
    await store.close();
  }
});

test("a dense search's ef_search follows its collection's size, within the configured most", async () => {
  const url = await server.database();
  // The rule, as the database evaluates it for every dense search.
  const db = new pg.Client({ connectionString: url });
  await db.connect();
  const rule = async (chunks: number, most: number) =>
    (await db.query<{ ef: number }>(`SELECT ${collectionEfSearchExpr('$1::bigint', most)} AS ef`, [chunks])).rows[0]!.ef;
  try {
    assert.deepEqual([await rule(10, 1000), await rule(10_000, 1000), await rule(10_001, 1000), await rule(1_000_000, 1000)],
      [200, 200, 201, 1000]);
    assert.equal(await rule(10_000, 60), 60);
  } finally {
    await db.end();
  }
  const store = await PostgresStore.open(url, D, { bm25: BM25, efSearch: 1000, collectionIndexRows: Infinity, log: quiet });
  const capped = await PostgresStore.open(url, D, { bm25: BM25, efSearch: 60, collectionIndexRows: Infinity, log: quiet });
  const next = seededRandom(5);
  try {
    await fill(store, 'mid', 11_200, next, new Map());
    // A name that must be quoted as a literal, not pasted into the statement.
    await fill(store, "o'brien; --", 3, next, new Map());
    assert.deepEqual(await store.settings('mid'), { iterativeScan: 'relaxed_order', efSearch: 224 });
    assert.equal((await store.settings("o'brien; --")).efSearch, 200);
    // A collection never written to (no figures yet) and the other searches: the most.
    assert.equal((await store.settings('absent')).efSearch, 1000);
    assert.equal((await store.settings()).efSearch, 1000);
    assert.equal((await capped.settings('mid')).efSearch, 60);
    // The dense search runs in the same transaction shape: it answers from the collection.
    const hits = await store.searchDense(unit(next), 5, { collection: "o'brien; --" });
    assert.equal(hits.length, 3);
  } finally {
    await store.close();
    await capped.close();
  }
});

test('a DML-only role opens, writes and searches a large collection exactly (saying it may not build the index); ragguard migrate builds it', async () => {
  const url = await server.database();
  await migrateDatabase(url, { dimension: D });
  const admin = new pg.Client({ connectionString: server.url });
  await admin.connect();
  await admin.query(`DROP ROLE IF EXISTS ${APP}; CREATE ROLE ${APP} LOGIN`);
  await admin.end();
  await grantServerRole(url, APP);
  const appUrl = new URL(url);
  appUrl.username = APP;
  const said: string[] = [];
  const store = await PostgresStore.open(appUrl.toString(), D, { bm25: BM25, migrate: 'never', log: (m) => said.push(m) });
  const next = seededRandom(11);
  const points = new Map<string, Float32Array>();
  try {
    await fill(store, 'big', COLLECTION_INDEX_ROWS + 200, next, points);
    await store.indexesBuilt();
    assert.ok(!store.hasCollectionIndex('big'));
    assert.equal(said.length, 1, said.join('\n'));
    assert.match(said[0]!, /may not build one.*ragguard migrate/s);
    // More writes do not say it again.
    await fill(store, 'big2', COLLECTION_INDEX_ROWS + 10, next, points);
    await store.indexesBuilt();
    assert.equal(said.length, 1);
    const q = unit(next);
    const hits = await store.searchDense(q, 10, { collection: 'big' });
    const exact = [...points].filter(([id]) => id.startsWith('big-'))
      .map(([id, v]) => ({ id, s: v.reduce((acc, x, j) => acc + x * q[j]!, 0) }))
      .sort((a, b) => b.s - a.s).slice(0, 10).map((x) => x.id);
    assert.deepEqual(hits.map((h) => h.chunk.docId), exact, 'exact within the collection');
    assert.doesNotMatch(await plan(appUrl.toString(), 'big', q), /ragguard_chunks_hnsw_/);

    const r = await migrateDatabase(url, { dimension: D });
    assert.deepEqual(r.indexed.sort(), ['big', 'big2']);
    const reopened = await PostgresStore.open(appUrl.toString(), D, { bm25: BM25, migrate: 'never', log: quiet });
    assert.ok(reopened.hasCollectionIndex('big') && reopened.hasCollectionIndex('big2'));
    await reopened.close();
    // Nothing left to build.
    assert.deepEqual((await migrateDatabase(url, { dimension: D })).indexed, []);
  } finally {
    await store.close();
  }
});
