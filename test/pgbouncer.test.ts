/**
 * The Postgres store behind a real PgBouncer in transaction pooling mode (test/pgbouncer.ts): a search
 * runs at the configured hnsw.ef_search (400), not at pgvector's default 40, because its settings are
 * made local to the search's own transaction (set_config(..., true), as SET LOCAL). A session SET does not survive there (shown
 * first: the hazard is real in this setup), and on a graph where 40 candidates lose neighbours the
 * results through the pooler are those of ef_search 400 on a direct connection, not those of 40, and so is
 * their recall against exact search. A search (one query, one implicit transaction: its settings, its
 * statement) that fails there leaves nothing open: the next searches run as configured.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import pg from 'pg';
import { seededRandom } from '../src/generate/sampler.js';
import { normalize } from '../src/retrieval/embedder.js';
import { PostgresStore } from '../src/retrieval/postgres-store.js';
import type { Hit, NewDocument } from '../src/retrieval/retrieval-store.js';
import { startPgBouncer, type TestPgBouncer } from './pgbouncer.js';
import { startTestPostgres, type TestPostgres } from './postgres.js';

const D = 24;
const BM25 = { k1: 1.2, b: 0.75 };
const quiet = () => undefined;

let server: TestPostgres;
let bouncer: TestPgBouncer;
before(async () => {
  server = await startTestPostgres();
  bouncer = await startPgBouncer(server.url);
});
after(async () => {
  await bouncer?.stop();
  await server?.stop();
});

const dbName = (url: string) => new URL(url).pathname.slice(1);

function unit(next: () => number): Float32Array {
  const v = Float32Array.from({ length: D }, () => next() * 2 - 1);
  normalize(v);
  return v;
}

test('through PgBouncer (transaction mode) a session SET is lost by the next transaction', async () => {
  const db = dbName(await server.database());
  const c = new pg.Client({ connectionString: bouncer.url(db) });
  await c.connect();
  try {
    await c.query("SELECT '[1,2]'::vector"); // pgvector's library loaded on the server connection
    await c.query('SET hnsw.ef_search = 400');
    const { rows } = await c.query<{ e: string | null }>("SELECT current_setting('hnsw.ef_search', true) AS e");
    assert.notEqual(rows[0]?.e, '400', 'a session SET survived: this pooler setup would not show the per-connection SET failing');
  } finally {
    await c.end();
  }
});

test('every search through PgBouncer runs at the store\'s ef_search 400 with the iterative scan', async () => {
  const db = dbName(await server.database());
  const store = await PostgresStore.open(bouncer.url(db), D, { bm25: BM25, efSearch: 400, poolSize: 8, log: quiet });
  try {
    const all = await Promise.all(Array.from({ length: 24 }, () => store.settings()));
    for (const s of all) assert.deepEqual(s, { iterativeScan: 'relaxed_order', efSearch: 400 });
  } finally {
    await store.close();
  }
});

test('on a graph where 40 candidates lose neighbours, searches through PgBouncer find what ef_search 400 finds', async (t) => {
  const direct = await server.database();
  // A sparse graph (m 4, ef_construction 8) over random points: a scan of 40 candidates misses neighbours.
  const build = { bm25: BM25, hnswM: 4, hnswEfConstruction: 8, log: quiet };
  const writer = await PostgresStore.open(direct, D, { ...build, efSearch: 400 });
  const next = seededRandom(400);
  const N = 3000;
  const batch: NewDocument[] = [];
  const points: Float32Array[] = [];
  for (let i = 0; i < N; i++) {
    points.push(unit(next));
    batch.push({ doc: { docId: `d${i}`, title: `t${i}`, bytes: 1 }, chunks: [{ text: `p${i}`, tokens: 1 }], vectors: points[i]! });
    if (batch.length === 500) await writer.addBatch(batch.splice(0));
  }
  // The collection's own HNSW index, which the writer builds in the background once it passes the threshold.
  await writer.indexesBuilt();
  assert.ok(writer.hasCollectionIndex('default'), 'the collection has its own HNSW index');
  // The planner's statistics, as autovacuum would gather them: without, it scans exactly (a table it thinks small).
  const admin = new pg.Client({ connectionString: direct });
  await admin.connect();
  await admin.query('ANALYZE');
  await admin.end();
  const at40 = await PostgresStore.open(direct, D, { ...build, efSearch: 40 });
  const pooled = await PostgresStore.open(bouncer.url(dbName(direct)), D, { ...build, efSearch: 400 });
  try {
    const queries = Array.from({ length: 40 }, () => unit(next));
    const k = 20;
    let differ40 = 0;
    const found = { pooled: 0, at400: 0, at40: 0 };
    for (const q of queries) {
      const [want, got, low] = await Promise.all([writer, pooled, at40].map((s) => s.searchDense(q, k, { collection: 'default' })));
      const ids = (hits: Hit[] | undefined) => (hits ?? []).map((h) => h.chunk.docId).join(',');
      assert.equal(ids(got), ids(want), 'through PgBouncer the search found what ef_search 400 finds');
      if (ids(low) !== ids(want)) differ40++;
      // Recall against exact search (every point scored here).
      const exact = new Set(points.map((p, i) => ({ i, s: p.reduce((acc, x, j) => acc + x * q[j]!, 0) }))
        .sort((a, b) => b.s - a.s).slice(0, k).map((x) => `d${x.i}`));
      const hit = (hits: Hit[] | undefined) => (hits ?? []).filter((h) => exact.has(h.chunk.docId)).length;
      found.pooled += hit(got);
      found.at400 += hit(want);
      found.at40 += hit(low);
    }
    const recall = (n: number) => n / (k * queries.length);
    // The set tells the two apart: were the pooled search at 40, the assertions above would fail.
    assert.ok(differ40 >= 5, `ef_search 40 differed from 400 on only ${differ40} of ${queries.length} queries: the set does not tell them apart`);
    t.diagnostic(`recall@${k}: through PgBouncer ${recall(found.pooled).toFixed(3)}, direct at 400 ${recall(found.at400).toFixed(3)}, direct at 40 ${recall(found.at40).toFixed(3)}`);
    assert.equal(recall(found.pooled), recall(found.at400), 'through PgBouncer: the recall of ef_search 400');
    assert.ok(recall(found.pooled) > recall(found.at40) + 0.05,
      `recall@${k} through PgBouncer ${recall(found.pooled).toFixed(3)}, at ef_search 40 ${recall(found.at40).toFixed(3)}: not told apart`);
  } finally {
    await Promise.all([writer.close(), at40.close(), pooled.close()]);
  }
});

test('a search that fails through PgBouncer, inside its one query, leaves neither the server connection nor the pool aborted', async () => {
  const db = dbName(await server.database());
  const store = await PostgresStore.open(bouncer.url(db), D, { bm25: BM25, efSearch: 400, poolSize: 1, log: quiet });
  try {
    const next = seededRandom(7);
    await store.addBatch(Array.from({ length: 10 }, (_, i) => ({
      doc: { docId: `d${i}`, title: `t${i}`, bytes: 1 }, chunks: [{ text: `p${i}`, tokens: 1 }], vectors: unit(next),
    })));
    const q = unit(next);
    const want = (await store.searchDense(q, 3, { collection: 'default' })).map((h) => h.chunk.id);
    // pgvector refuses a vector of another dimension in the search's statement, after its settings.
    await assert.rejects(store.searchDense(new Float32Array(D + 1).fill(0.5), 3, { collection: 'default' }), /different vector dimensions/);
    assert.deepEqual((await store.searchDense(q, 3, { collection: 'default' })).map((h) => h.chunk.id), want);
    const all = await Promise.all(Array.from({ length: 8 }, () => store.settings()));
    for (const s of all) assert.deepEqual(s, { iterativeScan: 'relaxed_order', efSearch: 400 });
  } finally {
    await store.close();
  }
});
