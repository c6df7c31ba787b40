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
import { prune } from './prune.js';
import type { Hit, RetrievalStore, SearchFilter } from './retrieval-store.js';

export type RetrieverConfig = Pick<Config, 'retrieval' | 'rrfK' | 'rrfDenseWeight' | 'rrfLexicalWeight' | 'retrievalDepth' | 'pruneMargin'>;

export interface Retrieved {
  /** The first stage's hits, best first, at most top_k. */
  hits: Hit[];
  /** What is left after the prune (dense mode; the hits themselves otherwise). */
  pruned: Hit[];
}

const noTurn = () => Promise.resolve();

export class Retriever {
  constructor(
    private readonly store: RetrievalStore,
    private readonly cfg: RetrieverConfig,
  ) {}

  search(queryVector: Float32Array, query: string, topK: number, filter: SearchFilter): Promise<Retrieved> {
    return this.searchPaced(queryVector, query, topK, filter, noTurn);
  }

  /**
   * search() with `between` awaited between its parts (the lexical search; the dense search and the
   * fusion): in a burst each is several milliseconds of a contended main thread, and the server gives
   * the event loop a turn there (runtime/turns.ts) rather than hold a probe behind both. Both sides search
   * inside the filter (the store applies it), so each brings its full depth.
   */
  async searchPaced(queryVector: Float32Array, query: string, topK: number, filter: SearchFilter, between: () => Promise<void>): Promise<Retrieved> {
    const { cfg, store } = this;
    if (cfg.retrieval === 'dense') {
      await between();
      const hits = await store.searchDense(queryVector, topK, filter);
      return { hits, pruned: prune(hits, cfg.pruneMargin) };
    }
    const depth = Math.max(topK, cfg.retrievalDepth);
    await between();
    const lexical = await store.searchLexical(query, depth, filter);
    if (cfg.retrieval === 'lexical') {
      const hits = lexical.slice(0, topK);
      return { hits, pruned: hits };
    }
    await between();
    // Chunk ids are stable in both stores, so the two sides match by id even across a write between them.
    const dense = await store.searchDense(queryVector, depth, filter);
    const fused = reciprocalRankFusion([
      { items: dense, weight: cfg.rrfDenseWeight },
      { items: lexical, weight: cfg.rrfLexicalWeight },
    ], (h) => h.chunk.id, cfg.rrfK);
    const hits = fused.slice(0, topK).map((f) => ({ chunk: f.item.chunk, score: f.score }));
    return { hits, pruned: hits };
  }
}
