/**
 * The first stage of a query: dense (faiss cosine), lexical (BM25), or both fused by reciprocal rank
 * (RAGGUARD_RETRIEVAL). Each side contributes max(top_k, RAGGUARD_RETRIEVAL_DEPTH) hits to the fusion
 * and the fused list is cut to top_k.
 *
 * A hit's score is the first stage's own: cosine (dense), BM25 (lexical), or the fusion's sum of
 * weight / (k + rank) (hybrid). The cosine prune margin only means something for cosines, so it applies
 * in dense mode alone; dedupe, which compares texts, applies after every mode (in the service).
 */
import type { Config } from '../config/config.js';
import { reciprocalRankFusion } from './fusion.js';
import { LexicalIndex } from './lexical.js';
import { prune } from './prune.js';
import type { DocumentStore, Hit } from './store.js';

export type RetrieverConfig = Pick<Config, 'retrieval' | 'rrfK' | 'rrfDenseWeight' | 'rrfLexicalWeight' | 'retrievalDepth' | 'bm25K1' | 'bm25B' | 'pruneMargin'>;

export interface Retrieved {
  /** The first stage's hits, best first, at most top_k. */
  hits: Hit[];
  /** What is left after the prune (dense mode; the hits themselves otherwise). */
  pruned: Hit[];
}

export class Retriever {
  readonly lexical: LexicalIndex;

  constructor(
    private readonly store: DocumentStore,
    private readonly cfg: RetrieverConfig,
  ) {
    this.lexical = new LexicalIndex({ k1: cfg.bm25K1, b: cfg.bm25B });
    if (cfg.retrieval !== 'dense') this.lexical.sync(store);
  }

  search(queryVector: Float32Array, query: string, topK: number): Retrieved {
    const parts = this.parts(queryVector, query, topK);
    let r = parts.next();
    while (!r.done) r = parts.next();
    return r.value;
  }

  /**
   * search() with `between` awaited between its parts (the lexical search; the dense search and the
   * fusion): in a burst each is several milliseconds of a contended main thread, and the server gives
   * the event loop a turn there (runtime/turns.ts) rather than hold a probe behind both.
   */
  async searchPaced(queryVector: Float32Array, query: string, topK: number, between: () => Promise<void>): Promise<Retrieved> {
    const parts = this.parts(queryVector, query, topK);
    let r = parts.next();
    while (!r.done) {
      await between();
      r = parts.next();
    }
    return r.value;
  }

  /** The search, yielding where a caller may give the event loop a turn. */
  private *parts(queryVector: Float32Array, query: string, topK: number): Generator<void, Retrieved> {
    const { cfg, store } = this;
    if (cfg.retrieval === 'dense') {
      const hits = store.search(queryVector, topK);
      return { hits, pruned: prune(hits, cfg.pruneMargin) };
    }
    const depth = Math.max(topK, cfg.retrievalDepth);
    const lexicalHits = (): Hit[] => {
      // The store may have grown (or been rolled back) since the last query: the index follows it.
      this.lexical.sync(store);
      return this.lexical.search(query, depth).map((h) => ({ chunk: store.chunk(h.chunkId), score: h.score }));
    };
    let lexical = lexicalHits();
    if (cfg.retrieval === 'lexical') {
      const hits = lexical.slice(0, topK);
      return { hits, pruned: hits };
    }
    yield;
    // A removal during the yield renumbers the chunks after the removed ones (as new objects), and the
    // fusion matches the two sides by chunk id: the lexical side is searched again on the store as the
    // dense side sees it (rare, and about a millisecond).
    if (lexical.some((h) => h.chunk.id >= store.chunkCount || store.chunk(h.chunk.id) !== h.chunk)) lexical = lexicalHits();
    const dense = store.search(queryVector, depth);
    const fused = reciprocalRankFusion([
      { items: dense, weight: cfg.rrfDenseWeight },
      { items: lexical, weight: cfg.rrfLexicalWeight },
    ], (h) => h.chunk.id, cfg.rrfK);
    const hits = fused.slice(0, topK).map((f) => ({ chunk: f.item.chunk, score: f.score }));
    return { hits, pruned: hits };
  }
}
