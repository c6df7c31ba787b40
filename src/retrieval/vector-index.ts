/**
 * The faiss index under the embedded store, exact (IndexFlatIP) or approximate (IndexHNSWFlat, inner
 * product: cosine on unit vectors), through faiss-node as scripts/build-faiss-node.sh builds it: with
 * scripts/faiss/faiss-node-features.patch, which adds what this module types (Float32Array input, a
 * bitmap of allowed positions applied inside the search, a per-search HNSW candidate list, an exact
 * search of an HNSW index's own vectors, reconstruct, memory figures, and builds and serialisation on a
 * worker thread).
 *
 * Positions are faiss's labels: 0..ntotal-1 in the order vectors were added. HNSW cannot remove a
 * vector, so the store never asks either kind to: removed positions stay (tombstones) and are left
 * out by the bitmap until a rebuild (positions.ts).
 */
import faiss from 'faiss-node';

export interface IndexSearchOptions {
  /** Bitmap over positions (bit p & 7 of byte p >> 3): only these may be returned. */
  allow?: Uint8Array;
  /** HNSW only: candidates kept during this search. */
  efSearch?: number;
  /** HNSW only: search the stored vectors exhaustively instead of the graph. */
  exact?: boolean;
}

export interface HnswParams {
  /** Links per node (twice this on the bottom layer). */
  M: number;
  efConstruction: number;
  efSearch: number;
}

/** faiss-node's Index as the features patch extends it. */
interface NativeIndex {
  ntotal(): number;
  getDimension(): number;
  add(x: Float32Array): void;
  search(x: Float32Array, k: number, options?: IndexSearchOptions): { distances: number[]; labels: number[] };
  removeIds(ids: number[]): number;
  toBuffer(): Buffer;
  toBufferAsync(): Promise<Buffer>;
  reconstruct(positions: Int32Array): Float32Array;
  hnswParams(): (HnswParams & { maxLevel: number }) | null;
  setHnswParams(p: Partial<Pick<HnswParams, 'efConstruction' | 'efSearch'>>): void;
  memoryBytes(): { vectors: number; graph: number };
}

interface NativeStatics {
  fromBuffer(b: Buffer): NativeIndex;
  buildAsync(dims: number, descriptor: string, metric: number, vectors: Float32Array, options?: { efConstruction?: number }): Promise<NativeIndex>;
}

const Native = faiss.Index as unknown as NativeStatics;
const METRIC_INNER_PRODUCT = 0;

/** faiss-node as npm ships it lacks what this module calls: say how to build it, not "x is not a function". */
function patched(): void {
  if (typeof Native.buildAsync !== 'function') {
    throw new Error('faiss-node was built without scripts/faiss/faiss-node-features.patch: run npm run setup (or bash scripts/build-faiss-node.sh)');
  }
}

export type IndexKind = 'flat' | 'hnsw';

export class VectorIndex {
  private constructor(private readonly native: NativeIndex, readonly dimension: number) {}

  /** An empty exact index. */
  static flat(dimension: number): VectorIndex {
    patched();
    return new VectorIndex(new faiss.IndexFlatIP(dimension) as unknown as NativeIndex, dimension);
  }

  /** An exact index of these vectors (row-major). */
  static flatOf(dimension: number, vectors: Float32Array): VectorIndex {
    const ix = VectorIndex.flat(dimension);
    if (vectors.length > 0) ix.add(vectors);
    return ix;
  }

  /** An HNSW index of these vectors, built on a worker thread; `vectors` must not change until it settles. */
  static async hnswOf(dimension: number, vectors: Float32Array, p: HnswParams): Promise<VectorIndex> {
    const native = await Native.buildAsync(dimension, `HNSW${p.M}`, METRIC_INNER_PRODUCT, vectors, { efConstruction: p.efConstruction });
    native.setHnswParams({ efSearch: p.efSearch });
    return new VectorIndex(native, dimension);
  }

  /** An index from faiss's own serialisation (either kind); throws what faiss says of bad bytes. */
  static fromBuffer(bytes: Buffer): VectorIndex {
    patched();
    const native = Native.fromBuffer(bytes);
    return new VectorIndex(native, native.getDimension());
  }

  get kind(): IndexKind {
    return this.native.hnswParams() ? 'hnsw' : 'flat';
  }

  /** The HNSW parameters (undefined for the exact index). */
  get hnsw(): HnswParams | undefined {
    const p = this.native.hnswParams();
    return p ? { M: p.M, efConstruction: p.efConstruction, efSearch: p.efSearch } : undefined;
  }

  /** The candidate list of later searches and the effort of later additions (HNSW only). */
  tune(p: Partial<Pick<HnswParams, 'efConstruction' | 'efSearch'>>): void {
    if (this.native.hnswParams()) this.native.setHnswParams(p);
  }

  /** Positions held, removed ones included. */
  get size(): number {
    return this.native.ntotal();
  }

  add(vectors: Float32Array): void {
    if (vectors.length % this.dimension !== 0) throw new Error(`${vectors.length} floats are not rows of ${this.dimension}`);
    if (vectors.length > 0) this.native.add(vectors);
  }

  /** The k best positions by inner product (fewer where fewer pass `allow`), best first. */
  search(query: Float32Array, k: number, options?: IndexSearchOptions): { positions: number[]; scores: number[] } {
    const n = Math.min(k, this.size);
    if (n <= 0) return { positions: [], scores: [] };
    const { labels, distances } = this.native.search(query, n, options);
    const positions: number[] = [];
    const scores: number[] = [];
    for (let i = 0; i < labels.length; i++) {
      if (labels[i]! < 0) continue;
      positions.push(labels[i]!);
      scores.push(distances[i]!);
    }
    return { positions, scores };
  }

  /** The vectors at these positions, row-major. */
  vectorsAt(positions: Int32Array): Float32Array {
    return positions.length === 0 ? new Float32Array(0) : this.native.reconstruct(positions);
  }

  /** Drops positions from an exact index (it compacts: later positions move down). */
  removePositions(positions: number[]): void {
    if (this.kind !== 'flat') throw new Error('an HNSW index cannot remove vectors: rebuild it');
    const n = this.native.removeIds(positions);
    if (n !== positions.length) throw new Error(`faiss removed ${n} vectors for ${positions.length} positions`);
  }

  /** Bytes held: the vectors, and an HNSW index's links (neighbour lists, levels, offsets). */
  memoryBytes(): { vectors: number; graph: number } {
    return this.native.memoryBytes();
  }

  /** A copy (faiss's serialisation read back). */
  clone(): VectorIndex {
    return this.size === 0 && this.kind === 'flat' ? VectorIndex.flat(this.dimension) : VectorIndex.fromBuffer(this.toBuffer());
  }

  toBuffer(): Buffer {
    return this.native.toBuffer();
  }

  /** The serialisation, written on a worker thread: the index must not change until it settles (faiss-node refuses). */
  toBufferAsync(): Promise<Buffer> {
    return this.native.toBufferAsync();
  }
}
