/**
 * The Postgres store's searches as one round trip each, on a real PostgreSQL: a dense search, a lexical one
 * and a settings read are each one query sent on one connection (a SELECT of local set_configs and the
 * statement in one string: one implicit transaction), an exact fill after a short HNSW scan one more; the
 * settings hold for that transaction alone, read only included; the values written into that
 * string (the query vector, a collection's name, a metadata value, with quotes and backslashes) arrive as
 * sent, select the right rows and inject nothing; and a search that fails (an error in the middle of the
 * string, a statement timeout) leaves nothing behind: the next search on a pool of one connection works.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import pg from 'pg';
import pgvector from 'pgvector';
import { seededRandom } from '../src/generate/sampler.js';
import { normalize } from '../src/retrieval/embedder.js';
import { oneShotSql, vectorLiteral } from '../src/retrieval/pg-one-shot.js';
import { searchSettingsSql } from '../src/retrieval/pg-search-settings.js';
import { PostgresStore } from '../src/retrieval/postgres-store.js';
import type { NewDocument } from '../src/retrieval/retrieval-store.js';
import { startTestPostgres, type TestPostgres } from './postgres.js';

const D = 8;
const BM25 = { k1: 1.2, b: 0.75 };
const quiet = () => undefined;
const NASTY = "it's a \\ \"tenant\"'); DROP TABLE ragguard_chunks; --";
const VALUE = "o'brien \\' x";

let server: TestPostgres;
before(async () => {
  server = await startTestPostgres();
});
after(async () => {
  await server?.stop();
});

function unit(next: () => number): Float32Array {
  const v = Float32Array.from({ length: D }, () => next() * 2 - 1);
  normalize(v);
  return v;
}

/** `n` one-chunk documents in `collection`, each with metadata `meta(i)`. */
function docs(collection: string, n: number, next: () => number, meta: (i: number) => Record<string, string> = () => ({})): NewDocument[] {
  return Array.from({ length: n }, (_, i) => ({
    doc: { docId: `${collection}/${i}`, title: `t${i}`, bytes: 1, collection, metadata: meta(i) },
    chunks: [{ text: `zorblax ${i} ${collection}`, tokens: 3 }], vectors: unit(next),
  }));
}

/** The queries pg clients send while `work` runs (each pool connection is a pg.Client). */
async function queriesDuring(work: () => Promise<unknown>): Promise<string[]> {
  const proto = pg.Client.prototype as unknown as { query: (...args: unknown[]) => unknown };
  const original = proto.query;
  const sent: string[] = [];
  proto.query = function (this: unknown, ...args: unknown[]) {
    sent.push(typeof args[0] === 'string' ? args[0] : String((args[0] as { text?: string } | undefined)?.text));
    return original.apply(this, args);
  };
  try {
    await work();
  } finally {
    proto.query = original;
  }
  return sent;
}

async function withAdmin<T>(url: string, work: (c: pg.Client) => Promise<T>): Promise<T> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    return await work(c);
  } finally {
    await c.end();
  }
}

test('a dense search, a lexical search and a settings read are one query each; a short HNSW scan\'s exact fill one more', async () => {
  const url = await server.database();
  const store = await PostgresStore.open(url, D, { bm25: BM25, poolSize: 2, log: quiet });
  try {
    const next = seededRandom(1);
    await store.addBatch(docs('a', 30, next, (i) => ({ kind: i < 2 ? 'rare' : 'common' })));
    const q = unit(next);
    let hits: unknown[] = [];
    const dense = await queriesDuring(async () => {
      hits = await store.searchDense(q, 5, { collection: 'a' });
    });
    assert.equal(hits.length, 5);
    assert.equal(dense.length, 1, `one query, not ${dense.length}: ${dense.map((s) => s.slice(0, 40)).join(' | ')}`);
    assert.match(dense[0]!, /^SELECT set_config\('transaction_read_only', 'on', true\), .*set_config\('hnsw\.ef_search'.*; WITH nearest AS MATERIALIZED .*ORDER BY c\.distance, c\.id$/s);
    const lexical = await queriesDuring(async () => {
      hits = await store.searchLexical('zorblax', 5, { collection: 'a' });
    });
    assert.equal(hits.length, 5);
    assert.equal(lexical.length, 1, `one query, not ${lexical.length}`);
    assert.equal((await queriesDuring(() => store.settings('a'))).length, 1);
    // Two match, five are asked for: the HNSW (here exact) scan comes up short, and the exact fill is a second transaction.
    const fill = await queriesDuring(async () => {
      hits = await store.searchDense(q, 5, { collection: 'a', metadata: { kind: 'rare' } });
    });
    assert.equal(hits.length, 2);
    assert.equal(fill.length, 2);
  } finally {
    await store.close();
  }
});

test('the query vector arrives as the float32s sent, equal to pgvector\'s own text form', async () => {
  const url = await server.database();
  await withAdmin(url, async (c) => {
    await c.query('CREATE EXTENSION IF NOT EXISTS vector');
    const next = seededRandom(3);
    const view = new DataView(new ArrayBuffer(4));
    for (let round = 0; round < 50; round++) {
      // Embedder-like components, and arbitrary finite float32s from their bits (tiny and huge exponents).
      const v = Float32Array.from({ length: 64 }, (_, i) => {
        if (i % 2 === 0) return (next() * 2 - 1) / 4;
        view.setUint32(0, Math.floor(next() * 2 ** 32));
        const f = view.getFloat32(0);
        return Number.isFinite(f) && Math.abs(f) > 1e-37 ? f : 0.5;
      });
      const { rows } = await c.query<{ a: number[]; same: boolean }>(
        `SELECT ${vectorLiteral(v)}::real[] AS a, ${vectorLiteral(v)} = $1::vector AS same`, [pgvector.toSql(Array.from(v))]);
      assert.ok(rows[0]!.same, 'equal to the vector pgvector\'s toSql writes');
      assert.deepEqual(rows[0]!.a.map((x) => Math.fround(x)), Array.from(v));
    }
  });
});

test('a collection\'s name and a metadata value with quotes and backslashes find their rows and inject nothing', async () => {
  const url = await server.database();
  const store = await PostgresStore.open(url, D, { bm25: BM25, log: quiet });
  try {
    const next = seededRandom(2);
    await store.addBatch(docs(NASTY, 6, next, (i) => ({ owner: i % 2 === 0 ? VALUE : 'other' })));
    // Neighbours by name: a prefix of it, and the name unescaped.
    await store.addBatch(docs("it's a ", 6, next, () => ({ owner: VALUE })));
    await store.addBatch(docs("it''s a \\\\ \"tenant\"'); DROP TABLE ragguard_chunks; --", 6, next, () => ({ owner: VALUE })));
    const q = unit(next);
    const dense = await store.searchDense(q, 10, { collection: NASTY });
    assert.deepEqual(dense.map((h) => h.chunk.docId).sort(), Array.from({ length: 6 }, (_, i) => `${NASTY}/${i}`).sort());
    const filtered = await store.searchDense(q, 10, { collection: NASTY, metadata: { owner: VALUE } });
    assert.deepEqual(filtered.map((h) => h.chunk.docId).sort(), [0, 2, 4].map((i) => `${NASTY}/${i}`));
    const lexical = await store.searchLexical("zorblax it's \\", 10, { collection: NASTY, metadata: { owner: { in: [VALUE, 'nobody'] } } });
    assert.deepEqual(lexical.map((h) => h.chunk.docId).sort(), [0, 2, 4].map((i) => `${NASTY}/${i}`));
    assert.ok(lexical.every((h) => h.chunk.collection === NASTY));
    assert.deepEqual(await store.counts(), { documents: 18, chunks: 18 }, 'every table and row still there');
    assert.equal((await store.settings(NASTY)).iterativeScan, 'relaxed_order');
  } finally {
    await store.close();
  }
});

test('after a search fails inside its one query, the next on the same connection works', async () => {
  const url = await server.database();
  const store = await PostgresStore.open(url, D, { bm25: BM25, poolSize: 1, log: quiet });
  const backends = () => withAdmin(url, async (c) => (await c.query<{ pid: number }>(
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'")).rows.map((r) => r.pid));
  try {
    const next = seededRandom(4);
    await store.addBatch(docs('a', 10, next));
    const q = unit(next);
    const want = (await store.searchDense(q, 3, { collection: 'a' })).map((h) => h.chunk.id);
    const before = await backends();
    assert.equal(before.length, 1);
    // A vector of another dimension: pgvector refuses it in the search's statement, after its settings ran.
    await assert.rejects(store.searchDense(new Float32Array(3).fill(0.5), 3, { collection: 'a' }), /different vector dimensions/);
    assert.deepEqual((await store.searchDense(q, 3, { collection: 'a' })).map((h) => h.chunk.id), want);
    assert.deepEqual((await store.searchLexical('zorblax', 3, { collection: 'a' })).length, 3);
    assert.deepEqual(await backends(), before, 'the same connection, pooled again');
  } finally {
    await store.close();
  }
});

test('after a search\'s statement timeout, the next search on the same pool works', async () => {
  const url = await server.database();
  const store = await PostgresStore.open(url, D, { bm25: BM25, poolSize: 1, statementTimeoutMs: 200, log: quiet });
  try {
    const next = seededRandom(5);
    await store.addBatch(docs('a', 10, next));
    const q = unit(next);
    const want = (await store.searchDense(q, 3, { collection: 'a' })).map((h) => h.chunk.id);
    // A lock the search waits for until its statement timeout cancels it (held until then, whatever the clock).
    await withAdmin(url, async (c) => {
      await c.query('BEGIN; LOCK TABLE ragguard_chunks IN ACCESS EXCLUSIVE MODE');
      await assert.rejects(store.searchDense(q, 3, { collection: 'a' }), /statement timeout/);
      await c.query('ROLLBACK');
    });
    assert.deepEqual((await store.searchDense(q, 3, { collection: 'a' })).map((h) => h.chunk.id), want);
    assert.deepEqual(await store.settings('a'), { iterativeScan: 'relaxed_order', efSearch: 200 });
  } finally {
    await store.close();
  }
});

test('a search\'s settings hold for its one query alone: read only there, the session\'s own after it', async () => {
  const url = await server.database();
  const store = await PostgresStore.open(url, D, { bm25: BM25, poolSize: 1, log: quiet });
  await store.close(); // the schema, made
  await withAdmin(url, async (c) => {
    const read = "SELECT current_setting('transaction_read_only') AS ro, current_setting('hnsw.ef_search') AS ef, " +
      "current_setting('hnsw.iterative_scan') AS it, current_setting('statement_timeout') AS st";
    const show = async () => (await c.query<{ ro: string; ef: string; it: string; st: string }>(read)).rows[0]!;
    await c.query('LOAD \'vector\'');
    const session = await show();
    const settings = searchSettingsSql({ efSearch: 321, statementTimeoutMs: 4_321, collection: 'nowhere' });
    const inside = await c.query(oneShotSql(settings, read)) as unknown as pg.QueryResult[];
    assert.deepEqual(inside[1]!.rows[0], { ro: 'on', ef: '321', it: 'relaxed_order', st: '4321ms' });
    await assert.rejects(c.query(oneShotSql(settings, "INSERT INTO ragguard_collection_stats (collection) VALUES ('x')")), /read-only transaction/);
    assert.deepEqual(await show(), session);
    assert.equal(session.ro, 'off');
    assert.notEqual(session.ef, '321');
  });
});
