/**
 * Scale, realistic mode (`npm run bench:scale-real`): the retrieval stores as a platform team runs them, not
 * as bench:scale flatters them (one collection, one client, Gaussian clusters, Postgres' HNSW built after
 * the load).
 *
 * - Text and vectors: the project's corpus (data/corpus) chunked and embedded once, as the server ingests
 *   it (embedDocument: the default embedder RAGGUARD_EMBEDDER, RAGGUARD_CHUNK_TOKENS / _OVERLAP; cached in
 *   .cache/bench-scale-real/ by a hash of the corpus, the questions, the embedder and the chunk settings).
 *   Every 10th chunk is held out (a query, never in a row); the others are the base chunks. Embedding
 *   BENCH_SCALE_REAL_SIZE (1000000) texts on 2 cores is too slow, so the rows are made by mixing base
 *   chunks: row r draws (a seeded generator of r alone) a base chunk A, another base chunk B and a weight
 *   w uniform in [0, BENCH_SCALE_REAL_MIX (0.3)); its text is A's words with a run of round(w x |A|) of
 *   them, at a random place, replaced by as many consecutive words of B (from a random place); its vector
 *   is normalise((1 - w) e(A) + w e(B) + BENCH_SCALE_REAL_NOISE (0.02) x N(0, I)) where e() is the real
 *   unit embedding (noise of norm about 0.39 in 384 dimensions: a row's cosine to e(A) is about 0.9).
 *   These vectors are not re-embedded texts: the geometry is that of the real embeddings, mixed.
 * - Collections: BENCH_SCALE_REAL_COLLECTIONS (100) tenants; documents of 10 rows, document d in
 *   collection c(d mod 100). Every search is filtered to one collection.
 * - Queries: the real questions (data/questions.json) embedded by the same embedder, and the held-out
 *   chunks' embeddings. BENCH_SCALE_REAL_PER_COLLECTION (16) queries per collection (pair p: collection
 *   p mod 100, vector p mod the number of query vectors), dense top 10.
 * - Load: the rows through the store's addBatch, BENCH_SCALE_REAL_BATCH (1000) rows a call. Postgres: each
 *   collection's own HNSW index (pg-collection-index.ts) built by the store in the background as the
 *   collection passes the threshold (CREATE INDEX CONCURRENTLY while the load goes on), then maintained
 *   online, row by row, as a live cluster's is; after the load, the wait for the builds still running
 *   (index_wait_s), then BENCH_SCALE_REAL_PG_STEPS (vacuum,none), each step followed by a measured window
 *   whose work beside the searches is recorded (checkpoints, WAL and its full-page images, autovacuum runs
 *   and the seconds a worker was seen, buffer hits and reads). vacuum: VACUUM (ANALYZE) then CHECKPOINT, as a
 *   bulk load calls for: otherwise the load's tail lands in the window (at 1M an insert-triggered autovacuum
 *   of ragguard_chunks and a checkpoint of the load's pages ran in it: p95 51.3 ms against 48.8 and 46.9 in
 *   the two windows after). none: the same state measured again; the figures are the last window's, the
 *   first one warming what a fresh server warms in its first minute (each connection's relation cache of a
 *   hundred partial indexes, V8's compiled code). analyze: ANALYZE only. faiss: as a server ingests (its log,
 *   compactions, the HNSW switch, each batch's insertion into the graph), waiting after each 10,000 rows for
 *   the background work.
 * - Measured: BENCH_SCALE_REAL_CLIENTS (16) query clients, each sending its next query when the last is
 *   answered, while one ingest client adds a document of 4 new rows (the same generator, in the collections
 *   in turn) per addBatch, back to back, for BENCH_SCALE_REAL_SECONDS (60) after BENCH_SCALE_REAL_WARMUP_S (5)
 *   unrecorded. A query's time runs from its issue (a turn of the event loop before the call, so that time
 *   spent queued behind the other clients' work in this process counts, as in a server) to its hits.
 *   The store is opened as the server opens it (RAGGUARD_PG_POOL_SIZE connections, RAGGUARD_PG_EF_SEARCH;
 *   RAGGUARD_FAISS_*): 16 clients share the pool.
 * - Recall@10 of each query against exact search (brute force) within its collection: the base rows
 *   (computed batch by batch as they are made) and the ingested documents acknowledged before the query
 *   was issued (a hit on one acknowledged later counts as a miss: at most one 4-row document is in flight).
 *   Per collection: the mean over its queries; reported: min, p5, median and mean over collections.
 *
 * Postgres: BENCH_SCALE_PG_URL, else a server started by scripts/postgres.sh (bench/pg-bench-server.ts) with
 * BENCH_SCALE_PG_SHARED_BUFFERS (a quarter of the machine's memory, PostgreSQL's usual start for a dedicated
 * server: at 1M the 2.0 GB of HNSW indexes and the rows they lead to stay in it; at 2GB the p99 was 270 ms
 * against 86) and BENCH_SCALE_PG_MAX_WAL_SIZE (4GB: the 1M database takes about 11 GB of disk beside its
 * WAL). Stores: BENCH_SCALE_REAL_STORES (postgres,faiss), one at a time.
 * Each store prints one JSON line; the last line of stdout sums them up with the goals: recall@10
 * >= 0.95 in every collection at query p95 <= 50 ms under the 16 clients, ingest p95 <= 200 ms. Run with
 * nice on a shared machine.
 */
import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir, totalmem } from 'node:os';
import path from 'node:path';
import pg from 'pg';
import { loadConfig } from '../src/config/config.js';
import { readCorpus } from '../src/retrieval/corpus.js';
import { Embedder } from '../src/retrieval/embedder.js';
import { FaissStore } from '../src/retrieval/faiss-store.js';
import { CHUNKS_PER_CANDIDATE, COLLECTION_INDEX_ROWS, EF_SEARCH_MIN } from '../src/retrieval/pg-collection-index.js';
import { denseStatement } from '../src/retrieval/pg-search.js';
import { PostgresStore } from '../src/retrieval/postgres-store.js';
import { searchSettingsSql } from '../src/retrieval/pg-search-settings.js';
import type { Hit, NewDocument, RetrievalStore } from '../src/retrieval/retrieval-store.js';
import { seededRandom } from '../src/generate/sampler.js';
import { embedDocument } from '../src/service/documents.js';
import { startPostgres, type PgServer } from './pg-bench-server.js';
import { ExactNeighbours, gaussian, normalizeRows } from './synthetic.js';

const ROOT = path.resolve(import.meta.dirname, '..');
const env = (name: string, dflt: string) => process.env[name] ?? dflt;
const SIZE = Number(env('BENCH_SCALE_REAL_SIZE', '1000000'));
const STORES = env('BENCH_SCALE_REAL_STORES', 'postgres,faiss').split(',') as ('faiss' | 'postgres')[];
const COLLECTIONS = Number(env('BENCH_SCALE_REAL_COLLECTIONS', '100'));
const PER_COLLECTION = Number(env('BENCH_SCALE_REAL_PER_COLLECTION', '16'));
const CLIENTS = Number(env('BENCH_SCALE_REAL_CLIENTS', '16'));
const SECONDS = Number(env('BENCH_SCALE_REAL_SECONDS', '60'));
const WARMUP_S = Number(env('BENCH_SCALE_REAL_WARMUP_S', '5'));
const BATCH = Number(env('BENCH_SCALE_REAL_BATCH', '1000'));
const MIX = Number(env('BENCH_SCALE_REAL_MIX', '0.3'));
const NOISE = Number(env('BENCH_SCALE_REAL_NOISE', '0.02'));
const PG_SHARED_BUFFERS = env('BENCH_SCALE_PG_SHARED_BUFFERS', `${Math.max(1, Math.round(totalmem() / 4 / 2 ** 30))}GB`);
const PG_MAX_WAL_SIZE = env('BENCH_SCALE_PG_MAX_WAL_SIZE', '4GB');
// Postgres: chunks past which a collection gets its own HNSW index (the store's COLLECTION_INDEX_ROWS;
// Infinity: every collection searched exactly, to compare).
const PG_INDEX_ROWS = Number(env('BENCH_SCALE_REAL_PG_INDEX_ROWS', String(COLLECTION_INDEX_ROWS)));
// Postgres: what is done after the load, each followed by a measured window (the figures are the last
// window's; with more than one, each window's too): analyze (ANALYZE), vacuum (VACUUM (ANALYZE), then
// CHECKPOINT), none (nothing: the same state measured again).
const PG_STEPS = env('BENCH_SCALE_REAL_PG_STEPS', 'vacuum,none').split(',').map((x) => {
  if (x !== 'analyze' && x !== 'vacuum' && x !== 'none') throw new Error(`BENCH_SCALE_REAL_PG_STEPS: unknown step "${x}" (analyze, vacuum, none)`);
  return x;
});
const CHUNKS_PER_DOC = 10;
const INGEST_CHUNKS = 4;
const HOLD_OUT_EVERY = 10;
const K = 10;
/** Documents made (and searched exactly) at a time: a multiple of the collections, so each collection's rows of it are consecutive. */
const GEN_DOCS = COLLECTIONS * Math.max(1, Math.round(1000 / COLLECTIONS));
const DOCS = SIZE / CHUNKS_PER_DOC;
if (!Number.isInteger(DOCS / COLLECTIONS)) throw new Error(`BENCH_SCALE_REAL_SIZE must be a multiple of ${CHUNKS_PER_DOC * COLLECTIONS}`);
if (BATCH % CHUNKS_PER_DOC !== 0) throw new Error(`BENCH_SCALE_REAL_BATCH must be a multiple of ${CHUNKS_PER_DOC}`);

const cfg = loadConfig(process.env);
const BM25 = { k1: cfg.bm25K1, b: cfg.bm25B };
const log = (s: string) => console.error(`[bench:scale-real] ${s}`);
const now = () => performance.now();
const round = (x: number, digits = 2) => Math.round(x * 10 ** digits) / 10 ** digits;
const pct = (xs: readonly number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!;
};
const yieldLoop = () => new Promise<void>((r) => setImmediate(r));

// ---- The real chunks and queries, embedded once ----

interface RealChunk { title: string; text: string }
interface RealSet {
  dim: number;
  base: RealChunk[];
  baseVectors: Float32Array;
  /** Query vectors: the questions', then the held-out chunks'. */
  queryVectors: Float32Array;
  questions: number;
  heldOut: number;
}

async function realSet(): Promise<RealSet> {
  const docs = await readCorpus(cfg.corpusDir);
  const questions = (JSON.parse(await readFile(path.join(ROOT, 'data', 'questions.json'), 'utf8')) as { question: string }[]).map((q) => q.question);
  const hash = createHash('sha256');
  hash.update(JSON.stringify([cfg.embedderPath, cfg.chunkTokens, cfg.chunkOverlapTokens, questions, docs]));
  const cacheFile = path.join(ROOT, '.cache', 'bench-scale-real', `${hash.digest('hex').slice(0, 16)}.json`);
  type Cached = { dim: number; chunks: RealChunk[]; vectors: string; questionVectors: string };
  let cached: Cached | undefined;
  try {
    cached = JSON.parse(await readFile(cacheFile, 'utf8')) as Cached;
    log(`embeddings from ${path.relative(ROOT, cacheFile)}`);
  } catch {
    const t = now();
    const embedder = await Embedder.load(cfg.embedderPath, cfg.providers.embedder, { webgpuBufferCache: cfg.webgpuBufferCache });
    const chunks: RealChunk[] = [];
    const parts: Float32Array[] = [];
    for (const d of docs) {
      const e = await embedDocument(embedder, cfg, { docId: d.docId, title: d.title, text: d.text });
      e.spans.forEach((s) => chunks.push({ title: d.title, text: s.text }));
      parts.push(e.vectors);
    }
    const qv: Float32Array[] = [];
    for (let i = 0; i < questions.length; i += 32) qv.push(await embedder.embed(questions.slice(i, i + 32)));
    const cat = (xs: Float32Array[]) => {
      const out = new Float32Array(xs.reduce((n, x) => n + x.length, 0));
      let o = 0;
      for (const x of xs) { out.set(x, o); o += x.length; }
      return out;
    };
    const b64 = (x: Float32Array) => Buffer.from(x.buffer, x.byteOffset, x.byteLength).toString('base64');
    cached = { dim: embedder.dimension, chunks, vectors: b64(cat(parts)), questionVectors: b64(cat(qv)) };
    await mkdir(path.dirname(cacheFile), { recursive: true });
    await writeFile(cacheFile, JSON.stringify(cached));
    log(`embedded ${chunks.length} chunks of ${docs.length} documents and ${questions.length} questions in ${round((now() - t) / 1000, 1)} s`);
  }
  const f32 = (s: string) => { const b = Buffer.from(s, 'base64'); return new Float32Array(b.buffer, b.byteOffset, b.byteLength / 4).slice(); };
  const { dim } = cached;
  const all = f32(cached.vectors);
  const base: RealChunk[] = [];
  const baseParts: number[] = [];
  const held: number[] = [];
  cached.chunks.forEach((c, i) => {
    if (i % HOLD_OUT_EVERY === HOLD_OUT_EVERY - 1) held.push(i);
    else { base.push(c); baseParts.push(i); }
  });
  const rowsOf = (idx: number[]) => {
    const out = new Float32Array(idx.length * dim);
    idx.forEach((i, j) => out.set(all.subarray(i * dim, (i + 1) * dim), j * dim));
    return out;
  };
  const qv = f32(cached.questionVectors);
  const queryVectors = new Float32Array(qv.length + held.length * dim);
  queryVectors.set(qv);
  queryVectors.set(rowsOf(held), qv.length);
  return { dim, base, baseVectors: rowsOf(baseParts), queryVectors, questions: qv.length / dim, heldOut: held.length };
}

const real = await realSet();
const DIM = real.dim;
const baseWords = real.base.map((c) => c.text.split(/\s+/).filter(Boolean));
const NQV = real.questions + real.heldOut;
log(`${real.base.length} base chunks, ${real.heldOut} held out, ${real.questions} questions; ${SIZE} rows in ${COLLECTIONS} collections`);

// ---- Rows: mixed real chunks ----

interface Row { title: string; text: string }

/** Rows [first, first + n): their texts and unit vectors (row r depends on r alone). */
function makeRows(first: number, n: number): { rows: Row[]; vectors: Float32Array } {
  const rows: Row[] = [];
  const vectors = new Float32Array(n * DIM);
  const nb = real.base.length;
  for (let i = 0; i < n; i++) {
    const r = first + i;
    const next = seededRandom((Math.imul(r + 1, 0x9e3779b1) ^ 0x5eed5ca1) >>> 0);
    const a = Math.floor(next() * nb);
    let b = Math.floor(next() * (nb - 1));
    if (b >= a) b++;
    const w = MIX * next();
    const wa = baseWords[a]!;
    const wb = baseWords[b]!;
    const m = Math.min(wb.length, wa.length, Math.round(w * wa.length));
    const at = Math.floor(next() * (wa.length - m + 1));
    const from = Math.floor(next() * (wb.length - m + 1));
    rows.push({ title: real.base[a]!.title, text: [...wa.slice(0, at), ...wb.slice(from, from + m), ...wa.slice(at + m)].join(' ') });
    const g = gaussian(next);
    const o = i * DIM;
    for (let j = 0; j < DIM; j++) {
      vectors[o + j] = (1 - w) * real.baseVectors[a * DIM + j]! + w * real.baseVectors[b * DIM + j]! + NOISE * g();
    }
  }
  normalizeRows(vectors, DIM);
  return { rows, vectors };
}

const collectionOf = (doc: number) => doc % COLLECTIONS;
const collectionName = (c: number) => `c${c}`;

/** Base documents [d0, d0 + n), rows 10d..10d+9 each. */
function baseDocuments(d0: number, n: number, made: { rows: Row[]; vectors: Float32Array }): NewDocument[] {
  return Array.from({ length: n }, (_, i) => {
    const d = d0 + i;
    const rows = made.rows.slice(i * CHUNKS_PER_DOC, (i + 1) * CHUNKS_PER_DOC);
    return {
      doc: { docId: `d${d}`, title: rows[0]!.title, bytes: rows.reduce((s, r) => s + Buffer.byteLength(r.text), 0), collection: collectionName(collectionOf(d)) },
      chunks: rows.map((r) => ({ text: r.text, tokens: Math.ceil(r.text.length / 4) })),
      vectors: made.vectors.subarray(i * CHUNKS_PER_DOC * DIM, (i + 1) * CHUNKS_PER_DOC * DIM),
    };
  });
}

/** The i-th ingested document: 4 new rows (after the base ones), in collection i mod 100. */
function ingestDocument(i: number): NewDocument {
  const made = makeRows(SIZE + i * INGEST_CHUNKS, INGEST_CHUNKS);
  return {
    doc: { docId: `n${i}`, title: made.rows[0]!.title, bytes: made.rows.reduce((s, r) => s + Buffer.byteLength(r.text), 0), collection: collectionName(i % COLLECTIONS) },
    chunks: made.rows.map((r) => ({ text: r.text, tokens: Math.ceil(r.text.length / 4) })),
    vectors: made.vectors,
  };
}

/**
 * A hit as a key of its collection: a base row by its place among the collection's rows (document d's
 * row j is row floor(d / 100) x 10 + j of collection d mod 100), an ingested row as -(4i + j + 1).
 */
function keyOf(h: Hit): number {
  const id = h.chunk.docId;
  const n = Number(id.slice(1));
  return id[0] === 'd' ? Math.floor(n / COLLECTIONS) * CHUNKS_PER_DOC + h.chunk.ord : -(n * INGEST_CHUNKS + h.chunk.ord + 1);
}

// ---- Queries and their exact neighbours per collection ----

const PAIRS = COLLECTIONS * PER_COLLECTION;
const pairCollection = (p: number) => p % COLLECTIONS;
const pairVector = (p: number) => p % NQV;
const queryOf = (p: number) => real.queryVectors.subarray(pairVector(p) * DIM, (pairVector(p) + 1) * DIM);
/** Collection c's queries are the pairs c + 100j, j < 16: local query j. */
const exact = Array.from({ length: COLLECTIONS }, (_, c) => {
  const qs = new Float32Array(PER_COLLECTION * DIM);
  for (let j = 0; j < PER_COLLECTION; j++) qs.set(queryOf(c + COLLECTIONS * j), j * DIM);
  return new ExactNeighbours(qs, DIM, K);
});

/** Adds a generated batch of documents [d0, d0 + n) to the exact search of each collection. */
function addExact(d0: number, n: number, vectors: Float32Array): void {
  const per = n / COLLECTIONS;
  const rows = per * CHUNKS_PER_DOC;
  for (let c = 0; c < COLLECTIONS; c++) {
    const mine = new Float32Array(rows * DIM);
    for (let k = 0; k < per; k++) {
      const i = c + k * COLLECTIONS; // the batch's document d0 + i
      mine.set(vectors.subarray(i * CHUNKS_PER_DOC * DIM, (i + 1) * CHUNKS_PER_DOC * DIM), k * CHUNKS_PER_DOC * DIM);
    }
    exact[c]!.add(mine, (d0 / COLLECTIONS) * CHUNKS_PER_DOC);
  }
}

let exactDone = false;

/** Loads the base rows through addBatch; `after` runs after each generated batch (faiss: its background work). */
async function load(store: RetrievalStore, tag: string, after?: () => Promise<void>): Promise<{ load_s: number; rows_per_s: number }> {
  const t0 = now();
  let lastLog = t0;
  for (let d0 = 0; d0 < DOCS; d0 += GEN_DOCS) {
    const n = Math.min(GEN_DOCS, DOCS - d0);
    const made = makeRows(d0 * CHUNKS_PER_DOC, n * CHUNKS_PER_DOC);
    if (!exactDone) addExact(d0, n, made.vectors);
    const docs = baseDocuments(d0, n, made);
    for (let i = 0; i < docs.length; i += BATCH / CHUNKS_PER_DOC) await store.addBatch(docs.slice(i, i + BATCH / CHUNKS_PER_DOC));
    await after?.();
    if (now() - lastLog > 30_000 || d0 + n === DOCS) {
      lastLog = now();
      const rows = (d0 + n) * CHUNKS_PER_DOC;
      const s = (now() - t0) / 1000;
      log(`${tag}: ${rows} rows in ${round(s, 1)} s (${round(rows / s, 0)} rows/s; ${SIZE} at this rate: ${round((SIZE * s) / rows / 60, 1)} min)`);
    }
  }
  exactDone = true;
  const s = (now() - t0) / 1000;
  return { load_s: round(s, 1), rows_per_s: round(SIZE / s, 0) };
}

interface QueryRecord { pair: number; acked: number; keys: number[] }

/** 16 query clients and one ingest client at once: latencies, and each query's hits for recall. */
async function measure(store: RetrievalStore, ingested: Float32Array[] = []): Promise<Record<string, unknown>> {
  const t0 = now();
  const recordFrom = t0 + WARMUP_S * 1000;
  const end = recordFrom + SECONDS * 1000;
  let acked = ingested.length;
  let nextPair = 0;
  const queryMs: number[] = [];
  const records: QueryRecord[] = [];
  const ingestMs: number[] = [];
  let warmQueries = 0;
  const client = async () => {
    while (now() < end) {
      const pair = nextPair++ % PAIRS;
      const at = acked;
      const t = now();
      await yieldLoop();
      const hits = await store.searchDense(queryOf(pair), K, { collection: collectionName(pairCollection(pair)) });
      const ms = now() - t;
      if (t >= recordFrom) {
        queryMs.push(ms);
        records.push({ pair, acked: at, keys: hits.map(keyOf) });
      } else warmQueries++;
    }
  };
  const ingester = async () => {
    for (let i = ingested.length; now() < end; i++) {
      const doc = ingestDocument(i);
      const t = now();
      await yieldLoop();
      await store.addBatch([doc]);
      const ms = now() - t;
      ingested.push(doc.vectors as Float32Array);
      acked = i + 1;
      if (t >= recordFrom) ingestMs.push(ms);
    }
  };
  await Promise.all([...Array.from({ length: CLIENTS }, client), ingester()]);

  // Recall@10 of each recorded query within its collection: base rows and the ingests acknowledged before it.
  const perCollection = Array.from({ length: COLLECTIONS }, () => ({ hit: 0, n: 0 }));
  const byKind = { question: { hit: 0, n: 0 }, held_out: { hit: 0, n: 0 } };
  /** Per pair: its collection's ingested rows scored, by ingest number. */
  const ingestScores = new Map<number, { key: number; doc: number; score: number }[]>();
  const scoresFor = (pair: number) => {
    let s = ingestScores.get(pair);
    if (!s) {
      s = [];
      const q = queryOf(pair);
      for (let i = pairCollection(pair); i < ingested.length; i += COLLECTIONS) {
        const v = ingested[i]!;
        for (let j = 0; j < INGEST_CHUNKS; j++) {
          let dot = 0;
          for (let x = 0; x < DIM; x++) dot += q[x]! * v[j * DIM + x]!;
          s.push({ key: -(i * INGEST_CHUNKS + j + 1), doc: i, score: dot });
        }
      }
      s.sort((a, b) => b.score - a.score);
      ingestScores.set(pair, s);
    }
    return s;
  };
  for (const r of records) {
    const c = pairCollection(r.pair);
    const base = exact[c]!.scored(Math.floor(r.pair / COLLECTIONS) % PER_COLLECTION);
    const extra = scoresFor(r.pair).filter((x) => x.doc < r.acked).slice(0, K);
    const ref = new Set([...base.map((b) => ({ key: b.row, score: b.score })), ...extra].sort((a, b) => b.score - a.score).slice(0, K).map((x) => x.key));
    const hit = r.keys.slice(0, K).filter((k) => ref.has(k)).length;
    perCollection[c]!.hit += hit;
    perCollection[c]!.n += K;
    const kind = pairVector(r.pair) < real.questions ? byKind.question : byKind.held_out;
    kind.hit += hit;
    kind.n += K;
  }
  const recalls = perCollection.filter((x) => x.n > 0).map((x) => x.hit / x.n);
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  return {
    seconds: SECONDS, clients: CLIENTS, queries: queryMs.length, warmup_queries: warmQueries, queries_per_s: round(queryMs.length / SECONDS, 1),
    query_p50_ms: round(pct(queryMs, 50)), query_p95_ms: round(pct(queryMs, 95)), query_p99_ms: round(pct(queryMs, 99)), query_max_ms: round(Math.max(...queryMs)),
    recall_at_10_min: round(Math.min(...recalls), 4), recall_at_10_p5: round(pct(recalls, 5), 4),
    recall_at_10_median: round(pct(recalls, 50), 4), recall_at_10_mean: round(mean(recalls), 4),
    recall_at_10_questions: round(byKind.question.hit / byKind.question.n, 4), recall_at_10_held_out: round(byKind.held_out.hit / byKind.held_out.n, 4),
    collections_measured: recalls.length,
    ingests: ingestMs.length, ingests_total: ingested.length, ingest_p50_ms: round(pct(ingestMs, 50)), ingest_p95_ms: round(pct(ingestMs, 95)),
    ingest_max_ms: round(Math.max(...ingestMs)),
  };
}

/** Postgres' counters of the work beside the searches: buffer hits and reads, checkpoints, WAL, autovacuum runs. */
async function background(client: pg.Client): Promise<Record<string, number>> {
  const r = (await client.query<Record<string, string>>(
    `SELECT (SELECT blks_hit FROM pg_stat_database WHERE datname = current_database()) AS hits,
            (SELECT blks_read FROM pg_stat_database WHERE datname = current_database()) AS reads,
            (SELECT num_done FROM pg_stat_checkpointer) AS checkpoints,
            (SELECT buffers_written FROM pg_stat_checkpointer) AS checkpoint_buffers,
            (SELECT wal_bytes FROM pg_stat_wal) AS wal_bytes, (SELECT wal_fpi FROM pg_stat_wal) AS wal_fpi,
            (SELECT coalesce(sum(autovacuum_count), 0) FROM pg_stat_user_tables) AS autovacuums,
            (SELECT coalesce(sum(autoanalyze_count), 0) FROM pg_stat_user_tables) AS autoanalyzes`)).rows[0]!;
  return Object.fromEntries(Object.entries(r).map(([k, v]) => [k, Number(v)]));
}

function backgroundDelta(a: Record<string, number>, b: Record<string, number>): Record<string, number> {
  const d = (k: string) => b[k]! - a[k]!;
  return {
    buffer_hits: d('hits'), buffer_reads: d('reads'), buffer_hit_ratio: round(d('hits') / Math.max(1, d('hits') + d('reads')), 4),
    checkpoints_done: d('checkpoints'), checkpoint_buffers_written: d('checkpoint_buffers'), wal_mb: round(d('wal_bytes') / 2 ** 20, 1),
    wal_full_page_images: d('wal_fpi'), autovacuums_done: d('autovacuums'), autoanalyzes_done: d('autoanalyzes'),
  };
}

/** Once a second until stopped: what autovacuum workers run, and whether the checkpointer is writing. */
function watchBackground(client: pg.Client): { stop(): Promise<Record<string, unknown>> } {
  let stopped = false;
  let samples = 0;
  let autovacuum = 0;
  let checkpointing = 0;
  const work = new Set<string>();
  const done = (async () => {
    while (!stopped) {
      const rows = (await client.query<{ backend_type: string; query: string | null; wait_event: string | null }>(
        `SELECT backend_type, query, wait_event FROM pg_stat_activity WHERE backend_type IN ('autovacuum worker', 'checkpointer')`)).rows;
      samples++;
      const workers = rows.filter((r) => r.backend_type === 'autovacuum worker' && r.query);
      if (workers.length > 0) autovacuum++;
      for (const w of workers) work.add(w.query!.replace(/^autovacuum: /, ''));
      if (rows.some((r) => r.backend_type === 'checkpointer' && r.wait_event !== 'CheckpointerMain')) checkpointing++;
      await new Promise((r) => setTimeout(r, 1000));
    }
  })();
  return {
    async stop() {
      stopped = true;
      await done;
      return { samples, autovacuum_samples: autovacuum, autovacuum_work: [...work].join('; '), checkpointer_busy_samples: checkpointing };
    },
  };
}

async function postgresCase(server: PgServer): Promise<Record<string, unknown>> {
  const url = await server.database();
  const store = await PostgresStore.open(url, DIM, {
    bm25: BM25, efSearch: cfg.pgEfSearch, poolSize: cfg.pgPoolSize, statementTimeoutMs: cfg.pgStatementTimeoutMs, collectionIndexRows: PG_INDEX_ROWS,
    hnswM: cfg.pgHnswM, hnswEfConstruction: cfg.pgHnswEfConstruction,
  });
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const loaded = await load(store, 'postgres');
    const t = now();
    await store.indexesBuilt();
    const indexWaitS = (now() - t) / 1000;
    // The plan a filtered search gets: the store's own statement, its settings (ef_search by c7's size), a real query vector.
    const planOf = async () => {
      await client.query(`BEGIN; ${searchSettingsSql({ efSearch: cfg.pgEfSearch, statementTimeoutMs: cfg.pgStatementTimeoutMs, collection: 'c7' })}`);
      const probe = denseStatement(real.queryVectors.subarray(0, DIM), K, { collection: 'c7' });
      const rows = (await client.query<{ 'QUERY PLAN': string }>(`EXPLAIN ${probe}`)).rows;
      await client.query('COMMIT');
      return rows.map((r) => r['QUERY PLAN'].trim()).filter((l) => /Scan|Limit|Sort/.test(l))
        .map((l) => l.replace(/\(cost=[^)]*\)/, '').replace(/'\[[^\]]*\]'/g, '$q')).join(' | ');
    };
    const ingested: Float32Array[] = [];
    const windows: Record<string, unknown>[] = [];
    for (const step of PG_STEPS) {
      const t1 = now();
      if (step === 'analyze') await client.query('ANALYZE');
      else if (step === 'vacuum') {
        await client.query('VACUUM (ANALYZE)');
        await client.query('CHECKPOINT');
      }
      const settleS = (now() - t1) / 1000;
      const before = await background(client);
      const seen = watchBackground(client);
      const m = await measure(store, ingested);
      const samples = await seen.stop();
      await new Promise((r) => setTimeout(r, 1500)); // backends flush their counts within a second of going idle
      const after = await background(client);
      const delta = backgroundDelta(before, after);
      windows.push({ step, settle_s: round(settleS, 1), ...m, ...delta, ...samples });
      log(`postgres: after ${step} (${round(settleS, 1)} s): p50 ${m['query_p50_ms']} ms, p95 ${m['query_p95_ms']} ms, ${m['queries_per_s']} queries/s; `
        + `autovacuum seen in ${samples['autovacuum_samples']} of ${samples['samples']} s (${samples['autovacuum_work']}), ${JSON.stringify(delta)}`);
    }
    const last = windows[windows.length - 1]!;
    // Probed once, after the windows: the plan the measured searches ended on.
    const plan = await planOf();
    // Whether the shared memory is on huge pages (PostgreSQL takes them where the kernel has enough reserved:
    // huge_pages=try), and the page size under the buffer mapping table and the HNSW pages a search reads.
    const hugePages = (await client.query<{ huge_pages_status: string }>('SHOW huge_pages_status')).rows[0]!.huge_pages_status;
    const sizes = (await client.query<Record<string, string>>(
      `SELECT (SELECT coalesce(sum(pg_relation_size(i.indexrelid)), 0) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               WHERE i.indrelid = 'ragguard_chunks'::regclass AND c.relname LIKE 'ragguard_chunks_hnsw_%') AS index_bytes,
              (SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               WHERE i.indrelid = 'ragguard_chunks'::regclass AND i.indisvalid AND c.relname LIKE 'ragguard_chunks_hnsw_%') AS indexes,
              pg_total_relation_size('ragguard_chunks') AS chunks_bytes,
              pg_total_relation_size('ragguard_terms') AS terms_bytes, pg_database_size(current_database()) AS database_bytes`)).rows[0]!;
    return {
      store: 'postgres', rows: SIZE, collections: COLLECTIONS, ...loaded, index_wait_s: round(indexWaitS, 1), ...last, plan,
      ...(windows.length > 1 ? { windows } : {}),
      collection_indexes: Number(sizes['indexes']), index_bytes: Number(sizes['index_bytes']), chunks_table_bytes: Number(sizes['chunks_bytes']),
      terms_table_bytes: Number(sizes['terms_bytes']), database_bytes: Number(sizes['database_bytes']),
      settings: {
        ef_search: cfg.pgEfSearch, collection_ef_search: `chunks / ${CHUNKS_PER_CANDIDATE} within [${EF_SEARCH_MIN}, ${cfg.pgEfSearch}]`, index_rows: PG_INDEX_ROWS, pool_size: cfg.pgPoolSize, hnsw_m: cfg.pgHnswM, ef_construction: cfg.pgHnswEfConstruction, shared_buffers: PG_SHARED_BUFFERS, huge_pages: hugePages,
        max_wal_size: PG_MAX_WAL_SIZE, index: 'an HNSW index per collection past COLLECTION_INDEX_ROWS (partial, WHERE collection = ...)',
      },
    };
  } finally {
    await client.end();
    await store.close();
  }
}

async function faissCase(): Promise<Record<string, unknown>> {
  const dir = await mkdtemp(path.join(tmpdir(), 'ragguard-bench-scale-real-'));
  const opts = { annMin: cfg.faissAnnMin, efSearch: cfg.faissEfSearch, hnswM: cfg.faissHnswM, efConstruction: cfg.faissEfConstruction, logBytes: cfg.faissLogBytes };
  const store = await FaissStore.open(dir, DIM, BM25, opts);
  try {
    const loaded = await load(store, 'faiss', () => store.idle());
    const m = await measure(store);
    await store.idle();
    return {
      store: 'faiss', rows: SIZE, collections: COLLECTIONS, ...loaded, ...m, index: store.status.index, index_bytes: store.indexBytes,
      settings: { ann_min: opts.annMin, ef_search: opts.efSearch, hnsw_m: opts.hnswM, ef_construction: opts.efConstruction, log_bytes: opts.logBytes },
    };
  } finally {
    await store.close();
    await rm(dir, { recursive: true, force: true });
  }
}

const cases: Record<string, unknown>[] = [];
let server: PgServer | undefined;
try {
  if (STORES.includes('postgres')) server = await startPostgres(process.env['BENCH_SCALE_PG_URL'], PG_SHARED_BUFFERS, PG_MAX_WAL_SIZE);
  for (const kind of STORES) {
    log(`${kind}: ${SIZE} rows of ${DIM} dimensions in ${COLLECTIONS} collections, ${CLIENTS} clients + 1 ingest client for ${SECONDS} s`);
    const c = kind === 'faiss' ? await faissCase() : await postgresCase(server!);
    cases.push(c);
    console.log(JSON.stringify({ bench: 'scale-real', ...c }));
  }
} finally {
  await server?.stop();
}

console.log(JSON.stringify({
  bench: 'scale-real', rows: SIZE, dims: DIM, collections: COLLECTIONS, clients: CLIENTS, seconds: SECONDS,
  base_chunks: real.base.length, held_out_chunks: real.heldOut, questions: real.questions, mix: MIX, noise: NOISE,
  cases: cases.map((c) => ({
    store: c['store'], load_s: c['load_s'], query_p50_ms: c['query_p50_ms'], query_p95_ms: c['query_p95_ms'], queries_per_s: c['queries_per_s'],
    recall_at_10_min: c['recall_at_10_min'], recall_at_10_p5: c['recall_at_10_p5'], recall_at_10_median: c['recall_at_10_median'],
    ingest_p50_ms: c['ingest_p50_ms'], ingest_p95_ms: c['ingest_p95_ms'],
  })),
  goals: Object.fromEntries(cases.map((c) => [c['store'], {
    rows: SIZE,
    recall_ge_0_95_every_collection_at_p95_le_50ms: (c['recall_at_10_min'] as number) >= 0.95 && (c['query_p95_ms'] as number) <= 50,
    ingest_p95_le_200ms: (c['ingest_p95_ms'] as number) <= 200,
  }])),
}));
