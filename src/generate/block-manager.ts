/**
 * Paged KV-cache bookkeeping, modelled on vLLM's block manager: each sequence holds a block table of
 * physical blocks, and a block is taken only when a token needs a slot in it, so no KV memory is ever
 * reserved for tokens that do not exist (the waste is under one block per sequence).
 *
 * - Admission (canAllocate / allocate) builds a prompt's table, reusing cached full blocks along its
 *   hash chain (prefix caching) and keeping a watermark of free blocks so running sequences can grow.
 * - Decoding (appendSlots) takes a new block when the last one is full, and copies a shared partial
 *   block before writing into it (copy-on-write), telling the caller which copy to make.
 * - fork shares a sequence's blocks with a new one (parallel sampling, beam search).
 * - free drops a sequence's references; it is also how the scheduler preempts (by recompute): the full
 *   blocks stay in the prefix cache, so re-admitting the same tokens finds them again.
 *
 * Pure logic: the KV values live elsewhere (KvCachePool), addressed by the ids handed out here.
 */
import { BlockPool } from './block-pool.js';
import { BlockTable, DEFAULT_BLOCK_TABLE_BUCKETS } from './block-table.js';
import { hashBlock, type BlockHash } from './prefix-hash.js';

export type AllocStatus = 'ok' | 'later' | 'never';

/** A copy the KV storage must make before the step's writes: block src's slots into block dst. */
export interface BlockCopy {
  src: number;
  dst: number;
}

/**
 * What the block manager needs of a sequence. The hashes of its full blocks are remembered per object
 * (the scheduler re-checks the head of its queue every step), so a sequence object's tokens must only
 * ever grow at the end, as a prompt followed by generated tokens does.
 */
export interface KvSequence {
  id: number;
  /** Every token whose KV the sequence holds once computed (prompt, then any generated so far). */
  readonly tokenIds: readonly number[];
  /** LoRA adapter: its KV differs from the base model's, so prefix-cache entries are per adapter. */
  adapter?: string | undefined;
}

export interface BlockManagerOptions {
  numBlocks: number;
  /** Token slots per block. */
  blockSize: number;
  /** Fraction of all blocks admission keeps free, for running sequences to grow into (vLLM: 0.01). */
  watermark?: number;
  /** Block-table capacities (see BlockTable). */
  buckets?: readonly number[];
  /** Share full blocks between sequences with the same prefix (default true). */
  enablePrefixCaching?: boolean;
}

export interface BlockManagerStats {
  blockSize: number;
  totalBlocks: number;
  /** Plain free and cached free. */
  freeBlocks: number;
  /** Free but still holding a prefix's KV. */
  cachedBlocks: number;
  usedBlocks: number;
  /** Token slots holding a token, over the used blocks (a shared block counts once). */
  usedSlots: number;
  /** usedBlocks x blockSize. */
  allocatedSlots: number;
  /** usedSlots / allocatedSlots; 1 when nothing is allocated (nothing is wasted). */
  utilization: number;
  /** Block-table capacity -> number of live tables with it. */
  tablesByBucket: Record<number, number>;
  /** Blocks used at least once since start (block-pool.ts `touched`): a host pool's resident share. */
  touchedBlocks: number;
}

interface SequenceBlocks {
  table: BlockTable;
  numTokens: number;
  adapter: string | undefined;
  /** Hash of the last full block: the parent of the next one's. */
  lastHash: BlockHash | undefined;
  /** Token ids in the last block while it is not full (tracked only with prefix caching). */
  partial: number[];
  /** Leading tokens found in the prefix cache when allocated. */
  computed: number;
}

export class BlockManager {
  readonly pool: BlockPool;
  readonly blockSize: number;
  readonly watermarkBlocks: number;
  readonly prefixCaching: boolean;
  private readonly buckets: readonly number[];
  private readonly seqs = new Map<number, SequenceBlocks>();
  /** Slots written per physical block; kept for free blocks too, so a revived cached block counts its tokens. */
  private readonly filled: Int32Array;
  /** Sum of `filled` over used blocks, kept as blocks change state so that stats() is O(tables). */
  private usedSlots = 0;
  /** Hashes of a sequence's leading full blocks, computed once per sequence object. */
  private readonly hashMemo = new WeakMap<KvSequence, BlockHash[]>();

  constructor(opts: BlockManagerOptions) {
    const watermark = opts.watermark ?? 0.01;
    if (!(watermark >= 0 && watermark < 1)) throw new Error(`watermark must be in [0, 1), got ${watermark}`);
    this.pool = new BlockPool(opts.numBlocks, opts.blockSize);
    this.blockSize = opts.blockSize;
    this.watermarkBlocks = Math.floor(watermark * opts.numBlocks);
    this.prefixCaching = opts.enablePrefixCaching ?? true;
    this.buckets = opts.buckets ?? DEFAULT_BLOCK_TABLE_BUCKETS;
    new BlockTable(this.buckets); // validates the buckets now rather than at the first admission
    this.filled = new Int32Array(opts.numBlocks);
  }

  /**
   * 'never': the sequence needs more blocks than the pool has. 'later': taking its blocks now would
   * leave fewer free than the watermark (waived when no block is in use, so a sequence that fits the
   * pool always runs eventually). Blocks found in the prefix cache need no new block; a hit on a
   * cached free block still takes it out of the free count.
   */
  canAllocate(seq: KvSequence): AllocStatus {
    const tokens = seq.tokenIds;
    const need = this.blocksFor(tokens.length);
    if (need > this.pool.numBlocks) return 'never';
    const { hits, revived } = this.prefixHits(seq, tokens);
    const take = need - hits + revived;
    const free = this.pool.numFree;
    if (take > free) return 'later';
    return free - take >= this.watermarkBlocks || this.pool.numUsed === 0 ? 'ok' : 'later';
  }

  /**
   * Builds the sequence's block table for all its tokens, reusing cached full blocks along its prefix.
   * Returns how many leading tokens already have their KV (a multiple of blockSize, and less than the
   * length: the last token is always recomputed, its logits are needed). Ignores the watermark (that is
   * canAllocate's policy) but throws when the pool cannot hold the sequence.
   */
  allocate(seq: KvSequence): number {
    if (this.seqs.has(seq.id)) throw new Error(`sequence ${seq.id} already has blocks`);
    const tokens = seq.tokenIds;
    const n = tokens.length;
    const bs = this.blockSize;
    const need = this.blocksFor(n);
    const numFull = Math.floor(n / bs);
    const { hits, revived } = this.prefixHits(seq, tokens);
    const hashes = this.prefixCaching ? this.hashes(seq, tokens, numFull) : [];
    if (need - hits + revived > this.pool.numFree) {
      throw new Error(`sequence ${seq.id} needs ${need - hits + revived} free KV blocks, ${this.pool.numFree} are`);
    }
    const table = new BlockTable(this.buckets);
    table.reserve(need);
    // Hits first: taking fresh blocks may evict cached ones, and must not evict the ones being hit.
    for (let i = 0; i < hits; i++) table.push(this.lookup(hashes[i]!));
    for (let i = hits; i < need; i++) {
      const id = this.takeFresh();
      this.write(id, Math.min(bs, n - i * bs));
      table.push(id);
      if (i < numFull && this.prefixCaching) this.pool.register(id, hashes[i]!);
    }
    this.seqs.set(seq.id, {
      table,
      numTokens: n,
      adapter: seq.adapter,
      lastHash: numFull > 0 ? hashes[numFull - 1] : undefined,
      partial: this.prefixCaching ? tokens.slice(numFull * bs) : [],
      computed: hits * bs,
    });
    return hits * bs;
  }

  /** Whether `n` more tokens fit (new blocks, plus one for copy-on-write of a shared last block). */
  canAppendSlots(seqId: number, n: number): boolean {
    return this.blocksToAppend(this.get(seqId), n) <= this.pool.numFree;
  }

  /** Whether every listed sequence can get slots for one more token at once (no preemption needed). */
  canAppendEach(seqIds: readonly number[]): boolean {
    let need = 0;
    for (const id of seqIds) need += this.blocksToAppend(this.get(id), 1);
    return need <= this.pool.numFree;
  }

  /**
   * Reserves slots for the tokens (their KV is written this step). Returns the copies the KV storage
   * must make first: when the last block is partial and shared (after a fork), the writer gets its own
   * copy. A block that becomes full is registered in the prefix cache. All or nothing: throws, changing
   * nothing, when the pool cannot hold them.
   */
  appendSlots(seqId: number, tokenIds: readonly number[]): BlockCopy[] {
    const s = this.get(seqId);
    const bs = this.blockSize;
    const need = this.blocksToAppend(s, tokenIds.length);
    if (need > this.pool.numFree) throw new Error(`sequence ${seqId} needs ${need} free KV blocks, ${this.pool.numFree} are`);
    const copies: BlockCopy[] = [];
    if (tokenIds.length > 0 && s.numTokens % bs !== 0) {
      const last = s.table.length - 1;
      const src = s.table.get(last);
      if (this.pool.refCount(src) > 1) {
        const dst = this.takeFresh();
        this.write(dst, this.filled[src]!);
        this.pool.release(src); // still referenced by its other sharers
        s.table.set(last, dst);
        copies.push({ src, dst });
      }
    }
    for (const token of tokenIds) {
      if (s.numTokens % bs === 0) s.table.push(this.takeFresh());
      const id = s.table.get(s.table.length - 1);
      this.write(id, 1);
      s.numTokens++;
      if (!this.prefixCaching) continue;
      s.partial.push(token);
      if (s.partial.length === bs) {
        s.lastHash = hashBlock(s.lastHash, s.partial, s.adapter);
        this.pool.register(id, s.lastHash);
        s.partial = [];
      }
    }
    return copies;
  }

  /** The child shares every block of the parent (one more reference each); writes then copy on write. */
  fork(parentId: number, childId: number): void {
    const p = this.get(parentId);
    if (this.seqs.has(childId)) throw new Error(`sequence ${childId} already has blocks`);
    const table = new BlockTable(this.buckets);
    table.reserve(p.table.length);
    for (const id of p.table.ids()) {
      this.pool.retain(id);
      table.push(id);
    }
    this.seqs.set(childId, { ...p, table, partial: [...p.partial] });
  }

  /**
   * Drops the sequence's references (finished, failed, or preempted to be recomputed); unknown ids are
   * ignored. Full blocks stay findable in the prefix cache, released last block first so that, in the
   * LRU, a prefix's tail is evicted before its head (which more requests share). `discardPrefix` when
   * the sequence's KV was never computed (a failed model run): its blocks must not be found by hash.
   */
  free(seqId: number, opts: { discardPrefix?: boolean } = {}): void {
    const s = this.seqs.get(seqId);
    if (!s) return;
    const ids = s.table.ids();
    for (let i = ids.length - 1; i >= 0; i--) {
      const id = ids[i]!;
      if (this.pool.refCount(id) === 1) this.usedSlots -= this.filled[id]!;
      this.pool.release(id, opts.discardPrefix);
    }
    this.seqs.delete(seqId);
  }

  has(seqId: number): boolean {
    return this.seqs.has(seqId);
  }

  blockTable(seqId: number): BlockTable {
    return this.get(seqId).table;
  }

  /** Tokens with a slot reserved. */
  numTokens(seqId: number): number {
    return this.get(seqId).numTokens;
  }

  /** Leading tokens whose KV was found in the prefix cache at allocation (what allocate returned). */
  numComputedTokens(seqId: number): number {
    return this.get(seqId).computed;
  }

  stats(): BlockManagerStats {
    const usedBlocks = this.pool.numUsed;
    const allocatedSlots = usedBlocks * this.blockSize;
    return {
      blockSize: this.blockSize,
      totalBlocks: this.pool.numBlocks,
      freeBlocks: this.pool.numFree,
      cachedBlocks: this.pool.numCached,
      usedBlocks,
      usedSlots: this.usedSlots,
      allocatedSlots,
      utilization: allocatedSlots === 0 ? 1 : this.usedSlots / allocatedSlots,
      tablesByBucket: BlockTable.countByBucket([...this.seqs.values()].map((s) => s.table)),
      touchedBlocks: this.pool.touched,
    };
  }

  private get(seqId: number): SequenceBlocks {
    const s = this.seqs.get(seqId);
    if (!s) throw new Error(`sequence ${seqId} has no blocks`);
    return s;
  }

  private blocksFor(tokens: number): number {
    return Math.ceil(tokens / this.blockSize);
  }

  /** Full blocks a prompt of n tokens may take from the cache: all but the one holding its last token. */
  private maxHitBlocks(n: number): number {
    return n === 0 ? 0 : Math.floor((n - 1) / this.blockSize);
  }

  /** Leading blocks found in the prefix cache (stopping at the first miss), and how many of them are free. */
  private prefixHits(seq: KvSequence, tokens: readonly number[]): { hits: number; revived: number } {
    let hits = 0;
    let revived = 0;
    if (!this.prefixCaching) return { hits, revived };
    for (const max = this.maxHitBlocks(tokens.length); hits < max; hits++) {
      const id = this.pool.peek(this.hashes(seq, tokens, hits + 1)[hits]!);
      if (id === undefined) break;
      if (this.pool.refCount(id) === 0) revived++;
    }
    return { hits, revived };
  }

  /** The sequence's remembered block hashes, extended to at least `count` blocks. */
  private hashes(seq: KvSequence, tokens: readonly number[], count: number): BlockHash[] {
    let hs = this.hashMemo.get(seq);
    if (!hs) this.hashMemo.set(seq, (hs = []));
    const bs = this.blockSize;
    for (let i = hs.length; i < count; i++) hs.push(hashBlock(hs[i - 1], tokens.slice(i * bs, (i + 1) * bs), seq.adapter));
    return hs;
  }

  private blocksToAppend(s: SequenceBlocks, n: number): number {
    if (n <= 0) return 0;
    const fresh = this.blocksFor(s.numTokens + n) - s.table.length;
    const partial = s.numTokens % this.blockSize !== 0;
    const cow = partial && this.pool.refCount(s.table.get(s.table.length - 1)) > 1 ? 1 : 0;
    return fresh + cow;
  }

  private takeFresh(): number {
    const id = this.pool.allocate();
    this.filled[id] = 0;
    return id;
  }

  private lookup(hash: BlockHash): number {
    const id = this.pool.lookup(hash)!;
    if (this.pool.refCount(id) === 1) this.usedSlots += this.filled[id]!; // revived from cached free
    return id;
  }

  private write(id: number, slots: number): void {
    this.filled[id]! += slots;
    this.usedSlots += slots;
  }
}
