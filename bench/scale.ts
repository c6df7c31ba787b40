/**
 * Scale: synthetic stores of BENCH_SCALE_SIZES (10000,100000,1000000) chunks of BENCH_SCALE_DIM (384)
 * dimensions (bench/synthetic.ts: unit vectors from a Gaussian mixture of 1000 clusters, short texts whose
 * words follow the clusters), in each of BENCH_SCALE_STORES (faiss,postgres), one size at a time, each store
 * built, measured and removed before the next:
 *
 * - build: documents of 10 chunks through the store's addBatch, BENCH_SCALE_BATCH (10000) chunks a call.
 *   faiss: as a server ingests (its log, compactions, the switch to HNSW at RAGGUARD_FAISS_ANN_MIN, each
 *   batch's insertion into the graph), waiting after each batch for the store's background work. Postgres:
 *   the collection's HNSW index (the store's own per-collection definition, pg-collection-index.ts) not
 *   built during the load and created after it, as pgvector's documentation advises, with
 *   BENCH_SCALE_PG_MAINTENANCE_MEM (4GB) of maintenance_work_mem and BENCH_SCALE_PG_WORKERS (1) parallel
 *   maintenance workers; then pg_prewarm of the index.
 * - query: BENCH_SCALE_QUERIES (200) queries from the same mixture (not rows of the set), dense top 10
 *   through the store interface (searchDense, collection 'default'): p50/p95 after 20 warm-up queries, and
 *   recall@10 against exact search (brute force over the same vectors, batch by batch as they are made).
 *   Lexical (BM25 of three of the query cluster's words) and hybrid (both, fused by reciprocal rank) p50/p95
 *   unless BENCH_SCALE_HYBRID=0; faiss builds its BM25 index first (timed: lexical_build_s).
 * - ingest: BENCH_SCALE_INGESTS (20) new documents of 4 chunks, one addBatch each, one after the other
 *   (the embedding of their text is not part of it): p50/p95/max.
 * - restart: close the store, open it again, first query answered (faiss: the snapshot read and verified,
 *   the log replayed; Postgres: a replica reconnecting, the server stays up).
 * - memory: faiss, the process's resident bytes after a collection (the store's own prediction beside it);
 *   Postgres, shared_buffers and the index's and tables' sizes.
 *
 * Postgres: BENCH_SCALE_PG_URL (a server whose role may CREATE DATABASE), else one started by
 * scripts/postgres.sh with BENCH_SCALE_PG_SHARED_BUFFERS (2GB) of shared buffers, stopped at the end. The
 * store's own settings come from the environment as the server reads them (RAGGUARD_FAISS_*, RAGGUARD_PG_EF_SEARCH).
 *
 * - ef sweep (BENCH_SCALE_EF_SWEEP, e.g. 128,256,512: none by default): after the rest, the store opened
 *   again at each HNSW candidate-list size (faiss: efSearch; Postgres: hnsw.ef_search), dense queries
 *   only: p50/p95 and recall@10 against the same exact search (the ingests' 80 chunks are in the store by
 *   then: a hit on one counts as a miss), the recall a latency buys, from one build.
 *
 * Each case prints one JSON line; the last line sums them up with the goals at the largest size
 * (query p95 <= 30 ms at recall@10 >= 0.95, one-document ingest p95 <= 200 ms). Run with nice on a shared
 * machine; figures need a quiet one.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pg from 'pg';
import { loadConfig } from '../src/config/config.js';
import { reciprocalRankFusion } from '../src/retrieval/fusion.js';
import { FaissStore } from '../src/retrieval/faiss-store.js';
import { collectionIndexName, collectionIndexSql } from '../src/retrieval/pg-collection-index.js';
import { PostgresStore } from '../src/retrieval/postgres-store.js';
import type { Hit, NewDocument, RetrievalStore } from '../src/retrieval/retrieval-store.js';
import { trimMalloc } from '../src/runtime/malloc.js';
import { startPostgres, type PgServer } from './pg-bench-server.js';
import { ClusteredSet, ExactNeighbours } from './synthetic.js';

const env = (name: string, dflt: string) => process.env[name] ?? dflt;
const SIZES = env('BENCH_SCALE_SIZES', '10000,100000,1000000').split(',').map(Number);
const STORES = env('BENCH_SCALE_STORES', 'faiss,postgres').split(',') as ('faiss' | 'postgres')[];
const DIM = Number(env('BENCH_SCALE_DIM', '384'));
const QUERIES = Number(env('BENCH_SCALE_QUERIES', '200'));
const INGESTS = Number(env('BENCH_SCALE_INGESTS', '20'));
const BATCH = Number(env('BENCH_SCALE_BATCH', '10000'));
const HYBRID = env('BENCH_SCALE_HYBRID', '1') !== '0';
const PG_MAINTENANCE_MEM = env('BENCH_SCALE_PG_MAINTENANCE_MEM', '4GB');
const PG_WORKERS = Number(env('BENCH_SCALE_PG_WORKERS', '1'));
const PG_SHARED_BUFFERS = env('BENCH_SCALE_PG_SHARED_BUFFERS', '2GB');
const CHUNKS_PER_DOC = 10;
const INGEST_CHUNKS = 4;
const EF_SWEEP = env('BENCH_SCALE_EF_SWEEP', '').split(',').filter(Boolean).map(Number);
if (EF_SWEEP.some((e) => !Number.isInteger(e) || e < 1)) throw new Error('BENCH_SCALE_EF_SWEEP takes positive integers');
const WARMUP = 20;
const K = 10;
const FILTER = { collection: 'default' };

const cfg = loadConfig(process.env);
const BM25 = { k1: cfg.bm25K1, b: cfg.bm25B };
const log = (s: string) => console.error(`[bench:scale] ${s}`);
const now = () => performance.now();
const round = (x: number, digits = 2) => Math.round(x * 10 ** digits) / 10 ** digits;
const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!;
};

const set = new ClusteredSet(DIM);
const queries = set.queries(QUERIES);
const queryAt = (q: number) => queries.vectors.subarray(q * DIM, (q + 1) * DIM);

/** Rows [first, first + n) as documents of CHUNKS_PER_DOC chunks (document i holds rows 10i..10i+9). */
function documents(first: number, n: number, prefix = 'd'): NewDocument[] {
  const { vectors, clusters } = set.rows(first, n);
  const out: NewDocument[] = [];
  for (let at = 0; at < n; at += CHUNKS_PER_DOC) {
    const m = Math.min(CHUNKS_PER_DOC, n - at);
    const row = first + at;
    out.push({
      doc: { docId: `${prefix}${row / CHUNKS_PER_DOC}`, title: `Document ${row / CHUNKS_PER_DOC}`, bytes: m * 64 },
      chunks: Array.from({ length: m }, (_, j) => ({ text: set.text(row + j, clusters[at + j]!), tokens: 8 })),
      vectors: vectors.subarray(at * DIM, (at + m) * DIM),
    });
  }
  return out;
}

/** The set's row a hit is (document i's chunk j is row 10i + j). */
const rowOf = (h: Hit) => Number(h.chunk.docId.slice(1)) * CHUNKS_PER_DOC + h.chunk.ord;

/** Exact top 10 of every query over the set's first n rows. */
const exactCache = new Map<number, ExactNeighbours>();
function exactFor(n: number): ExactNeighbours {
  let e = exactCache.get(n);
  if (!e) {
    e = new ExactNeighbours(queries.vectors, DIM, K);
    for (let first = 0; first < n; first += BATCH) e.add(set.rows(first, Math.min(BATCH, n - first)).vectors, first);
    exactCache.set(n, e);
  }
  return e;
}

interface Measured {
  query_p50_ms: number;
  query_p95_ms: number;
  recall_at_10: number;
  lexical_p50_ms: number | null;
  lexical_p95_ms: number | null;
  hybrid_p50_ms: number | null;
  hybrid_p95_ms: number | null;
  ingest_p50_ms: number;
  ingest_p95_ms: number;
  ingest_max_ms: number;
}

/** Queries, lexical and hybrid, then the one-document ingests: the same for both stores. */
/** Dense top-K queries after the warm-up: each one's latency, and recall@K against exact search over n rows. */
async function denseQueries(store: RetrievalStore, n: number): Promise<{ lat: number[]; recall: number }> {
  for (let q = 0; q < WARMUP; q++) await store.searchDense(queryAt(q % QUERIES), K, FILTER);
  const lat: number[] = [];
  const found: number[][] = [];
  for (let q = 0; q < QUERIES; q++) {
    const t = now();
    const hits = await store.searchDense(queryAt(q), K, FILTER);
    lat.push(now() - t);
    found.push(hits.map(rowOf));
  }
  return { lat, recall: exactFor(n).recall((q) => found[q]!) };
}

async function measure(store: RetrievalStore, n: number): Promise<Measured> {
  const { lat, recall } = await denseQueries(store, n);
  let lexical: number[] | null = null;
  let hybrid: number[] | null = null;
  if (HYBRID) {
    lexical = [];
    hybrid = [];
    for (let q = 0; q < QUERIES; q++) {
      const text = set.lexicalQuery(q, queries.clusters[q]!);
      let t = now();
      await store.searchLexical(text, K, FILTER);
      lexical.push(now() - t);
      t = now();
      const [dense, lex] = [await store.searchDense(queryAt(q), K, FILTER), await store.searchLexical(text, K, FILTER)];
      reciprocalRankFusion([{ items: dense, weight: 1 }, { items: lex, weight: 1 }], (h) => h.chunk.id, 60).slice(0, K);
      hybrid.push(now() - t);
    }
  }
  const ingest: number[] = [];
  for (let i = 0; i < INGESTS; i++) {
    const [doc] = documents(n + i * INGEST_CHUNKS, INGEST_CHUNKS, 'new');
    doc!.doc.docId = `new${i}`;
    const t = now();
    await store.addBatch([doc!]);
    ingest.push(now() - t);
  }
  const p = (xs: number[] | null, q: number) => (xs ? round(pct(xs, q)) : null);
  return {
    query_p50_ms: round(pct(lat, 50)), query_p95_ms: round(pct(lat, 95)), recall_at_10: round(recall, 4),
    lexical_p50_ms: p(lexical, 50), lexical_p95_ms: p(lexical, 95), hybrid_p50_ms: p(hybrid, 50), hybrid_p95_ms: p(hybrid, 95),
    ingest_p50_ms: round(pct(ingest, 50)), ingest_p95_ms: round(pct(ingest, 95)), ingest_max_ms: round(Math.max(...ingest)),
  };
}

/** Dense queries at each candidate-list size of the sweep, the store opened at each by `open`. */
async function efSweep(open: (ef: number) => Promise<RetrievalStore>, n: number): Promise<Record<string, number>[]> {
  const out: Record<string, number>[] = [];
  for (const ef of EF_SWEEP) {
    const store = await open(ef);
    try {
      const { lat, recall } = await denseQueries(store, n);
      const row = { ef_search: ef, query_p50_ms: round(pct(lat, 50)), query_p95_ms: round(pct(lat, 95)), recall_at_10: round(recall, 4) };
      log(`ef sweep ${n}: ${JSON.stringify(row)}`);
      out.push(row);
    } finally {
      await store.close();
    }
  }
  return out;
}

/**
 * Resident bytes once what is unreachable is freed: native buffers (a compaction's serialised index) are
 * freed by finalizers that run after a collection, so a few turns of the event loop follow each one.
 */
async function residentAfterCollection(): Promise<number> {
  for (let i = 0; i < 3; i++) {
    (globalThis as { gc?: () => void }).gc?.();
    await new Promise((r) => setImmediate(r));
  }
  trimMalloc();
  return process.memoryUsage().rss;
}

async function faissCase(n: number): Promise<Record<string, unknown>> {
  const dir = await mkdtemp(path.join(tmpdir(), 'ragguard-bench-scale-'));
  const opts = { annMin: cfg.faissAnnMin, efSearch: cfg.faissEfSearch, hnswM: cfg.faissHnswM, efConstruction: cfg.faissEfConstruction, logBytes: cfg.faissLogBytes };
  try {
    const baseline = await residentAfterCollection();
    let store = await FaissStore.open(dir, DIM, BM25, opts);
    const t0 = now();
    let waited = 0;
    for (let first = 0; first < n; first += BATCH) {
      await store.addBatch(documents(first, Math.min(BATCH, n - first)));
      const w = now();
      await store.idle();
      waited += now() - w;
      if ((first / BATCH) % 10 === 9) log(`faiss ${n}: ${first + BATCH} chunks in ${round((now() - t0) / 1000, 1)} s (${store.status.index})`);
    }
    const buildS = (now() - t0) / 1000;
    const status = store.status;
    const resident = (await residentAfterCollection()) - baseline;
    const predicted = store.residentBytes;
    const indexBytes = store.indexBytes;
    let lexicalBuildS: number | null = null;
    if (HYBRID) {
      const t = now();
      store.lexicalIndex();
      lexicalBuildS = round((now() - t) / 1000);
    }
    const m = await measure(store, n);
    await store.idle();
    // Restart: the snapshot read and verified, the log (the ingests) replayed, a first query answered.
    const t1 = now();
    await store.close();
    store = await FaissStore.open(dir, DIM, BM25, opts);
    await store.searchDense(queryAt(0), K, FILTER);
    const restartS = (now() - t1) / 1000;
    const after = store.status;
    await store.close();
    const sweep = await efSweep((ef) => FaissStore.open(dir, DIM, BM25, { ...opts, efSearch: ef }), n);
    return {
      store: 'faiss', chunks: n, build_s: round(buildS, 1), build_background_wait_s: round(waited / 1000, 1), index: status.index,
      ...m, restart_s: round(restartS), index_after_restart: after.index,
      rss_bytes: resident, predicted_bytes: predicted, index_bytes: indexBytes, snapshot_bytes: status.snapshotBytes,
      lexical_build_s: lexicalBuildS,
      settings: { ann_min: opts.annMin, ef_search: opts.efSearch, hnsw_m: opts.hnswM, ef_construction: opts.efConstruction, log_bytes: opts.logBytes },
      ...(sweep.length > 0 ? { ef_sweep: sweep } : {}),
    };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

async function postgresCase(server: PgServer, n: number): Promise<Record<string, unknown>> {
  const url = await server.database();
  // One collection: its own HNSW index (pg-collection-index.ts) is the whole table's, made here after
  // the load (collectionIndexRows Infinity: the store does not build it during the load).
  const opts = { bm25: BM25, efSearch: cfg.pgEfSearch, collectionIndexRows: Infinity };
  const indexName = collectionIndexName(FILTER.collection);
  let store = await PostgresStore.open(url, DIM, opts);
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const t0 = now();
    // The store's own index definition for the collection, made after the load.
    const indexdef = collectionIndexSql(client, FILTER.collection, { hnswM: cfg.pgHnswM, hnswEfConstruction: cfg.pgHnswEfConstruction }, false);
    for (let first = 0; first < n; first += BATCH) {
      await store.addBatch(documents(first, Math.min(BATCH, n - first)));
      if ((first / BATCH) % 10 === 9) log(`postgres ${n}: ${first + BATCH} chunks loaded in ${round((now() - t0) / 1000, 1)} s`);
    }
    const loadS = (now() - t0) / 1000;
    const t1 = now();
    await client.query(`SET maintenance_work_mem = '${PG_MAINTENANCE_MEM}'`);
    await client.query(`SET max_parallel_maintenance_workers = ${PG_WORKERS}`);
    await client.query(indexdef);
    await client.query('ANALYZE');
    const indexS = (now() - t1) / 1000;
    await client.query('CREATE EXTENSION IF NOT EXISTS pg_prewarm');
    await client.query('SELECT pg_prewarm($1)', [indexName]);
    const buildS = (now() - t0) / 1000;
    const m = await measure(store, n);
    const t2 = now();
    await store.close();
    store = await PostgresStore.open(url, DIM, opts);
    await store.searchDense(queryAt(0), K, FILTER);
    const restartS = (now() - t2) / 1000;
    const sweep = await efSweep((ef) => PostgresStore.open(url, DIM, { ...opts, efSearch: ef }), n);
    const sizes = (await client.query<Record<string, string>>(
      `SELECT current_setting('shared_buffers') AS shared_buffers,
              pg_relation_size($1) AS index_bytes,
              pg_total_relation_size('ragguard_chunks') AS chunks_bytes,
              pg_total_relation_size('ragguard_terms') AS terms_bytes,
              pg_database_size(current_database()) AS database_bytes`, [indexName])).rows[0]!;
    return {
      store: 'postgres', chunks: n, build_s: round(buildS, 1), load_s: round(loadS, 1), index_build_s: round(indexS, 1), index: 'hnsw',
      ...m, restart_s: round(restartS),
      shared_buffers: sizes['shared_buffers'], index_bytes: Number(sizes['index_bytes']), chunks_table_bytes: Number(sizes['chunks_bytes']),
      terms_table_bytes: Number(sizes['terms_bytes']), database_bytes: Number(sizes['database_bytes']),
      ...(sweep.length > 0 ? { ef_sweep: sweep } : {}),
      settings: { ef_search: cfg.pgEfSearch, maintenance_work_mem: PG_MAINTENANCE_MEM, max_parallel_maintenance_workers: PG_WORKERS, index: indexdef },
    };
  } finally {
    await client.end();
    await store.close();
  }
}

const cases: Record<string, unknown>[] = [];
let server: PgServer | undefined;
try {
  if (STORES.includes('postgres')) server = await startPostgres(process.env['BENCH_SCALE_PG_URL'], PG_SHARED_BUFFERS);
  for (const n of SIZES) {
    for (const kind of STORES) {
      log(`${kind}: ${n} chunks of ${DIM} dimensions`);
      const c = kind === 'faiss' ? await faissCase(n) : await postgresCase(server!, n);
      cases.push(c);
      console.log(JSON.stringify({ bench: 'scale', ...c }));
    }
    exactCache.delete(n);
  }
} finally {
  await server?.stop();
}

const largest = Math.max(...SIZES);
const goals = Object.fromEntries(STORES.map((kind) => {
  const c = cases.find((x) => x['store'] === kind && x['chunks'] === largest) as (Measured & Record<string, unknown>) | undefined;
  return [kind, c ? {
    chunks: largest,
    query_p95_le_30ms_at_recall_0_95: c.query_p95_ms <= 30 && c.recall_at_10 >= 0.95,
    ingest_p95_le_200ms: c.ingest_p95_ms <= 200,
  } : null];
}));
console.log(JSON.stringify({
  bench: 'scale', dims: DIM, sizes: SIZES, stores: STORES, queries: QUERIES, ingests: INGESTS,
  cases: cases.map((c) => ({
    store: c['store'], chunks: c['chunks'], build_s: c['build_s'], query_p50_ms: c['query_p50_ms'], query_p95_ms: c['query_p95_ms'],
    recall_at_10: c['recall_at_10'], hybrid_p95_ms: c['hybrid_p95_ms'], ingest_p50_ms: c['ingest_p50_ms'], ingest_p95_ms: c['ingest_p95_ms'],
    restart_s: c['restart_s'], rss_bytes: c['rss_bytes'] ?? null, index_bytes: c['index_bytes'] ?? null,
  })),
  goals_at_largest: goals,
}));
