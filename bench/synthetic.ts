/**
 * Synthetic stores for bench:scale and the approximate index's recall test: unit vectors from a
 * Gaussian mixture (clusters around random unit centres), so that nearest neighbours are structured as
 * text embeddings' are and an approximate index's recall means something (uniform random vectors in
 * 384 dimensions have no near neighbours to find), and short texts whose words follow the clusters, for
 * the lexical side. Row i is the same for any store size: generated from the seed, the row's batch and
 * nothing else, so the stores of 10k, 100k and 1M chunks share their first rows.
 */
import { seededRandom } from '../src/generate/sampler.js';
import { VectorIndex } from '../src/retrieval/vector-index.js';

/** Rows generated from one stream of the generator (a batch never depends on the batches before it). */
const ROWS_PER_STREAM = 1000;
const VOCABULARY = 4000;
const TOPIC_WORDS = 12;

/** Standard normal draws from a uniform generator (Box-Muller, the spare kept). */
export function gaussian(next: () => number): () => number {
  let spare: number | undefined;
  return () => {
    if (spare !== undefined) {
      const s = spare;
      spare = undefined;
      return s;
    }
    let u = 0;
    while (u === 0) u = next();
    const r = Math.sqrt(-2 * Math.log(u));
    const a = 2 * Math.PI * next();
    spare = r * Math.sin(a);
    return r * Math.cos(a);
  };
}

/** Scales each row of d numbers to unit length, in place. */
export function normalizeRows(x: Float32Array, d: number): void {
  for (let o = 0; o < x.length; o += d) {
    let s = 0;
    for (let j = 0; j < d; j++) s += x[o + j]! * x[o + j]!;
    const inv = 1 / Math.sqrt(s);
    for (let j = 0; j < d; j++) x[o + j] = x[o + j]! * inv;
  }
}

export interface Rows {
  /** Row-major unit vectors. */
  vectors: Float32Array;
  /** Each row's cluster. */
  clusters: Int32Array;
}

export class ClusteredSet {
  private readonly centers: Float32Array;

  /**
   * `spread`: each coordinate's noise around the centre (0.03 in 384 dimensions: noise of norm 0.6, a
   * cluster's members at cosine about 0.75 to one another, far from the other clusters).
   */
  constructor(readonly dimension: number, readonly clusters = 1000, readonly spread = 0.03, readonly seed = 1) {
    const g = gaussian(seededRandom(seed));
    this.centers = Float32Array.from({ length: clusters * dimension }, g);
    normalizeRows(this.centers, dimension);
  }

  /** Rows [from, from + n). */
  rows(from: number, n: number): Rows {
    return this.draw(from, n, 0x5eed);
  }

  /** n query vectors from the same mixture (not rows of the set). */
  queries(n: number): Rows {
    return this.draw(0, n, 0x9e77);
  }

  /** A short text for a row of this cluster: its topic words and some of the common ones. */
  text(row: number, cluster: number): string {
    const next = seededRandom(this.seed * 7919 + row);
    const words: string[] = [];
    for (let i = 0; i < 8; i++) {
      const topic = next() < 0.6;
      words.push(topic ? `t${cluster}w${Math.floor(next() * TOPIC_WORDS)}` : `w${Math.floor(next() * VOCABULARY)}`);
    }
    return words.join(' ');
  }

  /** A lexical query for a cluster: three of its topic words. */
  lexicalQuery(i: number, cluster: number): string {
    const next = seededRandom(this.seed * 104729 + i);
    return Array.from({ length: 3 }, () => `t${cluster}w${Math.floor(next() * TOPIC_WORDS)}`).join(' ');
  }

  private draw(from: number, n: number, salt: number): Rows {
    const d = this.dimension;
    const vectors = new Float32Array(n * d);
    const clusters = new Int32Array(n);
    for (let i = 0; i < n; ) {
      const row = from + i;
      const stream = Math.floor(row / ROWS_PER_STREAM);
      const next = seededRandom((this.seed * 1_000_003 + stream * 31 + salt) >>> 0);
      const g = gaussian(next);
      // Skip to the row inside its stream (each row draws 1 + d numbers; whole rows only).
      const skip = row - stream * ROWS_PER_STREAM;
      for (let r = 0; r < skip; r++) {
        next();
        for (let j = 0; j < d; j++) g();
      }
      for (let r = skip; r < ROWS_PER_STREAM && i < n; r++, i++) {
        const c = Math.floor(next() * this.clusters);
        clusters[i] = c;
        for (let j = 0; j < d; j++) vectors[i * d + j] = this.centers[c * d + j]! + this.spread * g();
      }
    }
    normalizeRows(vectors, d);
    return { vectors, clusters };
  }
}

/**
 * The exact k nearest rows (by inner product) of each query, kept as rows arrive in batches: each
 * batch is searched exhaustively (a flat faiss index of it) and merged, so the whole set is never
 * held at once.
 */
export class ExactNeighbours {
  private readonly best: { row: number; score: number }[][];

  constructor(private readonly queries: Float32Array, readonly dimension: number, readonly k: number) {
    this.best = Array.from({ length: queries.length / dimension }, () => []);
  }

  /** Rows [first, first + n) of the set. */
  add(vectors: Float32Array, first: number): void {
    const index = VectorIndex.flatOf(this.dimension, vectors);
    this.best.forEach((best, q) => {
      const { positions, scores } = index.search(this.queries.subarray(q * this.dimension, (q + 1) * this.dimension), this.k);
      positions.forEach((p, i) => best.push({ row: first + p, score: scores[i]! }));
      best.sort((a, b) => b.score - a.score || a.row - b.row);
      best.length = Math.min(best.length, this.k);
    });
  }

  /** Query q's nearest rows with their inner products, best first. */
  scored(q: number): readonly { row: number; score: number }[] {
    return this.best[q]!;
  }

  /** Query q's nearest rows, best first. */
  of(q: number): number[] {
    return this.best[q]!.map((b) => b.row);
  }

  /** Mean share of each query's exact k found among `found(q)` (its first k). */
  recall(found: (q: number) => readonly number[]): number {
    let hit = 0;
    this.best.forEach((_, q) => {
      const exact = new Set(this.of(q));
      for (const r of found(q).slice(0, this.k)) if (exact.has(r)) hit++;
    });
    return hit / (this.best.length * this.k);
  }
}
