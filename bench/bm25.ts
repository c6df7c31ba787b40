/**
 * Okapi BM25 over an in-memory list of texts: a lexical baseline for the retrieval benchmark.
 *
 * score(q, d) = sum over distinct query terms t of
 *   idf(t) * tf(t, d) * (k1 + 1) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
 * with idf(t) = ln(1 + (N - n(t) + 0.5) / (n(t) + 0.5)) (the non-negative Lucene form), so a document
 * sharing no term with the query scores exactly 0.
 */

/** A small English stopword list (function words that carry no topic). */
export const STOPWORDS: ReadonlySet<string> = new Set([
  'a', 'about', 'an', 'and', 'are', 'as', 'at', 'be', 'but', 'by', 'can', 'do', 'does', 'for', 'from',
  'how', 'i', 'if', 'in', 'into', 'is', 'it', 'its', 'me', 'my', 'of', 'on', 'or', 'so', 'such', 'that',
  'the', 'their', 'them', 'then', 'there', 'these', 'they', 'this', 'to', 'was', 'we', 'were', 'what',
  'when', 'where', 'which', 'while', 'who', 'why', 'will', 'with', 'you', 'your',
]);

/** Lowercase, split on non-alphanumerics, drop stopwords. */
export function tokenize(text: string): string[] {
  return text.toLowerCase().split(/[^a-z0-9]+/).filter((t) => t !== '' && !STOPWORDS.has(t));
}

export interface Bm25Options {
  k1?: number;
  b?: number;
}

export interface Bm25Hit {
  /** Position of the document in the constructor's list. */
  index: number;
  score: number;
}

interface Posting {
  doc: number;
  tf: number;
}

export class Bm25 {
  readonly k1: number;
  readonly b: number;
  readonly avgLength: number;
  private readonly lengths: Uint32Array;
  private readonly postings = new Map<string, Posting[]>();

  constructor(docs: readonly string[], opts: Bm25Options = {}) {
    this.k1 = opts.k1 ?? 1.2;
    this.b = opts.b ?? 0.75;
    this.lengths = new Uint32Array(docs.length);
    let total = 0;
    docs.forEach((text, doc) => {
      const terms = tokenize(text);
      this.lengths[doc] = terms.length;
      total += terms.length;
      const tf = new Map<string, number>();
      for (const t of terms) tf.set(t, (tf.get(t) ?? 0) + 1);
      for (const [t, n] of tf) {
        let list = this.postings.get(t);
        if (!list) this.postings.set(t, (list = []));
        list.push({ doc, tf: n });
      }
    });
    this.avgLength = docs.length > 0 ? total / docs.length : 0;
  }

  get size(): number {
    return this.lengths.length;
  }

  /** Inverse document frequency of a (tokenized) term; 0 for a term no document holds. */
  idf(term: string): number {
    const n = this.postings.get(term)?.length ?? 0;
    if (n === 0) return 0;
    const N = this.lengths.length;
    return Math.log(1 + (N - n + 0.5) / (n + 0.5));
  }

  /** The BM25 score of every document for the query, by document index. */
  scores(query: string): Float64Array {
    const out = new Float64Array(this.lengths.length);
    const { k1, b, avgLength } = this;
    for (const term of new Set(tokenize(query))) {
      const list = this.postings.get(term);
      if (!list) continue;
      const idf = this.idf(term);
      for (const { doc, tf } of list) {
        const norm = avgLength > 0 ? 1 - b + (b * this.lengths[doc]!) / avgLength : 1;
        out[doc]! += (idf * tf * (k1 + 1)) / (tf + k1 * norm);
      }
    }
    return out;
  }

  /** The k best-scoring documents, best first (ties: lower index first); documents scoring 0 are left out. */
  search(query: string, k: number): Bm25Hit[] {
    const s = this.scores(query);
    const hits: Bm25Hit[] = [];
    s.forEach((score, index) => {
      if (score > 0) hits.push({ index, score });
    });
    hits.sort((x, y) => y.score - x.score || x.index - y.index);
    return hits.slice(0, Math.max(0, k));
  }
}
