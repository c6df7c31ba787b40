/**
 * Where each chunk's vector lies in the faiss index, and which positions a search may return.
 *
 * Positions are faiss's labels, in the order vectors were added; chunk ids are given in that same
 * order, so position order is chunk-id order, and a chunk's position is a binary search away (no map
 * of a million entries). A removed chunk leaves a tombstone: its position stays (HNSW cannot remove a
 * vector) and is stored as -(id + 1), so the order still holds and the id is still known. A rebuild
 * of the index keeps the live positions in order (remap).
 *
 * Which positions a search may return is a bitmap (bit p & 7 of byte p >> 3), handed to faiss, which
 * applies it inside the search: the live positions, or those of one filter (a collection, metadata
 * conditions). A filter's bitmap is built once from the documents and then kept level with every
 * write (Selections), so a query pays nothing for it.
 */

/** A growable bitmap over positions, with its count of set bits. */
export class Bitmap {
  bytes: Uint8Array;
  count = 0;

  constructor(capacity = 1024) {
    this.bytes = new Uint8Array(Math.ceil(capacity / 8));
  }

  has(p: number): boolean {
    const byte = p >> 3;
    return byte < this.bytes.length && (this.bytes[byte]! & (1 << (p & 7))) !== 0;
  }

  set(p: number): void {
    const byte = p >> 3;
    if (byte >= this.bytes.length) {
      const grown = new Uint8Array(Math.max(byte + 1, this.bytes.length * 2));
      grown.set(this.bytes);
      this.bytes = grown;
    }
    const bit = 1 << (p & 7);
    if ((this.bytes[byte]! & bit) === 0) {
      this.bytes[byte] = this.bytes[byte]! | bit;
      this.count++;
    }
  }

  clear(p: number): void {
    const byte = p >> 3;
    const bit = 1 << (p & 7);
    if (byte < this.bytes.length && (this.bytes[byte]! & bit) !== 0) {
      this.bytes[byte] = this.bytes[byte]! & ~bit;
      this.count--;
    }
  }

  copy(): Bitmap {
    const b = new Bitmap(0);
    b.bytes = this.bytes.slice();
    b.count = this.count;
    return b;
  }
}

export class PositionTable {
  private constructor(
    /** Position -> chunk id (>= 0) or -(id + 1) for a removed chunk; capacity beyond `length`. */
    private labels: Int32Array,
    private length: number,
    readonly live: Bitmap,
  ) {}

  static empty(): PositionTable {
    return new PositionTable(new Int32Array(1024), 0, new Bitmap());
  }

  /** A table of these labels (positions in order; negative: removed). Throws unless ids increase. */
  static of(labels: ArrayLike<number>): PositionTable {
    const t = new PositionTable(Int32Array.from(labels), labels.length, new Bitmap(labels.length));
    let last = -1;
    for (let p = 0; p < labels.length; p++) {
      const id = t.decoded(p);
      if (id <= last) throw new Error(`chunk ids out of order at position ${p} (${id} after ${last})`);
      last = id;
      if (labels[p]! >= 0) t.live.set(p);
    }
    return t;
  }

  /** Positions held, tombstones included. */
  get size(): number {
    return this.length;
  }

  get liveCount(): number {
    return this.live.count;
  }

  get tombstones(): number {
    return this.length - this.live.count;
  }

  /** Bytes held: the labels and the live bitmap. */
  get bytes(): number {
    return this.labels.byteLength + this.live.bytes.byteLength;
  }

  /** The chunk id at a position, or -1 for a tombstone. */
  idAt(p: number): number {
    const l = this.labels[p]!;
    return l >= 0 ? l : -1;
  }

  /** Every label in position order (negative: removed), for the snapshot. */
  snapshot(): Int32Array {
    return this.labels.slice(0, this.length);
  }

  /** Appends positions for these ids (each above every id held); returns the first new position. */
  append(ids: ArrayLike<number>): number {
    const first = this.length;
    if (this.length + ids.length > this.labels.length) {
      const grown = new Int32Array(Math.max(this.length + ids.length, this.labels.length * 2));
      grown.set(this.labels.subarray(0, this.length));
      this.labels = grown;
    }
    let last = this.length > 0 ? this.decoded(this.length - 1) : -1;
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i]!;
      if (id <= last) throw new Error(`chunk id ${id} does not follow ${last}`);
      last = id;
      this.labels[this.length] = id;
      this.live.set(this.length);
      this.length++;
    }
    return first;
  }

  /** The live position of a chunk id, or -1. */
  positionOf(id: number): number {
    let lo = 0;
    let hi = this.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >>> 1;
      const m = this.decoded(mid);
      if (m === id) return this.labels[mid]! >= 0 ? mid : -1;
      if (m < id) lo = mid + 1;
      else hi = mid - 1;
    }
    return -1;
  }

  /** Marks a live position removed. */
  kill(p: number): void {
    const l = this.labels[p]!;
    if (l < 0) throw new Error(`position ${p} is already removed`);
    this.labels[p] = -l - 1;
    this.live.clear(p);
  }

  /** The live positions below `end`, in order. */
  livePositions(end = this.length): Int32Array {
    const out = new Int32Array(Math.min(end, this.length) - this.tombstonesBelow(end));
    let i = 0;
    for (let p = 0; p < end && p < this.length; p++) if (this.labels[p]! >= 0) out[i++] = p;
    return out;
  }

  /**
   * The table of a rebuilt index holding, in order, the vectors of `kept` (positions of this table)
   * and then those of `appended`: labels follow (a chunk removed since is a tombstone there too).
   */
  remap(kept: Int32Array, appended: Int32Array): PositionTable {
    const labels = new Int32Array(kept.length + appended.length);
    kept.forEach((p, i) => (labels[i] = this.labels[p]!));
    appended.forEach((p, i) => (labels[kept.length + i] = this.labels[p]!));
    return PositionTable.of(labels);
  }

  copy(): PositionTable {
    return new PositionTable(this.labels.slice(), this.length, this.live.copy());
  }

  private decoded(p: number): number {
    const l = this.labels[p]!;
    return l >= 0 ? l : -l - 1;
  }

  private tombstonesBelow(end: number): number {
    let n = 0;
    for (let p = 0; p < end && p < this.length; p++) if (this.labels[p]! < 0) n++;
    return n;
  }
}

/**
 * The bitmaps of recently used filters, kept level with the table: an added position is set in each
 * whose filter it passes, a removed one cleared in all. At most `max` filters, least recently used
 * dropped; all dropped when positions are remapped (a rebuild).
 */
export class Selections<F> {
  private readonly entries = new Map<string, { filter: F; bits: Bitmap }>();

  constructor(private readonly max = 16) {}

  /** The filter's bitmap: cached, or built now by `build`. */
  get(key: string, filter: F, build: () => Bitmap): Bitmap {
    let e = this.entries.get(key);
    if (e) {
      this.entries.delete(key);
      this.entries.set(key, e);
      return e.bits;
    }
    e = { filter, bits: build() };
    this.entries.set(key, e);
    if (this.entries.size > this.max) this.entries.delete(this.entries.keys().next().value!);
    return e.bits;
  }

  /** A position was added: set in every bitmap whose filter `passes`. */
  added(p: number, passes: (filter: F) => boolean): void {
    for (const e of this.entries.values()) if (passes(e.filter)) e.bits.set(p);
  }

  removed(p: number): void {
    for (const e of this.entries.values()) e.bits.clear(p);
  }

  clear(): void {
    this.entries.clear();
  }

  get bytes(): number {
    let n = 0;
    for (const e of this.entries.values()) n += e.bits.bytes.byteLength;
    return n;
  }
}
