/**
 * The pure parts of the CUDA backend, tested on the CPU: how a step is packed for the kernels, which
 * CUDA graph bucket a decode step replays, and how many device bytes the backend allocates for a
 * configuration (the accountant's figures, the same ones the native side carves: ragguard_cuda.cu
 * rg_plan; the GPU check asserts they agree).
 *
 * A step is a list of items, each a sequence feeding `tokens` from position `start` over its block
 * table. Packed layout (int32 words; StepView in ragguard_cuda.cu):
 *   [T, S, W, P]  token_ids[T] positions[T] slots[T] token_seq[T]
 *   seq_lens[S] last_token[S] top_k[S] seed_lo[S] seed_hi[S] sample_step[S] temperature[S] top_p[S]
 *   lora[S] repetition[S] presence[S] frequency[S] pen_start[S] pen_count[S] mask_at[S]
 *   block_tables[S * W]
 *   pen_tokens[P] pen_counts[P]
 *   masks[R * ceil(vocab / 32)]
 * A token's slot is block_table[pos / block_size] * block_size + pos % block_size: the paged KV
 * cache's address of its key and value. lora[s] is the sequence's entry in the device LoRA slots
 * (cuda-lora.ts; 0: the base model), so one step mixes rows of different adapters and base rows.
 * Penalties: row s's logits of pen_tokens[pen_start[s] ..][: pen_count[s]] are divided (positive) or
 * multiplied (negative) by repetition[s] (0 or 1: off), then lowered by presence[s] + frequency[s] x
 * their pen_counts (occurrences in the output; 0 for a token seen only in the prompt), as sampler.ts
 * applies them on the CPU. A row without penalties has no entries, so P is 0 in most steps.
 * Constrained decoding (structured/token-mask.ts): row s with mask_at[s] = k > 0 samples only among the
 * tokens whose bit is set in the (k-1)-th of the R masks (bit id % 32 of word id / 32; the end of generation
 * included only where the grammar allows it), which the sample kernel applies to the logits after the
 * penalties; 0: no mask (padding rows too). R is the count of rows with a mask, so free steps carry none.
 */
import type { CudaModelConfig, ModelDtype } from './hf-checkpoint.js';
import { WeightKind, weightElems, type WeightKindId } from './hf-checkpoint.js';
import { loraSlots, slotCapacity } from '../../generate/lora.js';

export interface DeviceSampling {
  /** 0: greedy. */
  temperature: number;
  /** 0 or >= vocab: no cut. */
  topK: number;
  /** 1: no cut. */
  topP: number;
  seed: number;
  /** The output position the token is drawn for (the same draw after a preemption). */
  step: number;
  /** Absent: none (penalty-tally.ts builds them). */
  penalties?: DevicePenalties;
}

/** A row's penalties: its settings and the distinct tokens they act on, each with its count in the output. */
export interface DevicePenalties {
  /** 1: off. */
  repetition: number;
  presence: number;
  frequency: number;
  tokens: ArrayLike<number>;
  counts: ArrayLike<number>;
}

export interface StepItem {
  tokens: readonly number[];
  /** Position of tokens[0] (tokens already in the cache before it). */
  start: number;
  blocks: ArrayLike<number>;
  sampling: DeviceSampling;
  /** Entry of the sequence's adapter in the device LoRA slots; 0 or absent: the base model. */
  lora?: number;
  /** Constrained decoding: the tokens the row may sample (maskWords(vocab) words); absent: any. */
  mask?: Uint32Array;
}

export const HEADER_WORDS = 4;
export const SEQ_ARRAYS = 15;
/** The per-sequence array of mask references. */
const MASK_AT = 14;

/** Words of one token mask over a vocabulary. */
export const maskWords = (vocab: number) => Math.ceil(vocab / 32);

/** Words of a packed step of T tokens, S sequences, block tables W wide, P penalty entries and `masks` mask words in all. */
export function stepWords(T: number, S: number, W: number, P = 0, masks = 0): number {
  return HEADER_WORDS + 4 * T + SEQ_ARRAYS * S + S * W + 2 * P + masks;
}

/**
 * The most penalty entries a step can carry (the native side's staging is sized for it): a row's
 * distinct tokens are at most its positions and at most the vocabulary.
 */
export function maxPenaltyEntries(maxSeqs: number, maxBlocksPerSeq: number, blockSize: number, vocab: number): number {
  return maxSeqs * Math.min(vocab, maxBlocksPerSeq * blockSize);
}

/** Packs items into the kernels' step layout; `blockSize` maps positions to slots. */
export function packStep(items: readonly StepItem[], blockSize: number): Int32Array {
  const S = items.length;
  let T = 0;
  let W = 1;
  let P = 0;
  let M = 0;
  let width: number | undefined;
  for (const it of items) {
    if (it.mask) {
      if (width !== undefined && it.mask.length !== width) throw new Error('token masks of different widths in one step');
      width = it.mask.length;
      M += width;
    }
    const pen = it.sampling.penalties;
    if (pen) {
      if (pen.tokens.length !== pen.counts.length) throw new Error('penalty tokens and counts differ in length');
      P += pen.tokens.length;
    }
    if (it.tokens.length === 0) throw new Error('a step item feeds no token');
    const end = it.start + it.tokens.length;
    const need = Math.ceil(end / blockSize);
    if (it.blocks.length < need) throw new Error(`block table of ${it.blocks.length} blocks cannot hold ${end} positions`);
    T += it.tokens.length;
    W = Math.max(W, need);
  }
  const words = new Int32Array(stepWords(T, S, W, P, M));
  const f32 = new Float32Array(words.buffer);
  words[0] = T;
  words[1] = S;
  words[2] = W;
  words[3] = P;
  const ids = HEADER_WORDS, pos = ids + T, slots = pos + T, tseq = slots + T;
  const seqBase = tseq + T;
  const arr = (k: number) => seqBase + k * S;
  const penTokens = arr(SEQ_ARRAYS) + S * W;
  const masks = penTokens + 2 * P;
  let masked = 0;
  let entry = 0;
  let t = 0;
  items.forEach((it, s) => {
    for (let i = 0; i < it.tokens.length; i++, t++) {
      const p = it.start + i;
      words[ids + t] = it.tokens[i]!;
      words[pos + t] = p;
      words[slots + t] = it.blocks[Math.floor(p / blockSize)]! * blockSize + (p % blockSize);
      words[tseq + t] = s;
    }
    const sp = it.sampling;
    words[arr(0) + s] = it.start + it.tokens.length;
    words[arr(1) + s] = t - 1;
    words[arr(2) + s] = Math.max(0, Math.floor(sp.topK));
    words[arr(3) + s] = sp.seed | 0;
    words[arr(4) + s] = Math.floor(sp.seed / 2 ** 32) | 0;
    words[arr(5) + s] = sp.step;
    f32[arr(6) + s] = sp.temperature;
    f32[arr(7) + s] = sp.topP;
    words[arr(8) + s] = it.lora ?? 0;
    const pen = sp.penalties;
    if (pen && pen.tokens.length > 0) {
      f32[arr(9) + s] = pen.repetition;
      f32[arr(10) + s] = pen.presence;
      f32[arr(11) + s] = pen.frequency;
      words[arr(12) + s] = entry;
      words[arr(13) + s] = pen.tokens.length;
      for (let i = 0; i < pen.tokens.length; i++, entry++) {
        words[penTokens + entry] = pen.tokens[i]!;
        words[penTokens + P + entry] = pen.counts[i]!;
      }
    }
    if (it.mask) {
      words.set(new Int32Array(it.mask.buffer, it.mask.byteOffset, it.mask.length), masks + masked * it.mask.length);
      words[arr(MASK_AT) + s] = ++masked;
    }
    const table = arr(SEQ_ARRAYS) + s * W;
    const used = Math.ceil((it.start + it.tokens.length) / blockSize);
    for (let b = 0; b < used; b++) words[table + b] = it.blocks[b]!;
  });
  return words;
}

/**
 * Batch sizes whose decode steps are captured as CUDA graphs, as vLLM's capture sizes: 1, 2, 4, then
 * every multiple of 8, up to `max`.
 */
export function graphBuckets(max: number): number[] {
  const out: number[] = [];
  for (const b of [1, 2, 4]) if (b <= max) out.push(b);
  for (let b = 8; b <= max; b += 8) out.push(b);
  return out;
}

/** The bucket a decode of `rows` sequences replays (the smallest that holds it), or undefined. */
export function bucketFor(buckets: readonly number[], rows: number): number | undefined {
  return buckets.find((b) => b >= rows);
}

export interface DeviceLimits {
  numBlocks: number;
  blockSize: number;
  maxBatchedTokens: number;
  maxSeqs: number;
  maxBlocksPerSeq: number;
  cublasWorkspaceBytes: number;
  /** Adapters resident at once in the device LoRA slots (0 or absent: no slots) and their rank per module. */
  maxLoras?: number;
  maxLoraRank?: number;
}

export interface DevicePlan {
  weights: number;
  kvPool: number;
  workspace: number;
  cublasWorkspace: number;
  hostPinned: number;
  /** The LoRA slots (cuda-lora.ts): every projection's A and B, max_loras + 1 entries, allocated at create. */
  lora: number;
  /** Device bytes before CUDA graphs (measured when captured) and the context. */
  total: number;
}

const align256 = (n: number) => Math.ceil(n / 256) * 256;
/** Context splits a decode's attention may use (ragguard_cuda.cu max_splits). */
export const MAX_SPLITS = 16;

export function dtypeBytes(_dtype: ModelDtype): number {
  return 2;
}

/** KV bytes of one token (every layer's key and value). */
export function kvBytesPerToken(c: CudaModelConfig, dtype: ModelDtype): number {
  return 2 * c.numLayers * c.numKvHeads * c.headDim * dtypeBytes(dtype);
}

/**
 * A GGUF decoder's quantized matrices on the device (gguf-checkpoint.ts): their packed bytes (each
 * segment 256-aligned) and the scratch that larger products dequantize tiles into.
 */
export interface QuantPlan {
  bytes: number;
  tileBytes: number;
}

/** The weight kinds a GGUF decoder keeps quantized (ragguard_cuda.cu quant_kind): not allocated dense. */
export const QUANT_KINDS: readonly WeightKindId[] = [WeightKind.embed, WeightKind.lmHead, WeightKind.qkv, WeightKind.o, WeightKind.gateUp, WeightKind.down];

/** What the native side allocates for a model and limits (rg_plan), byte for byte. */
export function planDevice(c: CudaModelConfig, dtype: ModelDtype, l: DeviceLimits, quant?: QuantPlan): DevicePlan {
  const e = dtypeBytes(dtype);
  const w = (k: WeightKindId) => (quant && QUANT_KINDS.includes(k) ? 0 : align256(weightElems(c, k) * e));
  let weights = w(WeightKind.embed) + (c.tieEmbeddings ? 0 : w(WeightKind.lmHead)) + w(WeightKind.finalNorm);
  const per = w(WeightKind.inputNorm) + w(WeightKind.qkv) + (c.qkvBias ? w(WeightKind.qkvBias) : 0) + w(WeightKind.o) +
    w(WeightKind.postNorm) + w(WeightKind.gateUp) + w(WeightKind.down);
  weights += per * c.numLayers + (quant ? align256(quant.bytes) : 0);
  const kvPool = l.numBlocks * l.blockSize * kvBytesPerToken(c, dtype);
  const Tm = l.maxBatchedTokens, Sm = l.maxSeqs;
  const loras = l.maxLoras ?? 0, rank = l.maxLoraRank ?? 0;
  const qw = (c.numHeads + 2 * c.numKvHeads) * c.headDim;
  const words = stepWords(Tm, Sm, l.maxBlocksPerSeq, maxPenaltyEntries(Sm, l.maxBlocksPerSeq, l.blockSize, c.vocabSize), Sm * maskWords(c.vocabSize));
  const workspace = align256(words * 4) + align256(Tm * c.hiddenSize * 2) * 3 + align256(Tm * qw * 2) +
    align256(Tm * c.numHeads * c.headDim * 2) + align256(Tm * 2 * c.intermediateSize * 2) + align256(Tm * c.intermediateSize * 2) +
    align256(Sm * c.hiddenSize * 2) + align256(Sm * c.vocabSize * 4) + align256(Sm * c.numHeads * MAX_SPLITS * c.headDim * 4) +
    align256(Sm * c.numHeads * MAX_SPLITS * 2 * 4) + align256(Sm * 4) + align256(2 * l.numBlocks * 4) +
    // The LoRA shrink's output [tokens, capacity] in float32, capacity at most 3 x rank (fused q|k|v).
    (loras > 0 ? align256(Tm * 3 * rank * 4) : 0) +
    // A GGUF decoder's dequantization tile.
    (quant ? align256(quant.tileBytes) : 0);
  const hostPinned = (words + Sm) * 4;
  const rope = (c.headDim / 2) * 4;
  const lora = loraSlotBytes(c, dtype, loras, rank);
  return {
    weights, kvPool, workspace, cublasWorkspace: l.cublasWorkspaceBytes, hostPinned, lora,
    total: weights + kvPool + workspace + l.cublasWorkspaceBytes + rope + lora,
  };
}

/**
 * Device bytes of the LoRA slots (rg_plan's out[5]): for each layer and projection (lora.ts's slots and
 * order), A [entries, in, capacity] and B [entries, capacity, out] in the model's dtype (the device keeps
 * both transposed, the same bytes), each rounded up to 256 bytes, entries = max_loras + 1 (entry 0:
 * zeros, the base model's rows).
 */
export function loraSlotBytes(c: CudaModelConfig, dtype: ModelDtype, maxLoras: number, maxRank: number): number {
  if (maxLoras <= 0) return 0;
  const e = dtypeBytes(dtype), entries = maxLoras + 1;
  let bytes = 0;
  for (const s of loraSlots(c)) {
    const cap = slotCapacity(s, maxRank);
    bytes += align256(entries * s.inDim * cap * e) + align256(entries * cap * s.outDim * e);
  }
  return bytes;
}
