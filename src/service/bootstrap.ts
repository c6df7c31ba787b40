/**
 * How a service is built: loads the models (converting a GGUF or Optimum decoder first), picks the
 * decoder's backend and runner, plans the memory budget from what the service holds, sizes the KV pool,
 * and wires the block manager, the engine, the memory model and its guard; calibrates the memory model
 * by the profile run. The one place that knows which backend runs what; the query pipeline
 * (query-pipeline.ts) is given the parts built here.
 */
import type { Config } from '../config/config.js';
import type { AdapterRegistry } from '../generate/adapters.js';
import { BlockManager } from '../generate/block-manager.js';
import type { DecoderBackend, DecoderRuntime } from '../backends/backend.js';
import { CudaDecoder, type CudaDecoderLimits } from '../backends/cuda/cuda-decoder.js';
import { DecoderModel } from '../backends/ort/decoder-model.js';
import { ggufDecoderDir, ggufOptionsFor, isGguf } from '../backends/ort/convert/gguf-decoder.js';
import { exportDecoderDir } from '../backends/ort/convert/export-decoder.js';
import { Engine } from '../generate/engine.js';
import { planBudget, type BudgetPlan } from '../guards/budget.js';
import { CALIBRATION_FILE, calibrationKey, profileWithCache } from '../guards/calibration-cache.js';
import { MemoryGuard } from '../guards/guard.js';
import { MemoryModel } from '../guards/memory-model.js';
import { nvmlReader, type GpuReading } from '../guards/nvml.js';
import { gpuPeakMeter, hostMeter } from '../guards/peak-meter.js';
import { measureLoad } from '../guards/process-memory.js';
import { profileMemory, profilePlan, type ProfileLimits, type ProfileReport } from '../guards/profile.js';
import { Embedder } from '../retrieval/embedder.js';
import { RERANK_BATCH, Reranker } from '../retrieval/reranker.js';
import type { LoadBytes } from '../runtime/load-bytes.js';
import { installHostAccounting } from '../backends/ort/ort-allocator.js';
import { applySessionSettings } from '../backends/ort/ort-direct.js';
import { autoTokenizerThreads } from '../runtime/tokenizer-pool.js';
import path from 'node:path';

/**
 * The decoder, behind what every decoder backend offers (backends/backend.ts): ONNX Runtime's
 * (DecoderModel: CPU, WebGPU) or the native CUDA backend's (CudaDecoder).
 */
export type Decoder = DecoderBackend;

/** How the decoder runs, for /healthz and the start-up log: its KV layout and run path. */
export function decoderRuntime(d: Decoder): DecoderRuntime {
  return d.runtime();
}

export interface Models {
  embedder: Embedder;
  reranker: Reranker;
  decoder: Decoder;
  /** What each model added when it loaded (weights as the runtime holds them, tokenizer): host (resident) and device (NVML) memory. */
  loads: Record<'embedder' | 'reranker' | 'decoder', LoadBytes>;
}

/**
 * What an encoder holds once loaded: on ONNX Runtime what its load added (measured); on the CUDA encoder
 * its device bytes as planned and allocated (weights and every run's activations: exact), plus what its
 * load added on the host (tokenizer, the CUDA libraries, the pinned staging).
 */
export function encoderLoadBytes(model: Embedder | Reranker, measured: LoadBytes): LoadBytes {
  const exact = model.device;
  if (!exact) return measured;
  const device = exact.deviceBytes;
  return { bytes: measured.hostBytes + device, hostBytes: measured.hostBytes, deviceBytes: device };
}

/** The server's limits that size the CUDA decoder's device memory besides its KV pool. */
export function cudaDecoderLimits(cfg: Config): CudaDecoderLimits {
  return {
    blockSize: cfg.kvBlockSize, maxBatchedTokens: cfg.maxNumBatchedTokens, maxSeqs: cfg.maxNumSeqs,
    maxLoras: cfg.adapterDir ? cfg.maxLoras : 0, maxLoraRank: cfg.maxLoraRank, weights: cfg.cudaWeights, fp8Gemm: cfg.cudaFp8Gemm, qgemv: cfg.cudaQgemv, qgemm: cfg.cudaQgemm,
  };
}

/**
 * Loads the three models one after the other, so that each one's resident footprint is measured;
 * `onLoaded(done, of)` hears each one loaded (the start-up's progress); `note` the GGUF conversion's and
 * the kernels' decisions (the server logs them as JSON lines; stdout by default).
 */
export async function loadModels(cfg: Config, onLoaded?: (done: number, of: number) => void, note: (message: string) => void = (m) => console.log(m)): Promise<Models> {
  // Before any session is made: a session takes its allocators when it is created.
  installHostAccounting(cfg);
  applySessionSettings(cfg);
  const extras = {
    webgpuBufferCache: cfg.webgpuBufferCache, cuda: { maxRows: cfg.cudaEncoderRows, maxTokens: cfg.cudaEncoderTokens },
    tokenizerThreads: cfg.tokenizerThreads === 'auto' ? autoTokenizerThreads() : cfg.tokenizerThreads,
  };
  // Weights a GPU provider uploads are device memory: NVML's delta counts them (0 without a GPU).
  const gpu = nvmlReader();
  const { value: embedder, ...measuredE } = await measureLoad(() => Embedder.load(cfg.embedderPath, cfg.providers.embedder, extras), gpu);
  const e = encoderLoadBytes(embedder, measuredE);
  onLoaded?.(1, 3);
  const { value: reranker, ...measuredR } = await measureLoad(() => Reranker.load(cfg.rerankerPath, cfg.providers.reranker, extras), gpu);
  const r = encoderLoadBytes(reranker, measuredR);
  onLoaded?.(2, 3);
  if (cfg.providers.decoder === 'cuda') {
    // The native backend: nothing is allocated until the budget has sized the KV pool (RagService); its
    // figures until then are the plan's.
    const decoder = await CudaDecoder.open(cfg.decoderPath, cudaDecoderLimits(cfg));
    onLoaded?.(3, 3);
    return { embedder, reranker, decoder, loads: { embedder: e, reranker: r, decoder: decoder.loadBytes() } };
  }
  // A GGUF file is converted (or found converted) before its load is measured.
  const gguf = isGguf(cfg.decoderPath) ? ggufOptionsFor(cfg, note) : undefined;
  // Which kernels run the block products: said at every start, a cached conversion included.
  if (gguf?.weights === 'nbits') note(`[gguf] block products on ${gguf.kernels === 'ragguard' ? "ragguard's QMatMul8 and QMatMul4 (AVX512-VNNI)" : "ONNX Runtime's MatMulNBits"} (RAGGUARD_CPU_KERNELS)`);
  const decoderDir = gguf ? await ggufDecoderDir(cfg.decoderPath, gguf)
    : await exportDecoderDir(cfg.decoderPath, { cacheDir: cfg.ggufCacheDir, mode: cfg.decoderConvert, provider: cfg.providers.decoder, log: note });
  const { value: decoder, ...d } = await measureLoad(() => DecoderModel.load(decoderDir, cfg.providers.decoder, extras), gpu);
  onLoaded?.(3, 3);
  return { embedder, reranker, decoder, loads: { embedder: e, reranker: r, decoder: d } };
}


/** What wireEngine builds: the budget and what it sizes. */
export interface Wiring {
  /** models.loads, with the CUDA decoder's figures for the runner made here (its native accountant's). */
  loads: Models['loads'];
  budget: BudgetPlan;
  blocks: BlockManager;
  engine: Engine;
  guard: MemoryGuard;
}

/**
 * Plans the budget, sizes the KV pool, picks the decoder's runner and builds the engine and the guard.
 * `held(loads)`: what the budget holds before its KV pool with the models' figures `loads` (the
 * service's one sum: RagService.staticBytes); `workspace()`: what the budget leaves model runs now (the
 * guard's capacity, read at each decision).
 */
export function wireEngine(cfg: Config, models: Models, adapters: AdapterRegistry, gpuTotalBytes: number | null, totalHostBytes: number,
  held: (loads: Models['loads']) => number, workspace: () => number): Wiring {
  const decoder = models.decoder;
  const d = decoder.shape;
  // Until the CUDA decoder's runner exists, its plan's figures (the budget sizes the pool from them), taken
  // once the registry has asked for its slots (their scratch is in the workspace).
  const planned = decoder.plannedLoadBytes();
  let loads = planned ? { ...models.loads, decoder: planned } : models.loads;
  const budget = planBudget(cfg, held(loads), gpuTotalBytes, totalHostBytes, { bytesPerToken: decoder.kvBytesPerToken, maxPositions: d.maxPositions });
  const blockBytes = cfg.kvBlockSize * decoder.kvBytesPerToken;
  const numBlocks = Math.floor(budget.kvPoolBytes / blockBytes);
  if (numBlocks < 1) throw new Error(`the KV pool (${budget.kvPoolBytes} bytes) holds no block of ${blockBytes} bytes`);
  const blocks = new BlockManager({
    numBlocks, blockSize: cfg.kvBlockSize, watermark: cfg.kvWatermark,
    buckets: cfg.blockTableBuckets, enablePrefixCaching: cfg.prefixCaching,
  });
  // The CUDA decoder allocates everything now, for this pool; its figures become the accountant's
  // (graphs included), so the workspace the budget leaves is exact.
  const pool = { numBlocks, blockSize: cfg.kvBlockSize };
  const runner = decoder.createRunner(numBlocks, cfg.kvBlockSize);
  const counted = decoder.runnerLoadBytes(runner);
  if (counted) loads = { ...models.loads, decoder: counted };
  const engine = new Engine(runner, blocks, { ...pool, maxNumSeqs: cfg.maxNumSeqs, maxNumBatchedTokens: cfg.maxNumBatchedTokens });
  const memoryModel = new MemoryModel(models.reranker.dims, { ...d, ...decoder.memoryLayout(adapters.pool ? cfg.maxLoraRank : 0) },
    cfg.kvBlockSize, RERANK_BATCH, { embed: models.embedder.device !== undefined, rerank: models.reranker.device !== undefined });
  memoryModel.calibrate(memoryModel.calibration, cfg.minHeadroom); // analytic figures until a profile run
  const guard = new MemoryGuard(memoryModel, () => {
    const kv = blocks.stats();
    return { workspaceTotal: workspace(), kvFreeBlocks: kv.freeBlocks, kvTotalBlocks: kv.totalBlocks };
  }, cfg.reshapeOrder, { minPromptTokens: cfg.minPromptTokens, minNewTokens: cfg.minNewTokens });
  return { loads, budget, blocks, engine, guard };
}

/**
 * Calibrates the guard's memory model by the profile run at the largest shapes the configuration
 * allows, or by the calibration a run under the same inputs stored (RAGGUARD_CALIBRATION_CACHE,
 * calibration-cache.ts). Run before serving: the measurement needs the process to itself.
 */
export async function calibrateGuard(cfg: Config, models: Models, guard: MemoryGuard, gpu: () => GpuReading,
  onProgress: (done: number, of: number) => void): Promise<ProfileReport> {
  const { embedder, reranker, decoder } = models;
  // The CUDA decoder's and encoders' runs allocate nothing (all at start-up): only the others' placement picks the meter.
  const measured = [embedder.device ? undefined : embedder, reranker.device ? undefined : reranker, decoder.preallocated ? undefined : decoder]
    .filter((m) => m !== undefined);
  if (measured.length === 0) {
    return { source: 'analytic', reason: 'every model runs on the CUDA backend, whose runs allocate nothing beyond what start-up allocated' };
  }
  const where = new Set(measured.map((m) => (m.provider === 'cpu' ? 'host' : 'device')));
  const promptTokens = Math.min(cfg.promptBudgetTokens, decoder.shape.maxPositions - 1);
  // All on the host: ONNX Runtime's accounted bytes (or the kernel's resident peak); all on the GPU:
  // NVML's sampled device memory.
  const meter = where.size > 1 ? undefined : where.has('host') ? hostMeter(cfg) : gpuPeakMeter(nvmlReader());
  const limits: ProfileLimits = {
    queryTokens: Math.min(embedder.maxTokens, cfg.maxQueryTokens + 2),
    rerankPairs: Math.min(RERANK_BATCH, cfg.maxTopK),
    pairTokens: reranker.maxTokens,
    promptTokens,
    contextTokens: Math.min(decoder.shape.maxPositions, promptTokens + cfg.maxNewTokensLimit),
    decodeRows: cfg.maxNumSeqs,
  };
  const cacheFile = cfg.calibrationCache && meter?.available ? path.join(cfg.indexDir, CALIBRATION_FILE) : undefined;
  const profile: ProfileReport = !meter
    ? { source: 'analytic', reason: 'models split between host and GPU: no single meter sees every run' }
    : await profileWithCache(cacheFile, () => calibrationKey(cfg, profilePlan(guard.model, limits), gpu()),
      () => profileMemory(guard.model, {
        embed: (b, s) => embedder.profileRun(b, s),
        rerank: (b, s) => reranker.profileRun(b, s),
        // A preallocated decoder's (the CUDA decoder's) runs add nothing to what start-up allocated: its profileRun resolves at once.
        decoder: (r, s, c) => decoder.profileRun(r, s, c),
      }, limits, meter, onProgress));
  if (profile.source === 'profile') guard.model.calibrate(profile.calibration, Math.max(cfg.minHeadroom, profile.headroom));
  return profile;
}
