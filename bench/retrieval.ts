/**
 * Retrieval benchmark: data/questions.json over data/corpus, indexed exactly as the server does it
 * (loadConfig + RagService.start on a fresh temporary index dir).
 *
 * Methods, all scored on whether the answering doc_id is among the documents of the top-k chunk hits:
 *   embedder         shipped embedder + faiss (recall@1, recall@5, MRR@10)
 *   bm25             Okapi BM25 (k1 1.2, b 0.75) over the same chunks, "title\ntext" (recall@1, recall@5, MRR@10)
 *   embedder_rerank  top-20 from the embedder, reranked by the cross-encoder, top-5 (recall@5)
 * MRR@10 uses the rank of the first of the top-10 chunk hits that belongs to the answering document.
 *
 * The stores side by side (the same chunks and vectors in each, searched through the service's Retriever):
 * dense, lexical (the store's BM25) and hybrid R@5 on the faiss store and, when RAGGUARD_STORE is a
 * postgres:// URL, on the Postgres store there (in a collection of its own, removed at the end). The
 * issue's goal: Postgres' R@5 within 0.01 of faiss'.
 *
 * Prints a table, then one JSON object as the last line of stdout.
 */
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { loadConfig } from '../src/config/config.js';
import { RagService, readCorpus } from '../src/service/rag.js';
import { embedDocument } from '../src/service/documents.js';
import { FaissStore } from '../src/retrieval/faiss-store.js';
import { PostgresStore } from '../src/retrieval/postgres-store.js';
import type { RetrievalStore, SearchFilter } from '../src/retrieval/retrieval-store.js';
import { Retriever } from '../src/retrieval/retriever.js';
import type { Config } from '../src/config/config.js';
import type { Embedder } from '../src/retrieval/embedder.js';
import { Bm25 } from './bm25.js';

const ROOT = path.resolve(import.meta.dirname, '..');
const K = 5;
const MRR_K = 10;
const RERANK_FROM = 20;
const GOAL_RECALL_AT_5 = 0.8;

interface Question {
  id: string;
  question: string;
  doc_id: string;
  answer: string;
}

function parseQuestions(raw: unknown): Question[] {
  if (!Array.isArray(raw)) throw new Error('questions.json: expected an array');
  return raw.map((q: unknown, i) => {
    const o = (q ?? {}) as Record<string, unknown>;
    for (const key of ['id', 'question', 'doc_id', 'answer'] as const) {
      if (typeof o[key] !== 'string') throw new Error(`questions.json[${i}]: '${key}' must be a string`);
    }
    return { id: o['id'] as string, question: o['question'] as string, doc_id: o['doc_id'] as string, answer: o['answer'] as string };
  });
}

/** 1-based rank of the first entry equal to `want`, or 0 when absent. */
const firstRank = (docIds: readonly string[], want: string): number => docIds.indexOf(want) + 1;

class Tally {
  private r1 = 0;
  private r5 = 0;
  private rr = 0;
  private n = 0;
  private ms = 0;

  /** `rank`: 1-based rank of the first correct hit among the top MRR_K (0 = none); `ms`: query latency. */
  add(rank: number, ms = 0): void {
    this.n++;
    this.ms += ms;
    if (rank === 1) this.r1++;
    if (rank >= 1 && rank <= K) this.r5++;
    if (rank >= 1 && rank <= MRR_K) this.rr += 1 / rank;
  }

  get recallAt1(): number { return this.r1 / this.n; }
  get recallAt5(): number { return this.r5 / this.n; }
  get mrrAt10(): number { return this.rr / this.n; }
  get meanMs(): number { return this.ms / this.n; }
}

const round = (x: number, d = 4) => Math.round(x * 10 ** d) / 10 ** d;
const fmt = (x: number) => x.toFixed(4);

async function main(): Promise<void> {
  const questions = parseQuestions(JSON.parse(await readFile(path.join(ROOT, 'data', 'questions.json'), 'utf8')));
  const indexDir = await mkdtemp(path.join(tmpdir(), 'ragguard-bench-'));
  try {
    // The service on the embedded store; the Postgres one (RAGGUARD_STORE) is compared below.
    const pgUrl = /^postgres(ql)?:\/\//.test(process.env['RAGGUARD_STORE'] ?? '') ? process.env['RAGGUARD_STORE']! : undefined;
    const cfg = loadConfig({ ...process.env, RAGGUARD_INDEX_DIR: indexDir, RAGGUARD_CORPUS_DIR: 'data/corpus', RAGGUARD_STORE: 'faiss' });
    let t = performance.now();
    const service = await RagService.start(cfg);
    const startMs = performance.now() - t;
    const { models } = service;
    const store = service.store as FaissStore;
    const { embedder, reranker } = models;
    if (store.documentCount === 0 || store.chunkCount === 0) throw new Error(`nothing was ingested from ${cfg.corpusDir}`);

    const missing = questions.filter((q) => !store.has(q.doc_id));
    if (missing.length) throw new Error(`questions name unknown documents: ${missing.map((q) => `${q.id}:${q.doc_id}`).join(', ')}`);

    // BM25 over exactly the indexed chunks, with the text the embedder saw.
    const title = (docId: string) => store.document(docId)!.title;
    const chunkDoc: string[] = [];
    const texts: string[] = [];
    for (const c of store.allChunks()) {
      chunkDoc.push(c.docId);
      texts.push(`${c.title}\n${c.text}`);
    }
    t = performance.now();
    const bm25 = new Bm25(texts, { k1: 1.2, b: 0.75 });
    const bm25BuildMs = performance.now() - t;

    // Warm-up (first ONNX runs allocate), not timed.
    store.search(await embedder.embed([questions[0]!.question]), MRR_K);
    bm25.search(questions[0]!.question, MRR_K);

    const emb = new Tally();
    const lex = new Tally();
    const rer = new Tally();
    let rerankMs = 0;
    const misses: string[] = [];
    for (const q of questions) {
      t = performance.now();
      const vec = await embedder.embed([q.question]);
      const hits = store.search(vec, MRR_K);
      const embMs = performance.now() - t;
      const embRank = firstRank(hits.map((h) => h.chunk.docId), q.doc_id);
      emb.add(embRank, embMs);

      t = performance.now();
      const lexHits = bm25.search(q.question, MRR_K);
      const lexMs = performance.now() - t;
      const lexRank = firstRank(lexHits.map((h) => chunkDoc[h.index]!), q.doc_id);
      lex.add(lexRank, lexMs);

      t = performance.now();
      const pool = store.search(vec, RERANK_FROM);
      const { scores } = await reranker.score(q.question, pool.map((h) => `${title(h.chunk.docId)}\n${h.chunk.text}`));
      const reranked = pool
        .map((hit, i) => ({ hit, score: scores[i]! }))
        .sort((a, b) => b.score - a.score)
        .slice(0, K);
      rerankMs += performance.now() - t;
      const rerRank = firstRank(reranked.map((r) => r.hit.chunk.docId), q.doc_id);
      rer.add(rerRank);

      if (embRank === 0 || embRank > K) misses.push(`${q.id}(${q.doc_id})`);
    }

    const n = questions.length;
    const rows: [string, string, string, string, string][] = [
      ['method', 'R@1', 'R@5', 'MRR@10', 'ms/query'],
      ['embedder', fmt(emb.recallAt1), fmt(emb.recallAt5), fmt(emb.mrrAt10), emb.meanMs.toFixed(2)],
      ['bm25', fmt(lex.recallAt1), fmt(lex.recallAt5), fmt(lex.mrrAt10), lex.meanMs.toFixed(2)],
      [`embedder+rerank (top-${RERANK_FROM})`, '-', fmt(rer.recallAt5), '-', `+${(rerankMs / n).toFixed(2)}`],
    ];
    const widths = rows[0]!.map((_, c) => Math.max(...rows.map((r) => r[c]!.length)));
    const line = (r: readonly string[]) => r.map((cell, c) => (c === 0 ? cell.padEnd(widths[c]!) : cell.padStart(widths[c]!))).join('  ');

    console.log(`retrieval benchmark: ${n} questions, ${store.documentCount} documents, ${store.chunkCount} chunks ` +
      `(${cfg.chunkTokens} tokens, overlap ${cfg.chunkOverlapTokens}); provider ${embedder.provider}`);
    console.log(`start + ingest ${(startMs / 1000).toFixed(1)} s; bm25 build ${bm25BuildMs.toFixed(0)} ms`);
    console.log('');
    console.log(line(rows[0]!));
    console.log(widths.map((w) => '-'.repeat(w)).join('  '));
    for (const r of rows.slice(1)) console.log(line(r));
    console.log('');
    console.log(`ms/query: embedder = embed + faiss search; bm25 = search; rerank = extra cost of scoring ${RERANK_FROM} passages`);
    const meets = emb.recallAt5 >= GOAL_RECALL_AT_5;
    console.log(`goal recall@5 >= ${GOAL_RECALL_AT_5}: ${meets ? 'met' : 'NOT met'}; embedder misses at 5 (${misses.length}): ${misses.join(' ')}`);

    const stores = await compareStores(cfg, embedder, store, pgUrl, questions);
    console.log('');
    console.log(`stores (R@5: dense / lexical / hybrid): faiss ${fmt(stores.faiss.dense_recall_at_5)} / ${fmt(stores.faiss.lexical_recall_at_5)} / ${fmt(stores.faiss.hybrid_recall_at_5)}` +
      (stores.postgres ? `; postgres ${fmt(stores.postgres.dense_recall_at_5)} / ${fmt(stores.postgres.lexical_recall_at_5)} / ${fmt(stores.postgres.hybrid_recall_at_5)}`
        : '; postgres not run (set RAGGUARD_STORE=postgres://... to compare)'));

    console.log(JSON.stringify({
      questions: n,
      documents: store.documentCount,
      chunks: store.chunkCount,
      recall_at_5: round(emb.recallAt5),
      bm25_recall_at_5: round(lex.recallAt5),
      embedder_rerank_recall_at_5: round(rer.recallAt5),
      recall_at_1: round(emb.recallAt1),
      bm25_recall_at_1: round(lex.recallAt1),
      mrr_at_10: round(emb.mrrAt10),
      bm25_mrr_at_10: round(lex.mrrAt10),
      embedder_ms_per_query: round(emb.meanMs),
      bm25_ms_per_query: round(lex.meanMs),
      rerank_ms_per_query: round(rerankMs / n),
      goal_recall_at_5: GOAL_RECALL_AT_5,
      meets_goal: meets,
      where: embedder.provider,
      faiss_store_recall_at_5: stores.faiss.hybrid_recall_at_5,
      postgres_store_recall_at_5: stores.postgres?.hybrid_recall_at_5 ?? null,
      postgres_minus_faiss_recall_at_5: stores.postgres ? round(stores.postgres.hybrid_recall_at_5 - stores.faiss.hybrid_recall_at_5) : null,
      stores,
    }));
  } finally {
    await rm(indexDir, { recursive: true, force: true });
  }
}

type StoreRecall = { dense_recall_at_5: number; lexical_recall_at_5: number; hybrid_recall_at_5: number; ms_per_query: number };

/** R@5 of each first-stage mode on a store, through the service's Retriever (the documents of the top-5 hits). */
async function storeRecall(cfg: Config, embedder: Embedder, store: RetrievalStore, filter: SearchFilter, questions: readonly Question[]): Promise<StoreRecall> {
  const modes = ['dense', 'lexical', 'hybrid'] as const;
  const hitsAt5 = { dense: 0, lexical: 0, hybrid: 0 };
  let ms = 0;
  for (const q of questions) {
    const qv = await embedder.embed([q.question]);
    for (const mode of modes) {
      const t = performance.now();
      const { hits } = await new Retriever(store, { ...cfg, retrieval: mode }).search(qv, q.question, K, filter);
      if (mode === 'hybrid') ms += performance.now() - t;
      if (hits.some((h) => h.chunk.docId === q.doc_id)) hitsAt5[mode]++;
    }
  }
  const n = questions.length;
  return {
    dense_recall_at_5: round(hitsAt5.dense / n), lexical_recall_at_5: round(hitsAt5.lexical / n),
    hybrid_recall_at_5: round(hitsAt5.hybrid / n), ms_per_query: round(ms / n),
  };
}

/** The faiss store's R@5 and, with a Postgres URL, the same chunks' in Postgres (a collection of its own, removed after). */
async function compareStores(cfg: Config, embedder: Embedder, faissStore: FaissStore, pgUrl: string | undefined, questions: readonly Question[]):
  Promise<{ faiss: StoreRecall; postgres: StoreRecall | null }> {
  const faiss = await storeRecall(cfg, embedder, faissStore, { collection: 'default' }, questions);
  if (!pgUrl) return { faiss, postgres: null };
  const pg = await PostgresStore.open(pgUrl, embedder.dimension, { bm25: { k1: cfg.bm25K1, b: cfg.bm25B }, efSearch: cfg.pgEfSearch });
  const collection = `bench-retrieval-${process.pid}-${Date.now()}`;
  const docs = await readCorpus(cfg.corpusDir);
  try {
    // Embedded as ingest does (the same chunker settings): the same chunks and vectors as the faiss store's.
    for (let i = 0; i < docs.length; i += 50) {
      const batch = await Promise.all(docs.slice(i, i + 50).map(async (d) => {
        const e = await embedDocument(embedder, cfg, { docId: d.docId!, title: d.title ?? d.docId!, text: d.text });
        return { doc: { docId: e.docId, title: e.title, bytes: e.bytes, collection }, chunks: e.spans, vectors: e.vectors };
      }));
      await pg.addBatch(batch);
    }
    const counts = await pg.counts(collection);
    if (counts.chunks !== faissStore.chunkCount) throw new Error(`postgres holds ${counts.chunks} chunks, faiss ${faissStore.chunkCount}`);
    return { faiss, postgres: await storeRecall(cfg, embedder, pg, { collection }, questions) };
  } finally {
    for (const d of docs) await pg.remove(collection, d.docId!);
    await pg.close();
  }
}

await main();
