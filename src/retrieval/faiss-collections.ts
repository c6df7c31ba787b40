/**
 * The faiss store's vectors per collection (faiss-store.ts): each collection's vectors also kept together,
 * contiguous, in a Float32Array of their own, slot by slot with their chunk ids. A search filtered to a
 * collection that is a small part of the store scans these alone, so its cost follows the collection:
 * the store-wide index with a bitmap of the collection's positions checks every position of the store,
 * and the bitmap itself was built from every document whenever it was not among the 16 cached
 * (bench:scale-real, 1M rows in 100 collections, 16 clients: p95 236 ms, 90 queries/s).
 *
 * Kept by chunk id, not position: the store-wide index's positions move on a rebuild, ids never do. A
 * removed chunk leaves its collection's rows at once (compacted: O(collection)). Not persisted: rebuilt
 * from the store-wide index's vectors when a snapshot is loaded, kept level with every write after (the
 * log's replay included). The price is memory: each vector is held twice (counted in the store's
 * indexBytes, capacity included). Each search is one synchronous exact scan (dense-scan.ts: ragguard's
 * AVX512 loop, about 0.5 ms over 10,000 x 384 floats, where faiss's IndexFlatIP in the generic build
 * linked here took 4-7 ms), short enough for the event loop.
 */
import type { Bitmap } from './positions.js';
import { scanTopK } from './dense-scan.js';
import type { VectorIndex } from './vector-index.js';

export class CollectionVectors {
  /** Rows in slot order; capacity beyond ids.length * dimension is spare room for adds. */
  private rows: Float32Array;

  private constructor(readonly dimension: number, rows: Float32Array, private ids: number[]) {
    this.rows = rows;
  }

  static empty(dimension: number): CollectionVectors {
    return new CollectionVectors(dimension, new Float32Array(0), []);
  }

  /** Takes `ids` and `vectors` as its own (not copied: the caller passes fresh arrays and keeps neither). */
  static of(dimension: number, ids: number[], vectors: Float32Array): CollectionVectors {
    if (vectors.length !== ids.length * dimension) throw new Error(`${vectors.length} floats for ${ids.length} chunks`);
    return new CollectionVectors(dimension, vectors, ids);
  }

  get size(): number {
    return this.ids.length;
  }

  /** Bytes of the vectors (the allocation, spare room included) and the ids. */
  get bytes(): number {
    return this.rows.byteLength + this.ids.length * 8;
  }

  /** The chunk id in each slot (slot order: the order they were added). */
  get slots(): readonly number[] {
    return this.ids;
  }

  add(ids: readonly number[], vectors: Float32Array): void {
    if (vectors.length !== ids.length * this.dimension) throw new Error(`${vectors.length} floats for ${ids.length} chunks`);
    const used = this.ids.length * this.dimension;
    if (used + vectors.length > this.rows.length) {
      // Doubled, as a faiss index's std::vector grows: one copy per doubling, not per add.
      const grown = new Float32Array(Math.max(used + vectors.length, this.rows.length * 2));
      grown.set(this.rows.subarray(0, used));
      this.rows = grown;
    }
    this.rows.set(vectors, used);
    for (const id of ids) this.ids.push(id);
  }

  /** Drops these chunks (later slots move down). */
  remove(ids: ReadonlySet<number>): void {
    // One walk: the kept ids move down in place with their rows (nothing moves before the first removed one).
    const d = this.dimension;
    let to = 0;
    for (let slot = 0; slot < this.ids.length; slot++) {
      const id = this.ids[slot]!;
      if (ids.has(id)) continue;
      if (to !== slot) {
        this.rows.copyWithin(to * d, slot * d, (slot + 1) * d);
        this.ids[to] = id;
      }
      to++;
    }
    this.ids.length = to;
  }

  /** The k best chunk ids by inner product among the slots `allow` lets through (none: all), best first. */
  search(query: Float32Array, k: number, allow?: Bitmap): { ids: number[]; scores: number[] } {
    const { slots, scores } = scanTopK(this.rows, this.ids.length, this.dimension, query, k, allow?.bytes);
    return { ids: slots.map((p) => this.ids[p]!), scores };
  }

  clone(): CollectionVectors {
    return new CollectionVectors(this.dimension, this.rows.slice(0, this.ids.length * this.dimension), [...this.ids]);
  }
}

/**
 * Every collection's vectors from the store-wide index: `collectionOf(id)` says a live chunk's collection
 * (positions whose chunk was removed are left out). One reconstruct per collection.
 */
export function collectionVectorsFrom(
  index: VectorIndex, size: number, idAt: (p: number) => number, collectionOf: (id: number) => string,
): Map<string, CollectionVectors> {
  const positions = new Map<string, { ids: number[]; positions: number[] }>();
  for (let p = 0; p < size; p++) {
    const id = idAt(p);
    if (id < 0) continue;
    const c = collectionOf(id);
    let e = positions.get(c);
    if (!e) positions.set(c, (e = { ids: [], positions: [] }));
    e.ids.push(id);
    e.positions.push(p);
  }
  const out = new Map<string, CollectionVectors>();
  for (const [c, e] of positions) out.set(c, CollectionVectors.of(index.dimension, e.ids, index.vectorsAt(Int32Array.from(e.positions))));
  return out;
}
