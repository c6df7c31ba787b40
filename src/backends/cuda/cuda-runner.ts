/**
 * The CUDA model runner: the engine's steps run by the native decoder (ragguard_cuda.cu) on a KV pool
 * that is one device allocation laid out by block. The block manager's tables go to the kernels with
 * each step (packed with the slot mapping: step-pack.ts), so prefix-cache hits read shared blocks with
 * no recompute, copy-on-write copies blocks on the device and preemption only frees blocks. Sampling
 * happens on the device; a step hands back the next token of each sequence and nothing else.
 *
 * Decode steps go first, all rows in one run (replayed from a CUDA graph of the smallest bucket that
 * holds them), then prefills packed together into runs of at most max_batched_tokens tokens; a prompt
 * longer than that is prefilled in chunks, only the last chunk's token sampled.
 *
 * With LoRA slots (maxLoras > 0) the runner is an AdapterHost (adapters.ts): the adapter registry loads
 * adapters into its device slots (cuda-lora.ts), and each step carries every sequence's entry, so rows of
 * different adapters and of the base model share a step.
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import type { AdapterHost } from '../../generate/adapters.js';
import type { DecoderShape } from '../../generate/decoder-shape.js';
import { loraSlots, type LoraSlot } from '../../generate/lora.js';
import type { KvPoolInfo, ModelRunner, RunnerStep, StepSink, TokenDecoder } from '../../generate/model-runner.js';
import type { BlockCopy } from '../../generate/scheduler.js';
import type { SamplingParams, Sequence } from '../../generate/sequence.js';
import { TextTokenizer } from '../../runtime/tokenizer.js';
import { cudaBackend, cudaUnavailable, type CudaBackend, type EngineHandle, type NativeConfig, type NativeMemory, type StepProfile } from './binding.js';
import { CudaLoraPool } from './cuda-lora.js';
import { withFp8 } from './fp8-weights.js';
import { openGguf, packSegment } from './gguf-checkpoint.js';
import { openCheckpoint, type Checkpoint, type ModelDtype } from './hf-checkpoint.js';
import { PenaltyTally } from '../../generate/penalty-tally.js';
import { graphBuckets, kvBytesPerToken, packStep, planDevice, type DeviceLimits, type DevicePlan, type DeviceSampling, type StepItem } from './step-pack.js';

/** The quantized GEMV's products (runner option qgemvMath; rg_set_qgemv_math's modes). */
export type QgemvMath = 'float' | 'half2' | 'int8';
const QGEMV_MATH_MODE: Record<QgemvMath, 0 | 1 | 2> = { float: 0, half2: 1, int8: 2 };

export interface CudaRunnerOptions {
  /** KV pool blocks and their size in tokens (the block manager's). */
  numBlocks: number;
  blockSize: number;
  maxBatchedTokens: number;
  maxSeqs: number;
  /** Model dtype on the device; default: the checkpoint's own when it is float16 or bfloat16, else float16. */
  dtype?: ModelDtype;
  /** The matrices as the checkpoint holds them (model, the default) or as FP8 made at load (RAGGUARD_CUDA_WEIGHTS=fp8). */
  weights?: 'model' | 'fp8';
  /**
   * Quantized products of more than 8 rows: mma (the default: tensor-core tiles that dequantize the units
   * they read in shared memory), int8 (the integer block types' values multiplied as they are on the int8
   * tensor cores, the activations rounded to int8 a block: quant_mmq.cuh) or dequant (the matrix dequantized
   * tile by tile for cuBLAS: kept to compare).
   */
  quantGemm?: 'mma' | 'dequant' | 'int8';
  /** Steps of up to this many rows multiply through the GEMV kernels (default: 8 for quantized matrices, 4 dense). */
  gemvRows?: number;
  /**
   * A GGUF decoder's GEMV products (steps of up to 8 rows): float (the default), half2 (float16 activations
   * only: paired half arithmetic, sixteen-element partials added in float) or int8 (the activations rounded to
   * int8 a block of 32 and multiplied four pairs an instruction, as llama.cpp's MMVQ: quant_gemv_i8.cuh; the
   * integer types, F16/BF16 segments stay in float). Neither is the default until a GPU run has measured it
   * and the agreement check has held it.
   */
  qgemvMath?: QgemvMath;
  /**
   * FP8 weights' products of more than 8 rows: mma (the default: the tensor-core tiles, the weights with a scale
   * per 32) or cublaslt (cuBLASLt's FP8 GEMM, the weights with a scale a row and each step's activations
   * quantized to FP8 with a scale a token, both applied in its epilogue; not the default until a GPU run has
   * measured it and the agreement check has held it).
   */
  fp8Gemm?: 'mma' | 'cublaslt';
  /** Decode batch sizes up to this replay CUDA graphs (0: none). Default: maxSeqs. */
  graphMaxBatch?: number;
  cublasWorkspaceBytes?: number;
  device?: number;
  /** Device LoRA slots: adapters resident at once (0, the default: no slots) and rank per module (RAGGUARD_MAX_LORAS / _RANK). */
  maxLoras?: number;
  maxLoraRank?: number;
  /**
   * The pool for those slots, made before the runner (cuda-lora.ts cudaLoraPool: for an adapter registry
   * built first); the runner binds it. Absent: the runner makes its own. Its dimensions set the slots'.
   */
  loraPool?: CudaLoraPool;
}

export class CudaUnavailableError extends Error {}

/** The LoRA slots' dimensions for the device limits: a pool handed in sets them; else the options (rank 16 by default). */
function loraLimits(opts: CudaRunnerOptions): { maxLoras: number; maxLoraRank: number } {
  const p = opts.loraPool;
  if (p) {
    if ((opts.maxLoras !== undefined && opts.maxLoras !== p.maxLoras) || (opts.maxLoraRank !== undefined && opts.maxLoraRank !== p.maxRank)) {
      throw new Error(`maxLoras/maxLoraRank ${opts.maxLoras} x ${opts.maxLoraRank} differ from the LoRA pool's ${p.maxLoras} x ${p.maxRank}`);
    }
    return { maxLoras: p.maxLoras, maxLoraRank: p.maxRank };
  }
  const maxLoras = opts.maxLoras ?? 0;
  return { maxLoras, maxLoraRank: maxLoras > 0 ? opts.maxLoraRank ?? 16 : 0 };
}

const SRC_DTYPE = { F32: 0, F16: 1, BF16: 2 } as const;
/** cuBLAS's recommended workspace on Hopper (32 MiB), set explicitly so it is counted and graph capture is safe. */
export const DEFAULT_CUBLAS_WORKSPACE = 32 * 1024 * 1024;
/** The library's default (and largest) step size for its GEMV kernel (ragguard_cuda.cu GEMV_MAX_ROWS). */
export const CUDA_GEMV_MAX_ROWS = 4;
/** The same for a GGUF decoder's quantized GEMV (ragguard_cuda.cu QGEMV_MAX_ROWS). */
export const CUDA_QGEMV_MAX_ROWS = 8;

/** The device sampling of a sequence's next token (plain fields of SamplingParams). */
export function deviceSampling(params: SamplingParams, step: number): DeviceSampling {
  return { temperature: params.temperature, topK: params.topK ?? 0, topP: params.topP ?? 1, seed: params.seed ?? 0x5eed, step };
}

/** Greedy-equivalent decoding by the empty tokenizer of a checkpoint that ships none (benchmarks). */
const NO_TEXT: TokenDecoder = { decode: () => '' };

export class CudaModelRunner implements ModelRunner, AdapterHost {
  readonly shape: DecoderShape;
  readonly eosIds: ReadonlySet<number>;
  readonly plan: DevicePlan;
  /** Device bytes of the captured graphs (cudaMemGetInfo across the capture). */
  graphBytes = 0;
  readonly buckets: readonly number[];
  private readonly tokensOut: Int32Array;
  /** Logits of the last step's rows, when `keepLogits` (checks only: a device-to-host copy per step). */
  lastLogits: Float32Array | null = null;
  keepLogits = false;
  /** The device LoRA slots' projections, or null without slots (maxLoras 0: adapters are refused). */
  readonly loraSlots: readonly LoraSlot[] | null;
  private readonly loraPool: CudaLoraPool | undefined;
  /** Each penalized sequence's tokens and counts, kept as it grows. */
  private readonly tallies = new WeakMap<Sequence, PenaltyTally>();

  private constructor(
    private readonly native: CudaBackend,
    private readonly handle: EngineHandle,
    readonly checkpoint: Checkpoint,
    readonly dtype: ModelDtype,
    readonly limits: DeviceLimits,
    readonly tokenizer: TokenDecoder,
    buckets: readonly number[],
    pool?: CudaLoraPool,
  ) {
    const c = checkpoint.config;
    this.shape = {
      numLayers: c.numLayers, hiddenSize: c.hiddenSize, numHeads: c.numHeads, intermediateSize: c.intermediateSize,
      numKvHeads: c.numKvHeads, headDim: c.headDim, vocabSize: c.vocabSize, maxPositions: c.maxPositions, kvDtype: 'float16',
    };
    this.eosIds = new Set(c.eosIds);
    this.plan = planDevice(c, dtype, limits, checkpoint.quant);
    this.buckets = buckets;
    this.tokensOut = new Int32Array(limits.maxSeqs);
    const loras = limits.maxLoras ?? 0;
    this.loraSlots = loras > 0 ? loraSlots(this.shape) : null;
    if (this.loraSlots) {
      // A pool handed in is bound once the runner is complete (load); its own, now.
      this.loraPool = pool ?? new CudaLoraPool(this.loraSlots, loras, limits.maxLoraRank ?? 0, this.plan.lora,
        (layer, p, entry, a, b) => native.loraWrite(handle, layer, p, entry, a, b));
    }
  }

  /**
   * Opens a Hugging Face checkpoint or a GGUF file, allocates the device memory, uploads the weights once,
   * captures the decode graphs. `native` is the bound library (tests on the CPU hand in a stand-in).
   */
  static async load(dir: string, opts: CudaRunnerOptions, native: CudaBackend | null = cudaBackend()): Promise<CudaModelRunner> {
    if (!native) throw new CudaUnavailableError(`the CUDA backend is unavailable: ${cudaUnavailable()}`);
    if (dir.toLowerCase().endsWith('.gguf')) {
      const { checkpoint, tokenizer } = await openGguf(dir);
      return CudaModelRunner.create(native, checkpoint, tokenizer, opts);
    }
    const ckpt = await openCheckpoint(dir);
    const tokenizer = existsSync(path.join(dir, 'tokenizer.json')) ? await TextTokenizer.load(dir) : NO_TEXT;
    return CudaModelRunner.create(native, ckpt, tokenizer, opts);
  }

  /** The model dtype on the device for a checkpoint: as asked, else its own where the device takes it, else float16. */
  static dtypeFor(ckpt: Checkpoint, asked?: ModelDtype): ModelDtype {
    return asked ?? (ckpt.config.checkpointDtype === 'bfloat16' ? 'bfloat16' : 'float16');
  }

  /**
   * The device limits for these options: a block table never needs more entries than the longest sequence
   * the model or the pool allows.
   */
  static limitsFor(ckpt: Checkpoint, opts: CudaRunnerOptions): DeviceLimits {
    const maxPositions = Math.min(ckpt.config.maxPositions, opts.numBlocks * opts.blockSize);
    return {
      numBlocks: opts.numBlocks, blockSize: opts.blockSize, maxBatchedTokens: opts.maxBatchedTokens, maxSeqs: opts.maxSeqs,
      maxBlocksPerSeq: Math.ceil(maxPositions / opts.blockSize),
      cublasWorkspaceBytes: opts.cublasWorkspaceBytes ?? DEFAULT_CUBLAS_WORKSPACE,
      ...loraLimits(opts),
    };
  }

  /**
   * Allocates the device memory for an opened checkpoint, uploads its weights (read from the files here,
   * synchronously: start-up only) and captures the decode graphs.
   */
  static create(native: CudaBackend, opened: Checkpoint, tokenizer: TokenDecoder, opts: CudaRunnerOptions): CudaModelRunner {
    const lt = opts.fp8Gemm === 'cublaslt';
    if (lt && opts.weights !== 'fp8') throw new Error("fp8Gemm 'cublaslt' is for FP8 weights (weights: 'fp8')");
    const ckpt = opts.weights === 'fp8' && opened.quant?.mode !== 'fp8' ? withFp8(opened, { rowScales: lt }) : opened;
    const c = ckpt.config;
    const dtype = CudaModelRunner.dtypeFor(ckpt, opts.dtype);
    const limits = CudaModelRunner.limitsFor(ckpt, opts);
    const graphMax = Math.min(opts.graphMaxBatch ?? opts.maxSeqs, opts.maxSeqs, opts.maxBatchedTokens);
    const cfg: NativeConfig = {
      num_layers: c.numLayers, hidden: c.hiddenSize, num_heads: c.numHeads, num_kv_heads: c.numKvHeads, head_dim: c.headDim,
      intermediate: c.intermediateSize, vocab: c.vocabSize, dtype: dtype === 'bfloat16' ? 1 : 0, tie_embeddings: c.tieEmbeddings ? 1 : 0,
      qkv_bias: c.qkvBias ? 1 : 0, rms_eps: c.rmsEps, num_blocks: limits.numBlocks, block_size: limits.blockSize,
      max_batched_tokens: limits.maxBatchedTokens, max_seqs: limits.maxSeqs, max_blocks_per_seq: limits.maxBlocksPerSeq,
      cublas_workspace_bytes: limits.cublasWorkspaceBytes, device: opts.device ?? 0, graph_max_batch: graphMax,
      max_loras: limits.maxLoras ?? 0, max_lora_rank: limits.maxLoraRank ?? 0,
      quantized: ckpt.quant ? (ckpt.quant.mode === 'fp8' ? 2 : 1) : 0, quant_bytes: ckpt.quant?.bytes ?? 0, quant_tile_bytes: ckpt.quant?.tileBytes ?? 0,
      quant_gemm: opts.quantGemm === 'dequant' ? 1 : opts.quantGemm === 'int8' ? 2 : 0,
    };
    // The accountant's figures and the native allocator's must be the same numbers.
    const nativePlan = native.plan(cfg);
    const plan = planDevice(c, dtype, limits, ckpt.quant);
    const mine = [plan.weights, plan.kvPool, plan.workspace, plan.cublasWorkspace, plan.hostPinned, plan.lora];
    if (mine.some((v, i) => v !== nativePlan[i])) throw new Error(`device plan mismatch: ${mine.join(',')} vs native ${nativePlan.join(',')}`);
    if (opts.loraPool && (opts.loraPool.bound || opts.loraPool.bytes !== plan.lora)) throw new Error('the LoRA pool handed in is bound already or sized for other slots');
    const h = native.create(cfg);
    try {
      native.setRope(h, ckpt.invFreq);
      if (lt) {
        if (!native.setFp8Gemm) throw new Error("this CUDA library cannot run FP8 products through cuBLASLt");
        native.setFp8Gemm(h, 1); // before the segments are registered: they are packed with a scale a row
      }
      // FP8: each fused matrix's place first; the checkpoint's tensors are quantized into it as they load.
      for (const s of ckpt.quant?.mode === 'fp8' ? ckpt.quant.segments : []) native.quantUpload(h, s.kind, s.layer, 0, s.deviceType, s.rows, s.cols, s.offset, null, s.packedBytes);
      for (const t of ckpt.loads) native.loadTensor(h, t.kind, t.layer, t.dstOffset, t.file, t.fileOffset, t.count, SRC_DTYPE[t.dtype]);
      // A GGUF decoder's matrices: read, re-laid out and uploaded one at a time (the host holds one tensor).
      for (const s of ckpt.quant?.mode === 'gguf' ? ckpt.quant.segments : []) {
        const p = packSegment(s);
        native.quantUpload(h, s.kind, s.layer, s.row0, p.type, s.rows, s.cols, s.offset, p.bytes, p.bytes.length);
      }
      native.loadDone(h);
      // Before the graphs are captured: they keep the product each batch size was captured with.
      if (opts.gemvRows !== undefined) {
        if (!native.setGemvRows) throw new Error('this CUDA library cannot set the GEMV rows');
        native.setGemvRows(h, opts.gemvRows);
      }
      if (opts.qgemvMath !== undefined && opts.qgemvMath !== 'float') {
        if (ckpt.quant?.mode !== 'gguf') throw new Error(`qgemvMath ${opts.qgemvMath} is for a GGUF decoder`);
        if (!native.setQgemvMath) throw new Error('this CUDA library cannot set the GEMV products');
        native.setQgemvMath(h, QGEMV_MATH_MODE[opts.qgemvMath]);
      }
      const buckets = graphMax > 0 ? graphBuckets(graphMax) : [];
      const runner = new CudaModelRunner(native, h, ckpt, dtype, limits, tokenizer, buckets, opts.loraPool);
      if (buckets.length > 0) runner.graphBytes = native.captureGraphs(h, buckets);
      opts.loraPool?.bind((layer, p, entry, a, b) => native.loraWrite(h, layer, p, entry, a, b));
      return runner;
    } catch (e) {
      native.destroy(h);
      throw e;
    }
  }

  get pool(): KvPoolInfo {
    const perSlot = kvBytesPerToken(this.checkpoint.config, this.dtype);
    return { bytes: this.plan.kvPool, numBlocks: this.limits.numBlocks, blockSize: this.limits.blockSize, bytesPerSlot: perSlot, location: 'device' };
  }

  /** The accountant's device figures now (graphs included) and the device's free/total. */
  memory(): NativeMemory {
    return this.native.memory(this.handle);
  }

  /**
   * The adapter slots on the device (allocated at load: `maxLoras` and `maxRank` must be the runner's),
   * for the adapter registry.
   */
  loraPoolFor(maxLoras: number, maxRank: number): CudaLoraPool {
    const p = this.loraPool;
    if (!p) throw new Error('the CUDA decoder has no LoRA slots (load it with maxLoras > 0)');
    if (p.maxLoras !== maxLoras || p.maxRank !== maxRank) throw new Error(`the CUDA decoder's adapter slots are ${p.maxLoras} x rank ${p.maxRank}, not ${maxLoras} x ${maxRank}`);
    return p;
  }

  /** Requests for an adapter these slots cannot run (every sampling setting, penalties included, runs on the device). */
  refuse(params: SamplingParams): string | undefined {
    const a = params.adapter;
    if (a && !this.loraPool) return 'this CUDA decoder has no LoRA slots (RAGGUARD_MAX_LORAS)';
    if (a && (a.released || a.entry < 1 || a.entry > this.loraPool!.maxLoras)) return `adapter ${a.key} is not resident in the CUDA decoder's slots`;
    return undefined;
  }

  /** Steps complete before execute() returns: nothing is in flight at the barrier. */
  async barrier(): Promise<void> {}

  /** The KV is always in the device pool: nothing to bring back. */
  async syncPool(): Promise<void> {}

  copyBlocks(copies: readonly BlockCopy[]): void {
    if (copies.length === 0) return;
    const pairs = new Int32Array(copies.length * 2);
    copies.forEach((c, i) => {
      pairs[2 * i] = c.src;
      pairs[2 * i + 1] = c.dst;
    });
    this.native.copyBlocks(this.handle, pairs);
  }

  async execute(step: RunnerStep, sink: StepSink): Promise<void> {
    if (step.decodes.length > 0) {
      const items = step.decodes.map((s) => this.item(s, [s.lastToken], s.numComputed, step));
      const next = await this.run(items);
      const done = step.decodes.map((s, r) => sink.accept(s, 1, next[r]!));
      step.decodes.forEach((s, r) => done[r] && sink.finish(s, done[r]));
    }
    // Prefills: whole prompts packed together up to the token limit; a longer one in chunks.
    const Tm = this.limits.maxBatchedTokens, Sm = this.limits.maxSeqs;
    let batch: { seq: Sequence; fed: number; item: StepItem }[] = [];
    let tokens = 0;
    const flush = async () => {
      if (batch.length === 0) return;
      const next = await this.run(batch.map((b) => b.item));
      const done = batch.map((b, r) => sink.accept(b.seq, b.fed, next[r]!));
      batch.forEach((b, r) => done[r] && sink.finish(b.seq, done[r]));
      batch = [];
      tokens = 0;
    };
    for (const seq of step.prefills) {
      const pending = seq.pending;
      let start = seq.numComputed;
      let i = 0;
      while (pending.length - i > Tm) {
        // A chunk that leaves more to come: its sampled token is not used (the sequence has not computed it yet).
        await flush();
        await this.run([this.item(seq, pending.slice(i, i + Tm), start, step)]);
        seq.numComputed += Tm;
        start += Tm;
        i += Tm;
      }
      const rest = pending.slice(i);
      if (tokens + rest.length > Tm || batch.length === Sm) await flush();
      batch.push({ seq, fed: rest.length, item: this.item(seq, rest, start, step) });
      tokens += rest.length;
    }
    await flush();
  }

  abandon(): Sequence[] {
    return [];
  }

  /**
   * Benchmarks: mean device milliseconds of the decode graph of `batch` replayed back to back on the last
   * step's inputs (a step's cost without the host), or NaN where the library cannot say.
   */
  graphTime(batch: number, reps: number): number {
    return this.native.graphTime?.(this.handle, batch, reps) ?? Number.NaN;
  }

  /** What cuBLASLt's FP8 path could not do (fp8Gemm 'cublaslt': shapes it had no algorithm for ran the tiles), or ''. */
  fp8GemmNote(): string {
    return this.native.fp8GemmNote?.(this.handle) ?? '';
  }

  /**
   * Benchmarks: runs `work` with steps launched directly and timed by phase (no graphs meanwhile).
   * `gemvRows` (0-4) sets how many rows a step may have to multiply through the GEMV kernel rather than
   * cuBLAS while it runs (the library's default is restored after); null where the library cannot.
   */
  async profiled<T>(work: () => Promise<T>, gemvRows?: number): Promise<{ value: T; profile: StepProfile | null }> {
    const { profile, profileRead, setGemvRows } = this.native;
    if (!profile || !profileRead || (gemvRows !== undefined && !setGemvRows)) return { value: await work(), profile: null };
    profile.call(this.native, this.handle, true);
    if (gemvRows !== undefined) setGemvRows?.call(this.native, this.handle, gemvRows);
    try {
      const value = await work();
      return { value, profile: profileRead.call(this.native, this.handle) };
    } finally {
      if (gemvRows !== undefined) setGemvRows?.call(this.native, this.handle, this.checkpoint.quant ? CUDA_QGEMV_MAX_ROWS : CUDA_GEMV_MAX_ROWS);
      profile.call(this.native, this.handle, false);
    }
  }

  /** Frees the device memory; the runner is unusable after. */
  close(): void {
    this.native.destroy(this.handle);
  }

  private item(seq: Sequence, tokens: readonly number[], start: number, step: RunnerStep): StepItem {
    const sampling = deviceSampling(seq.params, seq.outputIds.length);
    let tally = this.tallies.get(seq);
    if (!tally) {
      tally = PenaltyTally.for(seq.params, seq.promptIds, this.shape.vocabSize);
      if (tally) this.tallies.set(seq, tally);
    }
    if (tally) sampling.penalties = tally.list(seq.outputIds);
    // A constrained row: the grammar's mask goes with the step, applied on the device before sampling.
    const mask = seq.guide?.mask();
    return { tokens, start, blocks: step.blocks(seq), sampling, lora: seq.params.adapter?.entry ?? 0, ...(mask ? { mask } : {}) };
  }

  private async run(items: readonly StepItem[]): Promise<Int32Array> {
    const words = packStep(items, this.limits.blockSize);
    const logits = this.keepLogits ? new Float32Array(items.length * this.shape.vocabSize) : null;
    await this.native.step(this.handle, words, this.tokensOut, logits);
    this.lastLogits = logits;
    return this.tokensOut.slice(0, items.length);
  }
}
