/**
 * Physical KV storage for the paged cache on the CPU: per layer, one key and one value array laid out
 * [block][kv_head][slot][head_dim]. A sequence's token t lives in block table[t / blockSize], slot
 * t % blockSize; nothing is stored for tokens that do not exist.
 *
 * The exported decoder takes contiguous past tensors, so a step whose batch changed gathers the
 * batch's blocks into [batch, kv_heads, P, head_dim] (rows right-aligned with padding masked, or
 * left-aligned, as the decoder's layout wants), and the new tokens' present KV is scattered back into
 * their slots.
 *
 * Elements are the model's KV type: float32, or float16 kept as raw 16-bit words (Uint16Array, what
 * ONNX Runtime takes and gives for float16 tensors); gather and scatter only move them.
 */

import { Pacer } from '../../runtime/pacer.js';
import { kvArray, kvBytesPerToken, type KvArray, type KvDtype, type KvShape } from '../../generate/decoder-shape.js';

/** What gather needs of a sequence: its physical blocks in logical order, and how many tokens to read. */
export interface GatherRow {
  blocks: ArrayLike<number>;
  length: number;
}

export class KvCachePool {
  /** [layer * 2 + (0 key | 1 value)] */
  private readonly data: KvArray[];
  private readonly blockStride: number;
  private readonly headStride: number;

  constructor(
    readonly shape: KvShape,
    readonly numBlocks: number,
    readonly blockSize: number,
  ) {
    this.headStride = blockSize * shape.headDim;
    this.blockStride = shape.numKvHeads * this.headStride;
    // Written once now, so that the pool is resident from the start (a fresh zeroed buffer is only
    // mapped, and would otherwise grow the process page by page as blocks are first used).
    this.data = Array.from({ length: 2 * shape.numLayers }, () => kvArray(shape.kvDtype, numBlocks * this.blockStride).fill(0));
  }

  /** Bytes of the whole pool (keys and values, all layers). */
  get bytes(): number {
    return this.data.reduce((s, a) => s + a.byteLength, 0);
  }

  /** Bytes one token slot takes across layers. */
  get bytesPerSlot(): number {
    return kvBytesPerToken(this.shape);
  }

  /**
   * Past tensors' data for a batch: for each layer key and value, [rows, kv_heads, width, head_dim]
   * with row r's `length` tokens right-aligned (positions width - length .. width - 1) or left-aligned
   * (positions 0 .. length - 1); the rest is zero.
   */
  gather(rows: readonly GatherRow[], width: number, placement: 'right' | 'left' = 'right'): KvArray[] {
    const { numKvHeads: H, headDim: D } = this.shape;
    const outs = this.data.map(() => kvArray(this.shape.kvDtype, rows.length * H * width * D));
    this.gatherInto(rows, width, placement, outs);
    return outs;
  }

  /** gather into given arrays (one per layer key/value); positions outside the rows' tokens are left as they are. */
  gatherInto(rows: readonly GatherRow[], width: number, placement: 'right' | 'left', outs: readonly KvArray[]): void {
    for (const _ of this.gatherSteps(rows, width, placement, outs));
  }

  /**
   * gatherInto in slices of about `sliceMs` of copying, each on its own turn of the event loop. A batch's
   * past can be a gigabyte (32 rows of 1600 tokens of a 24-layer decoder in float32): copied in one go on
   * the main thread, it held health probes and load-shedding replies for up to a second. Nothing moves
   * the pool's blocks meanwhile: only the runner writes them, and it is inside this step. Given a
   * Pacer, its current slice is continued (the work before the gather counts against it).
   */
  async gatherIntoPaced(rows: readonly GatherRow[], width: number, placement: 'right' | 'left', outs: readonly KvArray[], pace: Pacer | number = 8): Promise<void> {
    const pacer = typeof pace === 'number' ? new Pacer(pace) : pace;
    for (const _ of this.gatherSteps(rows, width, placement, outs)) await pacer.pace();
  }

  /** The gather's copies, pausing after each row of each layer's keys or values. */
  private *gatherSteps(rows: readonly GatherRow[], width: number, placement: 'right' | 'left', outs: readonly KvArray[]): Generator<void> {
    const { numKvHeads: H, headDim: D } = this.shape;
    const bs = this.blockSize;
    for (let i = 0; i < this.data.length; i++) {
      const src = this.data[i]!;
      const out = outs[i]!;
      if (out.length !== rows.length * H * width * D) throw new Error('gather target has an unexpected size');
      for (let r = 0; r < rows.length; r++) {
        const row = rows[r]!;
        const start = placement === 'right' ? width - row.length : 0;
        for (let h = 0; h < H; h++) {
          const dstBase = ((r * H + h) * width + start) * D;
          for (let t = 0; t < row.length; t += bs) {
            const n = Math.min(bs, row.length - t);
            const s = row.blocks[t / bs]! * this.blockStride + h * this.headStride;
            out.set(src.subarray(s, s + n * D), dstBase + t * D);
          }
        }
        yield;
      }
    }
  }

  /**
   * Stores `count` tokens of a model output into a sequence's slots.
   * present: one [rows, kv_heads, width, head_dim] array per layer key/value (as gather's layout);
   * reads row `row` positions srcPos..srcPos+count-1, writes the sequence's tokens dstToken.. on.
   */
  scatter(present: readonly KvArray[], rows: number, width: number, row: number, srcPos: number,
    blocks: ArrayLike<number>, dstToken: number, count: number): void {
    const { numKvHeads: H, headDim: D } = this.shape;
    const bs = this.blockSize;
    if (present.length !== this.data.length) throw new Error('one present tensor per layer key/value expected');
    present.forEach((p, i) => {
      if (p.length !== rows * H * width * D) throw new Error('present tensor has an unexpected size');
      const dst = this.data[i]!;
      for (let h = 0; h < H; h++) {
        const srcBase = ((row * H + h) * width + srcPos) * D;
        for (let k = 0; k < count;) {
          const t = dstToken + k;
          const off = t % bs;
          const n = Math.min(bs - off, count - k);
          const d = blocks[Math.floor(t / bs)]! * this.blockStride + h * this.headStride + off * D;
          dst.set(p.subarray(srcBase + k * D, srcBase + (k + n) * D), d);
          k += n;
        }
      }
    });
  }

  /** Copy-on-write: duplicates a shared block before one of its sharers writes into it. */
  copyBlock(src: number, dst: number): void {
    for (const a of this.data) a.copyWithin(dst * this.blockStride, src * this.blockStride, (src + 1) * this.blockStride);
  }
}
