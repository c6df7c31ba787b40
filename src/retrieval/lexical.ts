/**
 * The lexical side of hybrid retrieval: Okapi BM25 over the stored chunks ("title\ntext", what the
 * embedder sees), through MiniSearch (a maintained full-text index). Its BM25+ with d = 0 is BM25 with
 * Lucene's non-negative idf, as bench/bm25.ts (the baseline), with two differences of MiniSearch's own:
 * it multiplies a result's score by the number of query terms it matched (a coordination factor, undone
 * here so that scores are BM25's sums), and it takes a chunk's length as its number of distinct terms
 * (kept: both normalise long chunks; bench:rag measures both against the baseline).
 *
 * Terms are Unicode-aware (lexicalTerms): letters and numbers of every script, accents folded, Chinese,
 * Japanese and Korean cut into characters and character pairs. The statistics BM25 reads (document
 * frequencies, the number of chunks, their average length) are a collection's own (CollectionLexicon):
 * one tenant's documents never move another's scores or ranking.
 *
 * The index is derived state: the embedded store (faiss-store.ts) builds it from its chunk texts and keeps
 * it level with every write by chunk id, so the snapshot needs nothing more. postgres-store.ts computes
 * the same scores in SQL (the same terms, the same lengths, the same per-collection statistics), so both
 * stores rank alike.
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

/**
 * Scripts written without spaces between words (Chinese, Japanese; Korean's words carry their particles):
 * their runs are cut into characters and overlapping pairs of characters (as Lucene's CJK bigrams with
 * unigrams), so that a query's word matches inside a run whatever the words around it.
 * Script_Extensions, so that marks shared between them (the prolonged sound mark, iteration marks) stay
 * inside the run.
 */
const CJK = '\\p{scx=Han}\\p{scx=Hiragana}\\p{scx=Katakana}\\p{scx=Hangul}';
/**
 * A run of CJK letters, or a run of letters and numbers of any other script with the marks that are part
 * of its letters (Devanagari's vowel signs: a word is not cut at each).
 */
const CJK_LETTER = `(?=[\\p{L}\\p{N}])[${CJK}]`;
const OTHER = `(?![${CJK}])`;
const TERM = new RegExp(`(?:${CJK_LETTER})+|${OTHER}[\\p{L}\\p{N}](?:${OTHER}[\\p{L}\\p{N}\\p{M}])*`, 'gu');
/** Accents and other diacritics (the combining marks of Latin, Greek and Cyrillic), left out once NFKD has split them off. */
const DIACRITICS = /[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]/g;
const IS_CJK = new RegExp(`^[${CJK}]`, 'u');

/**
 * Text as BM25 sees it, in any language: compatibility forms unified and accents folded (NFKD, the
 * diacritics dropped, recomposed: "Café" and "cafe", "ﬁ" and "fi", full- and half-width forms meet;
 * Korean syllables and Japanese voiced kana are whole again), lowercased, German ß as ss; then the runs of
 * letters and numbers of every script (\p{L}\p{N}), with CJK runs as characters and character pairs.
 * Marks that make a letter in other scripts (Devanagari's vowel signs, Thai's) are kept. On ASCII text
 * this is the old split on [^a-z0-9]+ exactly, so an English index reads the same.
 */
export function normalizeText(text: string): string {
  return text.normalize('NFKD').replace(DIACRITICS, '').normalize('NFC').toLowerCase().replace(/ß/g, 'ss');
}

/** Lowercase, fold accents, split into terms (CJK: characters and pairs), drop stopwords (document length counts what is left). */
export function lexicalTerms(text: string): string[] {
  const out: string[] = [];
  for (const [run] of normalizeText(text).matchAll(TERM)) {
    if (IS_CJK.test(run)) {
      const chars = [...run];
      for (let i = 0; i < chars.length; i++) {
        out.push(chars[i]!);
        if (i + 1 < chars.length) out.push(chars[i]! + chars[i + 1]!);
      }
    } else if (!STOPWORDS.has(run)) {
      out.push(run);
    }
  }
  return out;
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

/** A chunk as BM25 sees it, in its collection. */
export interface CollectionEntry extends LexicalEntry {
  collection: string;
}

/**
 * BM25 per collection: one LexicalIndex for each collection that holds chunks, so document frequencies,
 * the chunk count and the average length are the collection's own. A collection's index goes when its
 * last chunk does.
 */
export class CollectionLexicon {
  private readonly indexes = new Map<string, LexicalIndex>();

  constructor(readonly params: Bm25Params) {}

  /** Chunks indexed, in every collection. */
  get size(): number {
    let n = 0;
    for (const ix of this.indexes.values()) n += ix.size;
    return n;
  }

  /** Chunks indexed in the collection. */
  sizeOf(collection: string): number {
    return this.indexes.get(collection)?.size ?? 0;
  }

  add(entries: readonly CollectionEntry[]): void {
    for (const [collection, group] of byCollection(entries)) {
      let ix = this.indexes.get(collection);
      if (!ix) this.indexes.set(collection, (ix = new LexicalIndex(this.params)));
      ix.add(group.map(({ id, text }) => ({ id, text })));
    }
  }

  remove(chunks: readonly { id: number; collection: string }[]): void {
    for (const [collection, group] of byCollection(chunks)) {
      const ix = this.indexes.get(collection);
      if (!ix) continue;
      ix.remove(group.map((c) => c.id));
      if (ix.size === 0) this.indexes.delete(collection);
    }
  }

  /** LexicalIndex.search inside one collection, by that collection's statistics. */
  search(collection: string, query: string, k: number, accept?: (chunkId: number) => boolean): LexicalHit[] {
    return this.indexes.get(collection)?.search(query, k, accept) ?? [];
  }
}

function byCollection<T extends { collection: string }>(items: readonly T[]): Map<string, T[]> {
  const out = new Map<string, T[]>();
  for (const it of items) {
    const g = out.get(it.collection);
    if (g) g.push(it);
    else out.set(it.collection, [it]);
  }
  return out;
}
