/**
 * The faiss store's vectors per collection (faiss-store.ts): each collection's vectors also kept together,
 * contiguous, in an exact index of their own (IndexFlatIP), slot by slot with their chunk ids. A search
 * filtered to a collection that is a small part of the store scans these alone, so its cost follows the
 * collection: the store-wide index with a bitmap of the collection's positions checks every position
 * of the store, and the bitmap itself was built from every document whenever it was not among the 16
 * cached (bench:scale-real, 1M rows in 100 collections, 16 clients: p95 236 ms, 90 queries/s).
 *
 * Kept by chunk id, not position: the store-wide index's positions move on a rebuild, ids never do. A
 * removed chunk leaves its collection's index at once (a flat index compacts: O(collection)). Not
 * persisted: rebuilt from the store-wide index's vectors when a snapshot is loaded, kept level with every
 * write after (the log's replay included). The price is memory: each vector is held twice (counted in
 * the store's indexBytes). Each search is one synchronous faiss call over one collection's vectors
 * (10,000 x 384 floats: about a millisecond), short enough for the event loop.
 */
import { Bitmap } from './positions.js';
import { VectorIndex } from './vector-index.js';

export class CollectionVectors {
  private constructor(private index: VectorIndex, private ids: number[]) {}

  static empty(dimension: number): CollectionVectors {
    return new CollectionVectors(VectorIndex.flat(dimension), []);
  }

  static of(dimension: number, ids: number[], vectors: Float32Array): CollectionVectors {
    return new CollectionVectors(VectorIndex.flatOf(dimension, vectors), ids);
  }

  get size(): number {
    return this.ids.length;
  }

  /** Bytes of the vectors and the ids. */
  get bytes(): number {
    return this.index.memoryBytes().vectors + this.ids.length * 8;
  }

  /** The chunk id in each slot (slot order: the order they were added). */
  get slots(): readonly number[] {
    return this.ids;
  }

  add(ids: readonly number[], vectors: Float32Array): void {
    if (vectors.length !== ids.length * this.index.dimension) throw new Error(`${vectors.length} floats for ${ids.length} chunks`);
    this.index.add(vectors);
    for (const id of ids) this.ids.push(id);
  }

  /** Drops these chunks (later slots move down). */
  remove(ids: ReadonlySet<number>): void {
    const slots: number[] = [];
    this.ids.forEach((id, slot) => {
      if (ids.has(id)) slots.push(slot);
    });
    if (slots.length === 0) return;
    this.index.removePositions(slots);
    this.ids = this.ids.filter((id) => !ids.has(id));
  }

  /** The k best chunk ids by inner product among the slots `allow` lets through (none: all), best first. */
  search(query: Float32Array, k: number, allow?: Bitmap): { ids: number[]; scores: number[] } {
    const { positions, scores } = this.index.search(query, k, allow ? { allow: allow.bytes } : undefined);
    return { ids: positions.map((p) => this.ids[p]!), scores };
  }

  clone(): CollectionVectors {
    return new CollectionVectors(this.index.clone(), [...this.ids]);
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
