/**
 * The lexical side of hybrid retrieval: Okapi BM25 over the stored chunks ("title\ntext", what the
 * embedder sees), through MiniSearch (a maintained full-text index). Its BM25+ with d = 0 is BM25 with
 * Lucene's non-negative idf, as bench/bm25.ts (the baseline), with two differences of MiniSearch's own:
 * it multiplies a result's score by the number of query terms it matched (a coordination factor, undone
 * here so that scores are BM25's sums), and it takes a chunk's length as its number of distinct terms
 * (kept: both normalise long chunks; bench:rag measures both against the baseline).
 *
 * The index is derived state: it is rebuilt from the store's chunk texts when the service starts and
 * follows the store by chunk id (chunks are append-only), so the snapshot needs nothing more.
 */
import MiniSearch from 'minisearch';

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

export interface Bm25Params {
  k1: number;
  b: number;
}

export interface LexicalHit {
  /** The store's chunk id. */
  chunkId: number;
  score: number;
}

interface Entry {
  id: number;
  text: string;
}

/** What the index reads chunks from: the document store satisfies it. */
export interface ChunkSource {
  readonly chunkCount: number;
  chunk(id: number): { docId: string; text: string };
  document(docId: string): { title: string } | undefined;
}

export class LexicalIndex {
  private index: MiniSearch<Entry>;
  private count = 0;
  /** Text of the last chunk indexed: a cheap check that the store's ids still mean the same chunks. */
  private lastText = '';

  constructor(readonly params: Bm25Params) {
    this.index = this.fresh();
  }

  /** Chunks indexed (ids 0 .. size-1). */
  get size(): number {
    return this.count;
  }

  /**
   * Brings the index level with the store: appends the chunks it has not seen; rebuilds when the store
   * is no longer what the index was built from (fewer chunks, or another text at the last indexed id: an
   * ingest rolled back, perhaps followed by others).
   */
  sync(store: ChunkSource): void {
    if (this.count > 0 && (store.chunkCount < this.count || store.chunk(this.count - 1).text !== this.lastText)) {
      this.index = this.fresh();
      this.count = 0;
    }
    if (store.chunkCount === this.count) return;
    const entries: Entry[] = [];
    for (let id = this.count; id < store.chunkCount; id++) {
      const c = store.chunk(id);
      entries.push({ id, text: `${store.document(c.docId)?.title ?? ''}\n${c.text}` });
    }
    this.index.addAll(entries);
    this.count = store.chunkCount;
    this.lastText = store.chunk(this.count - 1).text;
  }

  /** The k best chunks by BM25, best first (ties: lower id first); chunks sharing no term are left out. */
  search(query: string, k: number): LexicalHit[] {
    if (k <= 0 || this.count === 0) return [];
    const hits = this.index.search(query).map((r) => ({ chunkId: r.id as number, score: r.score / Math.max(1, r.queryTerms.length) }));
    hits.sort((x, y) => y.score - x.score || x.chunkId - y.chunkId);
    return hits.slice(0, k);
  }

  private fresh(): MiniSearch<Entry> {
    return new MiniSearch<Entry>({
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
