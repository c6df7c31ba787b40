/**
 * The lexical side of hybrid retrieval: Okapi BM25 over the stored chunks ("title\ntext", what the
 * embedder sees), through MiniSearch (a maintained full-text index). Its BM25+ with d = 0 is BM25 with
 * Lucene's non-negative idf, as bench/bm25.ts (the baseline), with two differences of MiniSearch's own:
 * it multiplies a result's score by the number of query terms it matched (a coordination factor, undone
 * here so that scores are BM25's sums), and it takes a chunk's length as its number of distinct terms
 * (kept: both normalise long chunks; bench:rag measures both against the baseline).
 *
 * The index is derived state: the embedded store (faiss-store.ts) builds it from its chunk texts and keeps
 * it level with every write by chunk id, so the snapshot needs nothing more. postgres-store.ts computes
 * the same scores in SQL (the same terms, the same lengths), so both stores rank alike.
 */
import MiniSearch from 'minisearch';
import type { Bm25Params } from './retrieval-store.js';

/** English function words that carry no topic (the same list as the benchmark's baseline BM25). */
export const STOPWORDS: ReadonlySet<string> = new Set([
  'a', 'about', 'an', 'and', 'are', 'as', 'at', 'be', 'but', 'by', 'can', 'do', 'does', 'for', 'from',
  'how', 'i', 'if', 'in', 'into', 'is', 'it', 'its', 'me', 'my', 'of', 'on', 'or', 'so', 'such', 'that',
  'the', 'their', 'them', 'then', 'there', 'these', 'they', 'this', 'to', 'was', 'we', 'were', 'what',
  'when', 'where', 'which', 'while', 'who', 'why', 'will', 'with', 'you', 'your',
]);

/** Lowercase, split on non-alphanumerics, drop stopwords (document length counts what is left). */
export function lexicalTerms(text: string): string[] {
  return text.toLowerCase().split(/[^a-z0-9]+/).filter((t) => t !== '' && !STOPWORDS.has(t));
}

export type { Bm25Params } from './retrieval-store.js';

export interface LexicalHit {
  /** The store's chunk id. */
  chunkId: number;
  score: number;
}

/** A chunk as BM25 sees it: "title\ntext". */
export interface LexicalEntry {
  id: number;
  text: string;
}

export class LexicalIndex {
  private readonly index: MiniSearch<LexicalEntry>;

  constructor(readonly params: Bm25Params) {
    this.index = this.fresh();
  }

  /** Chunks indexed. */
  get size(): number {
    return this.index.documentCount;
  }

  add(entries: readonly LexicalEntry[]): void {
    if (entries.length > 0) this.index.addAll(entries);
  }

  /** Forgets the chunks (MiniSearch's discard: the statistics follow at once, the postings are vacuumed later). */
  remove(ids: readonly number[]): void {
    for (const id of ids) this.index.discard(id);
  }

  /**
   * The k best chunks by BM25 that `accept` lets through, best first (ties: lower id first); chunks
   * sharing no term are left out. The filter applies before the cut, so k stay when k match.
   */
  search(query: string, k: number, accept?: (chunkId: number) => boolean): LexicalHit[] {
    if (k <= 0 || this.index.documentCount === 0) return [];
    const results = this.index.search(query, accept ? { filter: (r) => accept(r.id as number) } : undefined);
    const hits = results.map((r) => ({ chunkId: r.id as number, score: r.score / Math.max(1, r.queryTerms.length) }));
    hits.sort((x, y) => y.score - x.score || x.chunkId - y.chunkId);
    return hits.slice(0, k);
  }

  private fresh(): MiniSearch<LexicalEntry> {
    return new MiniSearch<LexicalEntry>({
      fields: ['text'],
      idField: 'id',
      tokenize: lexicalTerms,
      processTerm: (t) => t,
      // A query term counts once, as in BM25's sum over distinct query terms.
      searchOptions: {
        tokenize: (q) => [...new Set(lexicalTerms(q))],
        combineWith: 'OR',
        bm25: { k: this.params.k1, b: this.params.b, d: 0 },
      },
    });
  }
}
