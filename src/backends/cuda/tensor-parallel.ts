/**
 * Tensor parallelism for the CUDA decoder (RAGGUARD_TENSOR_PARALLEL, issue 30), the pure part: how a
 * checkpoint is split over `tp` ranks (one GPU each), Megatron-style, and what each rank loads.
 *
 *   attention  rank r holds query heads [r nh/tp, (r+1) nh/tp) and kv heads [r nkv/tp, (r+1) nkv/tp): its rows
 *              of the fused q|k|v (and biases) are column-parallel (no communication); its KV pool holds
 *              its kv heads' share of every block (the block manager, tables and guards stay one, on the
 *              host: every rank gets the same packed step); o is row-parallel (the rank's q columns), its
 *              partial sums all-reduced
 *   MLP        gate and up rows [r I/tp, (r+1) I/tp) column-parallel, down's matching columns row-parallel,
 *              all-reduced
 *   embedding and head  replicated (a 72B model's are 2.5 GB of its 145: the ranks then sample the same
 *              token from the same logits without a gather)
 *
 * So a layer costs two all-reduces of [tokens, hidden] (NCCL, NCCL_NVLS_ENABLE=0 wherever it starts). A
 * column slice of a row-major weight is not contiguous in the file: a load is then one strided piece
 * (rows of `elems` values every `fileRowStride` elements), which the native loader reads row by row.
 */
import { CheckpointError, WeightKind, weightElems, type CudaModelConfig, type TensorLoad, type WeightKindId } from './hf-checkpoint.js';

export const TENSOR_PARALLEL_SIZES = [1, 2, 4, 8] as const;
export type TensorParallel = (typeof TENSOR_PARALLEL_SIZES)[number];

/** What one rank holds. */
export interface RankShard {
  rank: number;
  /** Its query heads and kv heads: [start, end). */
  heads: [number, number];
  kvHeads: [number, number];
  /** Its slice of the intermediate size. */
  inter: [number, number];
  /** The rank's own decoder shape (what its native engine is created with). */
  config: CudaModelConfig;
}

export interface ShardPlan {
  tp: number;
  ranks: RankShard[];
}

/** Splits `c` over `tp` ranks, or refuses naming the dimension that does not divide. */
export function shardPlan(c: CudaModelConfig, tp: number): ShardPlan {
  if (!(TENSOR_PARALLEL_SIZES as readonly number[]).includes(tp)) throw new CheckpointError(`tensor parallel ${tp}: 1, 2, 4 or 8 GPUs`);
  const need = (n: number, what: string) => {
    if (n % tp !== 0) throw new CheckpointError(`tensor parallel ${tp}: ${what} ${n} does not divide over ${tp} GPUs`);
    return n / tp;
  };
  const nh = need(c.numHeads, 'num_attention_heads');
  const nkv = need(c.numKvHeads, 'num_key_value_heads');
  const inter = need(c.intermediateSize, 'intermediate_size');
  if (inter % 32 !== 0 || (nh * c.headDim) % 32 !== 0) throw new CheckpointError(`tensor parallel ${tp}: a rank's intermediate (${inter}) and q width (${nh * c.headDim}) must be multiples of 32`);
  const ranks = Array.from({ length: tp }, (_, r): RankShard => ({
    rank: r,
    heads: [r * nh, (r + 1) * nh],
    kvHeads: [r * nkv, (r + 1) * nkv],
    inter: [r * inter, (r + 1) * inter],
    config: { ...c, numHeads: nh, numKvHeads: nkv, intermediateSize: inter },
  }));
  return { tp, ranks };
}

/**
 * One piece of a tensor for a rank: `rows` rows of `elems` values, `fileRowStride` values apart in the file
 * from `fileOffset` (bytes) on, to element `dstOffset` of the rank's fused weight.
 */
export interface ShardLoad extends Omit<TensorLoad, 'count'> {
  rows: number;
  elems: number;
  fileRowStride: number;
}

const BYTES: Record<TensorLoad['dtype'], number> = { F32: 4, F16: 2, BF16: 2 };

/**
 * The pieces of a full checkpoint's load (hf-checkpoint.ts TensorLoad, placed in the full fused weight)
 * that rank `s` holds, placed in the rank's fused weight; none where the tensor is another rank's.
 */
export function rankLoads(full: CudaModelConfig, s: RankShard, t: TensorLoad): ShardLoad[] {
  const c = s.config;
  const H = full.hiddenSize, D = full.headDim;
  const q = full.numHeads * D, kv = full.numKvHeads * D, I = full.intermediateSize;
  const qr = c.numHeads * D, kvr = c.numKvHeads * D, Ir = c.intermediateSize;
  const e = BYTES[t.dtype];
  const piece = (dstOffset: number, srcElem: number, rows: number, elems: number, stride: number): ShardLoad =>
    ({ name: t.name, kind: t.kind, layer: t.layer, dstOffset, file: t.file, fileOffset: t.fileOffset + (srcElem - t.dstOffset) * e, rows, elems, fileRowStride: stride, dtype: t.dtype });
  // Rows [a, b) of the full fused weight (rows `width` long) that fall in this load, to the rank's row `to`.
  const rowsOf = (width: number, a: number, b: number, to: number): ShardLoad[] => {
    const first = t.dstOffset / width, last = first + t.count / width;
    const lo = Math.max(a, first), hi = Math.min(b, last);
    return lo < hi ? [piece((to + lo - a) * width, lo * width, 1, (hi - lo) * width, (hi - lo) * width)] : [];
  };
  switch (t.kind) {
    case WeightKind.qkv: case WeightKind.qkvBias: {
      const w = t.kind === WeightKind.qkv ? H : 1;
      const [h0] = s.heads, [k0] = s.kvHeads;
      return [
        ...rowsOf(w, h0 * D, h0 * D + qr, 0),
        ...rowsOf(w, q + k0 * D, q + k0 * D + kvr, qr),
        ...rowsOf(w, q + kv + k0 * D, q + kv + k0 * D + kvr, qr + kvr),
      ];
    }
    case WeightKind.gateUp: {
      const [i0] = s.inter;
      return [...rowsOf(H, i0, i0 + Ir, 0), ...rowsOf(H, I + i0, I + i0 + Ir, Ir)];
    }
    case WeightKind.o: case WeightKind.down: {
      // Row-parallel: every output row, the rank's columns of it.
      const width = t.kind === WeightKind.o ? q : I;
      const c0 = t.kind === WeightKind.o ? s.heads[0] * D : s.inter[0];
      const cols = t.kind === WeightKind.o ? qr : Ir;
      return [piece(0, t.dstOffset + c0, t.count / width, cols, width)];
    }
    default:
      // Embedding, head and norms: replicated.
      return [piece(t.dstOffset, t.dstOffset, 1, t.count, t.count)];
  }
}

/** Elements a rank's fused weight of `kind` holds (its shard's weight_elems). */
export function rankWeightElems(s: RankShard, kind: WeightKindId): number {
  return weightElems(s.config, kind);
}

/**
 * The guard's budget over the ranks: each rank's free device bytes less what it holds besides the KV pool;
 * the pool is one (every rank holds its heads' share of every block), so the smallest rank's room decides.
 */
export function budgetOverRanks(free: readonly number[], fixed: readonly number[], kvBytesPerBlockPerRank: number): { blocks: number; limitingRank: number } {
  let blocks = Number.POSITIVE_INFINITY, limitingRank = 0;
  free.forEach((f, r) => {
    const b = Math.floor(Math.max(0, f - fixed[r]!) / kvBytesPerBlockPerRank);
    if (b < blocks) { blocks = b; limitingRank = r; }
  });
  return { blocks: Number.isFinite(blocks) ? blocks : 0, limitingRank };
}

/** Sums the ranks' partial outputs in place into each (what an all-reduce does; the CPU tests' stand-in for NCCL's). */
export function allReduceSum(parts: Float32Array[]): void {
  const n = parts[0]!.length;
  for (let i = 0; i < n; i++) {
    let s = 0;
    for (const p of parts) s += p[i]!;
    for (const p of parts) p[i] = s;
  }
}
