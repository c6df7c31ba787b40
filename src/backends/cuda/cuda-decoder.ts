/**
 * The native CUDA decoder as the server holds it (RAGGUARD_DECODER_EP=cuda, or RAGGUARD_EXECUTION_PROVIDER=cuda):
 * a Hugging Face checkpoint or a GGUF file (kept quantized on the device: gguf-checkpoint.ts) opened at
 * start-up (config, safetensors headers or GGUF metadata, tokenizer: no device memory yet), whose device figures the budget reads before anything is allocated, and whose runner is created
 * once the budget has sized the KV pool. So the guard predicts from the same figures the native side
 * allocates by (step-pack.ts planDevice, checked against rg_plan at creation).
 *
 * Every device byte of this decoder is allocated at start-up: weights, the KV pool, the activation
 * workspace sized from max_num_batched_tokens, cuBLAS's workspace, the decode graphs. A request's runs add
 * nothing on the device (the memory model's `preallocated`), so the guard's per-request figures for the
 * decoder are zero and its bytes are the budget's fixed part, like the KV pool.
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import type { DecoderShape } from '../../generate/decoder-shape.js';
import type { ModelRunner } from '../../generate/model-runner.js';
import type { DecoderBackend, DecoderMemoryLayout, DecoderRuntime, MemoryDetail } from '../backend.js';
import { loraSlots, type LoraSlot } from '../../generate/lora.js';
import type { LoadBytes } from '../../runtime/load-bytes.js';
import { TextTokenizer } from '../../runtime/tokenizer.js';
import { cudaBackend, cudaUnavailable, type CudaBackend } from './binding.js';
import { cudaLoraPool, type CudaLoraPool } from './cuda-lora.js';
import { CudaModelRunner, CudaUnavailableError, type CudaRunnerOptions, type QgemvMath } from './cuda-runner.js';
import { withFp8 } from './fp8-weights.js';
import { openGguf } from './gguf-checkpoint.js';
import { CheckpointError, openCheckpoint, type Checkpoint, type ModelDtype } from './hf-checkpoint.js';
import { kvBytesPerToken, planDevice } from './step-pack.js';

/** The server's limits that size the decoder's device memory besides the KV pool. */
export interface CudaDecoderLimits {
  blockSize: number;
  maxBatchedTokens: number;
  maxSeqs: number;
  dtype?: ModelDtype;
  device?: number;
  /** Device LoRA slots: adapters resident at once (0: none, adapters refused) and rank per module. */
  maxLoras?: number;
  /** RAGGUARD_CUDA_WEIGHTS: the checkpoint's own matrices (model) or FP8 made at load. */
  weights?: 'model' | 'fp8';
  /** RAGGUARD_CUDA_FP8_GEMM: FP8 products of more than 8 rows through cuBLASLt (the default) or the tiles. */
  fp8Gemm?: 'cublaslt' | 'tiles';
  /** RAGGUARD_CUDA_QGEMV: a GGUF decoder's GEMV products (int8, the default, float, half2); dense and FP8 checkpoints ignore it. */
  qgemv?: QgemvMath;
  /** RAGGUARD_CUDA_QGEMM: a GGUF decoder's products of 9 to 64 rows (int8, the default, or mma); others ignore it. */
  qgemm?: 'mma' | 'int8';
  maxLoraRank?: number;
}

/** A GGUF decoder's GEMV products: RAGGUARD_CUDA_QGEMV, int8 by default (as the configuration's). */
const qgemvOf = (limits: CudaDecoderLimits): QgemvMath => limits.qgemv ?? 'int8';
/** Its products of 9 to 64 rows: RAGGUARD_CUDA_QGEMM, int8 by default (as the configuration's). */
const qgemmOf = (limits: CudaDecoderLimits): 'mma' | 'int8' => limits.qgemm ?? 'int8';

/** FP8 weights packed for cuBLASLt (a scale a row): RAGGUARD_CUDA_FP8_GEMM's default. */
const fp8ThroughCublasLt = (limits: CudaDecoderLimits) => limits.weights === 'fp8' && (limits.fp8Gemm ?? 'cublaslt') === 'cublaslt';

export class CudaDecoder implements DecoderBackend {
  readonly provider = 'cuda' as const;
  /** Every device byte is allocated at start-up: a request's runs add nothing (the memory model's `preallocated`). */
  readonly preallocated = true;
  /** The device LoRA slots' projections (lora.ts), or null where the limits ask for none. */
  readonly loraSlots: readonly LoraSlot[] | null;
  readonly loraUnavailable = 'the CUDA decoder has no LoRA slots (RAGGUARD_MAX_LORAS is 0)';
  readonly dtype: ModelDtype;
  /** The slots' pool handed to the adapter registry and not yet bound to a runner (one pool per runner). */
  private pendingPool: CudaLoraPool | undefined;
  private readonly runners = new Set<CudaModelRunner>();

  private constructor(
    readonly dir: string,
    readonly checkpoint: Checkpoint,
    readonly tokenizer: TextTokenizer,
    readonly limits: CudaDecoderLimits,
    private readonly native: CudaBackend,
  ) {
    this.dtype = CudaModelRunner.dtypeFor(checkpoint, limits.dtype);
    this.loraSlots = (limits.maxLoras ?? 0) > 0 ? loraSlots(checkpoint.config) : null;
  }

  /**
   * Opens the checkpoint (or GGUF file) and its tokenizer; allocates nothing. Refuses, naming why: no CUDA
   * library or GPU here, a directory that is not a Hugging Face checkpoint (an ONNX export: the ONNX
   * Runtime providers run those), a checkpoint without a tokenizer (the server needs text), a GGUF file of
   * an architecture, type or tokenizer the backend does not run.
   */
  static async open(dir: string, limits: CudaDecoderLimits, native: CudaBackend | null = cudaBackend()): Promise<CudaDecoder> {
    if (!native) {
      throw new CudaUnavailableError(`RAGGUARD_DECODER_EP=cuda: the CUDA backend is unavailable: ${cudaUnavailable()}; ` +
        'run the decoder on ONNX Runtime instead (RAGGUARD_DECODER_EP=cpu or webgpu)');
    }
    if (dir.toLowerCase().endsWith('.gguf')) {
      if (!existsSync(dir)) throw new CheckpointError(`${dir}: no such GGUF file`);
      const { checkpoint, tokenizer } = await openGguf(dir);
      if (limits.weights === 'fp8') withFp8(checkpoint); // refuses, naming why
      return new CudaDecoder(dir, checkpoint, tokenizer, limits, native);
    }
    if (existsSync(path.join(dir, 'onnx', 'model.onnx')) || existsSync(path.join(dir, 'genai_config.json'))) {
      throw new CheckpointError(`${dir}: an ONNX export; the CUDA backend reads Hugging Face checkpoints (config.json + *.safetensors)`);
    }
    const opened = await openCheckpoint(dir);
    const checkpoint = limits.weights === 'fp8' ? withFp8(opened, { rowScales: fp8ThroughCublasLt(limits) }) : opened;
    if (!existsSync(path.join(dir, 'tokenizer.json'))) {
      throw new CheckpointError(`${dir}: no tokenizer.json: the server needs the checkpoint's tokenizer (tokenizer.json, tokenizer_config.json)`);
    }
    const tokenizer = await TextTokenizer.load(dir);
    return new CudaDecoder(dir, checkpoint, tokenizer, limits, native);
  }

  get shape(): DecoderShape {
    const c = this.checkpoint.config;
    return {
      numLayers: c.numLayers, hiddenSize: c.hiddenSize, numHeads: c.numHeads, intermediateSize: c.intermediateSize,
      numKvHeads: c.numKvHeads, headDim: c.headDim, vocabSize: c.vocabSize, maxPositions: c.maxPositions,
      // float16 and bfloat16 both take two bytes: the figure the KV and activation sizes need.
      kvDtype: 'float16',
    };
  }

  get bosId(): number | undefined {
    return this.checkpoint.config.bosId;
  }

  get kvBytesPerToken(): number {
    return kvBytesPerToken(this.checkpoint.config, this.dtype);
  }

  /**
   * Its KV layout and run path, for /healthz and the start-up log: the activations' type, and the weights'
   * form where it is not the checkpoint's dense matrices (a GGUF file's blocks and its GEMV's products; FP8
   * made at load and its wide products), so that what runs is never silently other than what was asked.
   */
  runtime(): DecoderRuntime {
    const q = this.checkpoint.quant;
    const weights = q?.mode === 'gguf' ? `, GGUF blocks (GEMV ${qgemvOf(this.limits)}, wide products ${qgemmOf(this.limits)})`
      : q?.mode === 'fp8' ? `, FP8 weights (wide products: ${fp8ThroughCublasLt(this.limits) ? 'cublaslt' : 'tiles'})` : '';
    return { layout: 'paged (one device allocation, by block)', run_path: `cuda ${this.dtype}${weights}` };
  }

  /** Nothing of its runs for the memory model to size: every buffer is allocated at start-up. */
  memoryLayout(): DecoderMemoryLayout {
    return { preallocated: true };
  }

  /** Its runs add nothing to what start-up allocated: nothing for the profile run to measure. */
  profileRun(): Promise<void> {
    return Promise.resolve();
  }

  /** The runner's options; LoRA slots only with a pool the adapter registry asked for (adapters on). */
  private options(numBlocks: number, loraPool?: CudaLoraPool): CudaRunnerOptions {
    const { blockSize, maxBatchedTokens, maxSeqs, dtype, device } = this.limits;
    const fp8 = this.limits.weights === 'fp8' ? { weights: 'fp8' as const, fp8Gemm: fp8ThroughCublasLt(this.limits) ? 'cublaslt' as const : 'mma' as const } : {};
    const qgemv = this.checkpoint.quant?.mode === 'gguf' ? { qgemvMath: qgemvOf(this.limits), quantGemm: qgemmOf(this.limits) } : {};
    return { numBlocks, blockSize, maxBatchedTokens, maxSeqs, dtype, device, ...fp8, ...qgemv, ...(loraPool ? { loraPool } : { maxLoras: 0 }) };
  }

  /**
   * Device and pinned host bytes besides the KV pool and the LoRA slots (the budget counts those apart,
   * as adapter_slots) for a pool of `numBlocks` (weights, activation workspace with the LoRA scratch,
   * cuBLAS workspace, staging, rope table), before anything is allocated: what the budget sets aside.
   * The decode graphs' bytes are known only once captured (`loadBytes` then counts them).
   */
  staticBytes(numBlocks = 0): number {
    const plan = planDevice(this.checkpoint.config, this.dtype, CudaModelRunner.limitsFor(this.checkpoint, this.options(numBlocks, this.pendingPool)), this.checkpoint.quant);
    return plan.total - plan.kvPool - plan.lora + plan.hostPinned;
  }

  /**
   * Allocates, uploads and captures: a runner for a KV pool of `numBlocks` blocks. Each runner holds its
   * own device memory (weights included): a server makes one; a benchmark comparing services over the same
   * models (bench:guard) makes one per service.
   */
  createRunner(numBlocks: number, _blockSize?: number): CudaModelRunner { // the block size is its limits' own
    const runner = CudaModelRunner.create(this.native, this.checkpoint, this.tokenizer, this.options(numBlocks, this.pendingPool));
    this.pendingPool = undefined;
    this.runners.add(runner);
    return runner;
  }

  /**
   * What the decoder holds besides the KV pool before a runner exists: the plan's figures for an empty
   * pool (the budget's fixed part).
   */
  loadBytes(): LoadBytes {
    const bytes = this.staticBytes();
    return { bytes, hostBytes: 0, deviceBytes: bytes };
  }

  /** loadBytes: its plan's figures, exact, before a runner exists. */
  plannedLoadBytes(): LoadBytes {
    return this.loadBytes();
  }

  /** A runner's figures as the native accountant counts them (graphs included); undefined for a runner not of this backend. */
  runnerLoadBytes(runner: ModelRunner): LoadBytes | undefined {
    return runner instanceof CudaModelRunner ? CudaDecoder.loadBytes(runner) : undefined;
  }

  /** The native accountant's figures by part, exact; what its load added where `runner` is not one of its own. */
  memoryDetail(runner: ModelRunner, loaded: string): MemoryDetail {
    if (!(runner instanceof CudaModelRunner)) return { how: 'measured', detail: loaded };
    const m = runner.memory();
    return {
      how: 'exact',
      detail: `CUDA backend (${runner.dtype}): weights ${m.weights}, activation workspace ${m.workspace} (max_num_batched_tokens), ` +
        `cuBLAS workspace ${m.cublas_workspace}, decode graphs ${m.graphs} bytes on the GPU, ${m.host_pinned} pinned on the host; ` +
        `its KV pool is kv_pool; the GPU has ${m.device_free} of ${m.device_total} bytes free`,
    };
  }

  /** What a runner holds besides its KV pool and LoRA slots, as the native accountant counts it (graphs included). */
  static loadBytes(runner: CudaModelRunner): LoadBytes {
    const m = runner.memory();
    const device = m.total - m.kv_pool - m.lora;
    return { bytes: device + m.host_pinned, hostBytes: m.host_pinned, deviceBytes: device };
  }

  /**
   * The adapter slots for the runner created next (the adapter registry asks before the budget sizes the
   * KV pool; that runner allocates and binds them). One pool per runner: a second service over the same
   * decoder gets its own.
   */
  loraPoolFor(maxLoras: number, maxRank: number): CudaLoraPool {
    if (!this.loraSlots) throw new Error(this.loraUnavailable);
    this.pendingPool = cudaLoraPool(this.checkpoint.config, this.dtype, maxLoras, maxRank);
    return this.pendingPool;
  }

  /** Frees every runner's device memory. */
  close(): void {
    for (const r of this.runners) r.close();
    this.runners.clear();
  }
}

export { CudaUnavailableError };
