/**
 * The physical KV blocks (ids 0..numBlocks-1, blockSize token slots each) as bookkeeping: who holds a
 * reference, which are free, and which full blocks are findable by content hash (the prefix cache).
 *
 * A block is in exactly one of three states:
 *   used         refCount > 0 (may carry a hash)
 *   cached free  refCount 0, carries a hash: its KV is still valid, so it stays findable by hash and is
 *                only reused for other content when nothing plainly free is left, least recently
 *                freed first (an LRU list, intrusive so that every operation is O(1) and allocates
 *                nothing)
 *   plain free   refCount 0, no hash
 * Both free kinds count as free: a cached block can be taken at any time.
 */
import type { BlockHash } from './prefix-hash.js';

const NONE = -1;

export class BlockPool {
  private readonly refCounts: Int32Array;
  private readonly hashes: (BlockHash | undefined)[];
  private readonly byHash = new Map<BlockHash, number>();
  /** Plain free ids; popped from the end, so filled in reverse to hand out 0, 1, 2, ... first. */
  private readonly freeList: number[];
  /** LRU of cached free blocks: head = least recently freed (evicted first), tail = most recent. */
  private readonly prev: Int32Array;
  private readonly next: Int32Array;
  private head = NONE;
  private tail = NONE;
  private cachedFree = 0;
  /**
   * Blocks ever handed out (ids below it; plain free ones go out in id order). A host pool's pages are
   * first written when their block is: resident memory grows with this until every block has been used
   * once, which is the pool warming up, bounded by its size, not a leak (the leak check expects it).
   */
  private everUsed = 0;

  constructor(
    readonly numBlocks: number,
    readonly blockSize: number,
  ) {
    if (!Number.isInteger(numBlocks) || numBlocks < 1) throw new Error(`numBlocks must be a positive integer, got ${numBlocks}`);
    if (!Number.isInteger(blockSize) || blockSize < 1) throw new Error(`blockSize must be a positive integer, got ${blockSize}`);
    this.refCounts = new Int32Array(numBlocks);
    this.hashes = new Array<BlockHash | undefined>(numBlocks).fill(undefined);
    this.freeList = Array.from({ length: numBlocks }, (_, i) => numBlocks - 1 - i);
    this.prev = new Int32Array(numBlocks).fill(NONE);
    this.next = new Int32Array(numBlocks).fill(NONE);
  }

  /** Free blocks of both kinds: what an allocation can take. */
  get numFree(): number {
    return this.freeList.length + this.cachedFree;
  }

  /** Unreferenced blocks kept for their hash (a subset of numFree). */
  get numCached(): number {
    return this.cachedFree;
  }

  get numUsed(): number {
    return this.numBlocks - this.numFree;
  }

  refCount(id: number): number {
    return this.refCounts[this.check(id)]!;
  }

  hashOf(id: number): BlockHash | undefined {
    return this.hashes[this.check(id)];
  }

  /** A fresh block with one reference: a plain free one, else the least recently freed cached one. */
  allocate(): number {
    let id = this.freeList.pop();
    if (id === undefined) {
      if (this.head === NONE) throw new Error('KV block pool exhausted');
      id = this.head;
      this.unlink(id);
      // Its content is about to be overwritten: it must no longer be found by its old hash.
      this.byHash.delete(this.hashes[id]!);
      this.hashes[id] = undefined;
    }
    this.refCounts[id] = 1;
    if (id >= this.everUsed) this.everUsed = id + 1;
    return id;
  }

  /** Blocks below this id have been handed out at least once (their memory has been written). */
  get touched(): number {
    return this.everUsed;
  }

  /** The block cached under `hash` without taking a reference (for admission checks). */
  peek(hash: BlockHash): number | undefined {
    return this.byHash.get(hash);
  }

  /** The block cached under `hash`, with one more reference; a cached free block is revived. */
  lookup(hash: BlockHash): number | undefined {
    const id = this.byHash.get(hash);
    if (id === undefined) return undefined;
    if (this.refCounts[id] === 0) this.unlink(id);
    this.refCounts[id]!++;
    return id;
  }

  /** One more reference to a used block (a forked sequence sharing it). */
  retain(id: number): void {
    if (this.refCounts[this.check(id)] === 0) throw new Error(`block ${id} is free; retain needs a used block`);
    this.refCounts[id]!++;
  }

  /**
   * Drops one reference; at zero a hashed block becomes cached free (most recent), others plain free.
   * `forget`: at zero, drop the hash too (its KV is not what the hash promises, e.g. a failed run).
   */
  release(id: number, forget = false): void {
    if (this.refCounts[this.check(id)] === 0) throw new Error(`block ${id} released more often than referenced`);
    if (--this.refCounts[id]! > 0) return;
    const hash = this.hashes[id];
    if (hash !== undefined && forget) {
      this.byHash.delete(hash);
      this.hashes[id] = undefined;
    }
    if (this.hashes[id] === undefined) this.freeList.push(id);
    else this.pushTail(id);
  }

  /**
   * Makes a full used block findable by `hash`. Returns false when another block already holds that
   * content (two sequences computed it independently): the first stays canonical and this one stays
   * unhashed, to go plain free when released.
   */
  register(id: number, hash: BlockHash): boolean {
    if (this.refCounts[this.check(id)] === 0) throw new Error(`block ${id} is free; only a used block can be registered`);
    if (this.hashes[id] !== undefined) return this.hashes[id] === hash;
    if (this.byHash.has(hash)) return false;
    this.hashes[id] = hash;
    this.byHash.set(hash, id);
    return true;
  }

  private check(id: number): number {
    if (!Number.isInteger(id) || id < 0 || id >= this.numBlocks) throw new Error(`no block ${id} in a pool of ${this.numBlocks}`);
    return id;
  }

  private pushTail(id: number): void {
    this.prev[id] = this.tail;
    this.next[id] = NONE;
    if (this.tail === NONE) this.head = id;
    else this.next[this.tail] = id;
    this.tail = id;
    this.cachedFree++;
  }

  private unlink(id: number): void {
    const p = this.prev[id]!;
    const n = this.next[id]!;
    if (p === NONE) this.head = n;
    else this.next[p] = n;
    if (n === NONE) this.tail = p;
    else this.prev[n] = p;
    this.prev[id] = NONE;
    this.next[id] = NONE;
    this.cachedFree--;
  }
}
