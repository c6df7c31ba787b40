/**
 * One sequence's block table: logical block index -> physical block id, in an Int32Array.
 *
 * Its capacity grows through a few length buckets (by default 4, 16, 64, 256, 1024, 4096 entries, then
 * doubling) instead of being sized for max_model_len up front: most sequences are short, and a handful
 * of bucket sizes keeps the shapes a device-side table would be padded to few (and a memory snapshot
 * can count tables per bucket).
 */

export const DEFAULT_BLOCK_TABLE_BUCKETS: readonly number[] = [4, 16, 64, 256, 1024, 4096];

export class BlockTable {
  private data: Int32Array;
  private size = 0;
  private readonly buckets: readonly number[];

  constructor(buckets: readonly number[] = DEFAULT_BLOCK_TABLE_BUCKETS) {
    if (buckets.length === 0) throw new Error('block table buckets: at least one capacity expected');
    buckets.forEach((b, i) => {
      if (!Number.isInteger(b) || b < 1) throw new Error(`block table buckets: ${b} is not a positive integer`);
      if (i > 0 && b <= buckets[i - 1]!) throw new Error('block table buckets must be strictly increasing');
    });
    this.buckets = buckets;
    this.data = new Int32Array(buckets[0]!);
  }

  /** The bucket capacity that holds `n` entries: the first that fits, past the last one doubling. */
  static capacityFor(n: number, buckets: readonly number[] = DEFAULT_BLOCK_TABLE_BUCKETS): number {
    for (const b of buckets) if (b >= n) return b;
    let c = buckets.at(-1)!;
    while (c < n) c *= 2;
    return c;
  }

  /** How many tables sit in each bucket (capacity -> count), for a memory snapshot. */
  static countByBucket(tables: Iterable<BlockTable>): Record<number, number> {
    const counts: Record<number, number> = {};
    for (const t of tables) counts[t.capacity] = (counts[t.capacity] ?? 0) + 1;
    return counts;
  }

  get length(): number {
    return this.size;
  }

  get capacity(): number {
    return this.data.length;
  }

  /** The length bucket this table is in: its capacity. */
  get bucket(): number {
    return this.data.length;
  }

  get(i: number): number {
    if (!Number.isInteger(i) || i < 0 || i >= this.size) throw new RangeError(`block table index ${i} out of 0..${this.size - 1}`);
    return this.data[i]!;
  }

  set(i: number, id: number): void {
    if (!Number.isInteger(i) || i < 0 || i >= this.size) throw new RangeError(`block table index ${i} out of 0..${this.size - 1}`);
    this.data[i] = id;
  }

  push(id: number): void {
    if (this.size === this.data.length) this.reserve(this.size + 1);
    this.data[this.size++] = id;
  }

  /** Grows the capacity to the bucket that holds `n` entries (a prompt's blocks in one step). */
  reserve(n: number): void {
    if (n <= this.data.length) return;
    const grown = new Int32Array(BlockTable.capacityFor(n, this.buckets));
    grown.set(this.data.subarray(0, this.size));
    this.data = grown;
  }

  /** The ids in logical order: a view, valid until the table next grows. */
  ids(): Int32Array {
    return this.data.subarray(0, this.size);
  }
}
