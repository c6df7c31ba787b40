/**
 * The RAG pipeline: ingest documents into the store; answer a query by
 * embed -> search -> prune/dedupe -> rerank -> prompt inside a token budget -> generate.
 * Models and store are passed in; the service owns what sits between them: the memory budget and its
 * guard, the KV block manager and the generation engine. Each stage is timed.
 */
import { createHash } from 'node:crypto';
import { totalmem } from 'node:os';
import path from 'node:path';
import type { Config } from '../config/config.js';
import { AdapterRegistry } from '../generate/adapters.js';
import { BlockManager } from '../generate/block-manager.js';
import { CudaDecoder, type CudaDecoderLimits } from '../backends/cuda/cuda-decoder.js';
import { CudaModelRunner } from '../backends/cuda/cuda-runner.js';
import { DecoderModel } from '../backends/ort/decoder-model.js';
import { OrtModelRunner } from '../backends/ort/ort-runner.js';
import { Engine, type GenerateHooks } from '../generate/engine.js';
import type { SamplingParams } from '../generate/sequence.js';
import { ggufDecoderDir, ggufOptionsFor, isGguf } from '../backends/ort/convert/gguf-decoder.js';
import { exportDecoderDir } from '../backends/ort/convert/export-decoder.js';
import type { FinishReason, Generation } from '../generate/generation.js';
import { chatContextPrompt } from '../generate/chat-prompt.js';
import { ChatTemplate, chatTemplateFrom, tokenizerAddsBos } from '../generate/chat-template.js';
import { assemblePrompt, templateFromConfig, type AssembledPrompt, type ContextChunk, type PromptTemplate } from '../generate/prompt.js';
import { planBudget, type BudgetPlan } from '../guards/budget.js';
import { GrowthTracker, MemoryTrend } from '../guards/growth.js';
import { MemoryGuard } from '../guards/guard.js';
import { MemoryModel, type RequestShape } from '../guards/memory-model.js';
import { GpuSampler, nvmlReader } from '../guards/nvml.js';
import { gpuPeakMeter, hostMeter } from '../guards/peak-meter.js';
import { measureLoad, processMemory } from '../guards/process-memory.js';
import { type LoadBytes } from '../runtime/load-bytes.js';
import { CALIBRATION_FILE, calibrationKey, profileWithCache } from '../guards/calibration-cache.js';
import { profileMemory, profilePlan, type ProfileLimits, type ProfileReport } from '../guards/profile.js';
import { RERANK_BATCH, Reranker } from '../retrieval/reranker.js';
import { mallocStats, trimMalloc } from '../runtime/malloc.js';
import { autoTokenizerThreads } from '../runtime/tokenizer-pool.js';
import { countingAllocator, installHostAccounting } from '../runtime/ort-allocator.js';
import { applySessionSettings } from '../runtime/ort-direct.js';
import { nextTurn } from '../runtime/turns.js';
import { chunkSections, type Section } from '../retrieval/chunker.js';
import { embeddingText, readCorpus } from '../retrieval/corpus.js';
import { Embedder } from '../retrieval/embedder.js';
import { dedupe } from '../retrieval/prune.js';
import { Retriever } from '../retrieval/retriever.js';
import { openStore } from '../retrieval/open-store.js';
import { FaissStore } from '../retrieval/faiss-store.js';
import {
  DEFAULT_COLLECTION, DocumentExistsError, type Hit, type Metadata, type NewDocument, type RetrievalStore, type SearchFilter,
} from '../retrieval/retrieval-store.js';

export interface DocumentInput {
  docId?: string;
  title?: string;
  text: string;
  /** The collection it belongs to ('default' when left out). */
  collection?: string;
  /** The text in sections under their references (a file's pages or headings): chunked per section when given. */
  sections?: readonly Section[];
  /** The caller's, or what the source file said of itself (retrieval/files/registry.ts). */
  metadata?: Metadata;
}

export interface IngestResult {
  doc_id: string;
  title: string;
  chunks: number;
  collection: string;
}

/** The sampler's per-request fields beyond temperature and seed (sequence.ts). */
export type SamplingOptions = Partial<Pick<SamplingParams, 'topP' | 'topK' | 'repetitionPenalty' | 'presencePenalty' | 'frequencyPenalty' | 'stop' | 'grammar'>>;

/** Streaming and cancellation: citations once the prompt is assembled, each token as generated, an abort signal. */
export interface QueryHooks extends GenerateHooks {
  onCitations?: (citations: Citation[]) => void;
}

export interface QueryInput {
  query: string;
  topK: number;
  rerankTopN: number;
  maxNewTokens: number;
  temperature: number;
  seed?: number;
  /** Prompt tokens at most (a reshape may lower it below RAGGUARD_PROMPT_BUDGET). */
  promptBudget?: number;
  /** Pairs per reranker run (a reshape may lower it below RERANK_BATCH). */
  rerankBatch?: number;
  /** LoRA adapter to generate with (a name under RAGGUARD_ADAPTER_DIR). */
  adapter?: string;
  /** The tenant's prefix-cache salt: its cached blocks serve only its own prompts (prefix-hash.ts). */
  cacheSalt?: string;
  /** The collection searched and the metadata conditions its chunks must meet (default: the 'default' collection). */
  filter?: SearchFilter;
  sampling?: SamplingOptions;
  hooks?: QueryHooks;
  /** Builds the prompt from the ranked chunks instead of the RAG template (a chat's messages: openai-routes.ts). */
  promptFor?: (chunks: readonly ContextChunk[], budget: number, between: () => Promise<void>) => Promise<AssembledPrompt>;
}

export interface Citation {
  doc_id: string;
  collection: string;
  title: string;
  chunk_id: number;
  /** Cross-encoder logit (higher is more relevant); with RAGGUARD_RERANK=false, the first-stage score. */
  score: number;
  /** First-stage score: cosine (dense), BM25 (lexical) or the reciprocal-rank fusion sum (hybrid). */
  retrieval_score: number;
  text: string;
  /** Where in the document the chunk is: "page 3", "section: Install > Linux"; absent when the source has no pages or headings. */
  locator?: string;
}

export interface QueryResult {
  answer: string;
  citations: Citation[];
  finish_reason: FinishReason;
  usage: { prompt_tokens: number; completion_tokens: number };
  retrieval: { hits: number; after_prune: number; after_dedupe: number; reranked: number; in_prompt: number; truncated: number };
  timings_ms: { embed: number; search: number; rerank: number; generate: number };
  /** The request's shape as it ran (pairs actually reranked, their width, the assembled prompt). */
  shape: RequestShape;
  /** The adapter it generated with: its name and the key of its weights. */
  adapter?: { name: string; key: string };
  /** With a response_format: max_tokens' budget left out a continuation the schema allowed, so the JSON closed in time. */
  steered_to_close?: true;
}

/** The decoder on ONNX Runtime (CPU, WebGPU) or on the native CUDA backend. */
export type Decoder = DecoderModel | CudaDecoder;

/** How the decoder runs, for /healthz and the start-up log: its KV layout and run path. */
export function decoderRuntime(d: Decoder): { layout: string; run_path: string; run_path_reason?: string } {
  if (d instanceof CudaDecoder) return { layout: 'paged (one device allocation, by block)', run_path: `cuda ${d.dtype}` };
  return { layout: d.layout, run_path: d.runPath.path, ...(d.runPath.reason ? { run_path_reason: d.runPath.reason } : {}) };
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
  const cuda = model.cuda;
  if (!cuda) return measured;
  const device = cuda.plan.total;
  return { bytes: measured.hostBytes + device, hostBytes: measured.hostBytes, deviceBytes: device };
}

/** The server's limits that size the CUDA decoder's device memory besides its KV pool. */
export function cudaDecoderLimits(cfg: Config): CudaDecoderLimits {
  return {
    blockSize: cfg.kvBlockSize, maxBatchedTokens: cfg.maxNumBatchedTokens, maxSeqs: cfg.maxNumSeqs,
    maxLoras: cfg.adapterDir ? cfg.maxLoras : 0, maxLoraRank: cfg.maxLoraRank, weights: cfg.cudaWeights,
  };
}

/**
 * Loads the three models one after the other, so that each one's resident footprint is measured;
 * `onLoaded(done, of)` hears each one loaded (the start-up's progress).
 */
export async function loadModels(cfg: Config, onLoaded?: (done: number, of: number) => void): Promise<Models> {
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
  const gguf = isGguf(cfg.decoderPath) ? ggufOptionsFor(cfg, (m) => console.log(m)) : undefined;
  // Which kernels run the block products: said at every start, a cached conversion included.
  if (gguf?.weights === 'nbits') console.log(`[gguf] block products on ${gguf.kernels === 'ragguard' ? "ragguard's QMatMul8 and QMatMul4 (AVX512-VNNI)" : "ONNX Runtime's MatMulNBits"} (RAGGUARD_CPU_KERNELS)`);
  const decoderDir = gguf ? await ggufDecoderDir(cfg.decoderPath, gguf)
    : await exportDecoderDir(cfg.decoderPath, { cacheDir: cfg.ggufCacheDir, mode: cfg.decoderConvert, provider: cfg.providers.decoder, log: (m) => console.log(m) });
  const { value: decoder, ...d } = await measureLoad(() => DecoderModel.load(decoderDir, cfg.providers.decoder, extras), gpu);
  onLoaded?.(3, 3);
  return { embedder, reranker, decoder, loads: { embedder: e, reranker: r, decoder: d } };
}

/** Free bytes in glibc's arenas above which the leak check's sample trims them first (sampleMemory). */
const TRIM_FREE_BYTES = 64 * 2 ** 20;

const ms = (t0: number) => Math.round((performance.now() - t0) * 100) / 100;

export class RagService {
  readonly template: PromptTemplate;
  /** The BOS a /query prompt starts with: the decoder's, where its tokenizer adds one. */
  readonly promptBosId: number | undefined;
  /** The decoder's own chat template, where it brings one: /query prompts are then chats (chat-prompt.ts). */
  readonly chat: ChatTemplate | undefined;
  /** Continuous batching over the paged KV cache: every query's generation goes through it. */
  readonly engine: Engine;
  readonly blocks: BlockManager;
  /** LoRA adapters, loaded for the requests naming them and unloaded after the last. */
  readonly adapters: AdapterRegistry;
  /** Process memory after each query, for the leak check. */
  readonly growth: GrowthTracker;
  /** Process memory over time, less the stored documents' predicted bytes: the slow-leak check (growth.ts). */
  readonly trend: MemoryTrend;
  private trendTimer: NodeJS.Timeout | undefined;
  /** GPU memory as NVML reads it; without a GPU, one reading that says why, and no sampling. */
  readonly gpu: GpuSampler;
  readonly budget: BudgetPlan;
  /** Predicts each request's memory and reserves its workspace while it runs. */
  readonly guard: MemoryGuard;
  /** How the memory model was calibrated (the start-up profile run, or analytic figures and why). */
  profile: ProfileReport = { source: 'analytic', reason: 'no profile run yet' };
  /** First stage: dense, BM25, or both fused (RAGGUARD_RETRIEVAL); its BM25 index is rebuilt from the stored chunks. */
  readonly retriever: Retriever;
  /**
   * What each model holds (models.loads), with the CUDA decoder's figures for this service's runner: the
   * native accountant's, once its memory is allocated (graphs included).
   */
  loads: Models['loads'];
  /** The profile run in progress (or the last one): model runs done of its total, for the start-up's progress. */
  profileProgress: { done: number; of: number } | undefined;
  /** The ingest in progress (or the last one): documents chunked and embedded of the batch's, for progress logs. */
  ingestProgress: { done: number; of: number } | undefined;
  /** Ingestion mutates the index and rewrites the snapshot: one at a time. */
  private ingestTail: Promise<unknown> = Promise.resolve();

  constructor(
    readonly cfg: Config,
    readonly models: Models,
    readonly store: RetrievalStore,
  ) {
    this.template = templateFromConfig(models.decoder.tokenizer.config);
    this.promptBosId = tokenizerAddsBos(models.decoder.tokenizer.config, models.decoder.bosId) ? models.decoder.bosId : undefined;
    this.chat = chatTemplateFrom(models.decoder.tokenizer.config).source === 'tokenizer_config'
      ? ChatTemplate.forModel(models.decoder.tokenizer, models.decoder.bosId) : undefined;
    this.retriever = new Retriever(store, cfg);
    this.adapters = new AdapterRegistry(cfg.adapterDir, models.decoder, { maxLoras: cfg.maxLoras, maxRank: cfg.maxLoraRank, waitMs: cfg.queueTimeoutMs });
    // Until the CUDA decoder's runner exists, its plan's figures (the budget sizes the pool from them), taken
    // once the registry has asked for its slots (their scratch is in the workspace).
    this.loads = models.decoder instanceof CudaDecoder ? { ...models.loads, decoder: models.decoder.loadBytes() } : models.loads;
    this.growth = new GrowthTracker(cfg.leakWindow, cfg.leakThresholdBytes);
    this.trend = new MemoryTrend({
      horizonMs: cfg.leakHorizonMs, warmupMs: cfg.leakWarmupMs, minSpanMs: cfg.leakMinSpanMs, slopeBytesPerMin: cfg.leakSlopeBytesPerMin,
    });
    this.gpu = new GpuSampler(nvmlReader(), cfg.gpuSampleMs);
    if (this.gpu.latest().source === 'none') this.gpu.stop();
    const gpu = this.gpu.latest();
    const d = models.decoder.shape;
    this.budget = planBudget(cfg, this.staticBytes,
      gpu.source === 'nvml' ? gpu.gpus.reduce((s, g) => s + g.totalBytes, 0) : null, totalmem(),
      { bytesPerToken: models.decoder.kvBytesPerToken, maxPositions: d.maxPositions });
    const blockBytes = cfg.kvBlockSize * models.decoder.kvBytesPerToken;
    const numBlocks = Math.floor(this.budget.kvPoolBytes / blockBytes);
    if (numBlocks < 1) throw new Error(`the KV pool (${this.budget.kvPoolBytes} bytes) holds no block of ${blockBytes} bytes`);
    const blocks = (this.blocks = new BlockManager({
      numBlocks, blockSize: cfg.kvBlockSize, watermark: cfg.kvWatermark,
      buckets: cfg.blockTableBuckets, enablePrefixCaching: cfg.prefixCaching,
    }));
    const decoder = models.decoder;
    // The CUDA decoder allocates everything now, for this pool; its figures become the accountant's
    // (graphs included), so the workspace the budget leaves is exact.
    const pool = { numBlocks, blockSize: cfg.kvBlockSize };
    const runner = decoder instanceof CudaDecoder ? decoder.createRunner(numBlocks) : new OrtModelRunner(decoder, pool);
    if (runner instanceof CudaModelRunner) this.loads = { ...models.loads, decoder: CudaDecoder.loadBytes(runner) };
    this.engine = new Engine(runner, blocks, { ...pool, maxNumSeqs: cfg.maxNumSeqs, maxNumBatchedTokens: cfg.maxNumBatchedTokens });
    const memoryModel = new MemoryModel(models.reranker.dims, decoder instanceof CudaDecoder ? { ...d, preallocated: true } : {
      ...d, kvLayout: decoder.layout, kvInPlace: decoder.runPath.path === 'direct', lora: decoder.loraSlots !== null,
      loraMaxRank: this.adapters.pool ? cfg.maxLoraRank : 0,
    }, cfg.kvBlockSize, RERANK_BATCH, { embed: models.embedder.cuda !== undefined, rerank: models.reranker.cuda !== undefined });
    memoryModel.calibrate(memoryModel.calibration, cfg.minHeadroom); // analytic figures until a profile run
    this.guard = new MemoryGuard(memoryModel, () => {
      const kv = blocks.stats();
      return { workspaceTotal: this.workspaceBytes, kvFreeBlocks: kv.freeBlocks, kvTotalBlocks: kv.totalBlocks };
    }, cfg.reshapeOrder, { minPromptTokens: cfg.minPromptTokens, minNewTokens: cfg.minNewTokens });
    // The slow-leak check's samples, from now on (the engine and its pool exist: expectedGrowthBytes).
    this.sampleMemory();
    this.trendTimer = setInterval(() => this.sampleMemory(), cfg.leakSampleMs);
    this.trendTimer.unref();
  }

  /** Bytes of the three models (host and device), as measured when they loaded. */
  get weightBytes(): number {
    const { embedder, reranker, decoder } = this.loads;
    return embedder.bytes + reranker.bytes + decoder.bytes;
  }

  /** The adapter slots' bytes (allocated at start-up; 0 where adapters cannot run). */
  get adapterSlotBytes(): number {
    return this.adapters.pool?.bytes ?? 0;
  }

  /**
   * The counting allocator's warm cache at its limit (counting-allocator.c): freed run buffers kept
   * resident for the next run, spent up front from the budget as the weights are (0 where not installed).
   */
  get allocatorWarmBytes(): number {
    return countingAllocator()?.warmLimit() ?? 0;
  }

  /**
   * What the budget holds before the KV pool and any request: the weights, the adapter slots, the index
   * and the allocator's warm cache. The one sum the budget is planned from (planBudget), the workspace
   * is left from, and bench:guard sizes its budget from: a component added here is counted by all three.
   */
  get staticBytes(): number {
    return this.weightBytes + this.adapterSlotBytes + this.store.indexBytes + this.allocatorWarmBytes;
  }

  /** What the budget leaves model runs now (the index grows with ingestion). */
  get workspaceBytes(): number {
    return this.budget.budgetBytes - this.staticBytes - this.engine.pool.bytes;
  }

  /** A query's shape for the guards, at its worst case: the full prompt budget, the longest pairs. */
  requestShape(q: QueryInput): RequestShape {
    const { embedder, reranker, decoder } = this.models;
    return {
      queryTokens: embedder.inputIds(q.query).length,
      // Also the query's top_k once admitted (a reshape may halve it): kept as asked when rerank is off,
      // where the memory model's rerank stage is then an overestimate.
      topK: q.topK,
      rerankTopN: q.rerankTopN,
      pairTokens: reranker.maxTokens,
      rerankBatch: q.rerankBatch ?? RERANK_BATCH,
      promptTokens: Math.min(q.promptBudget ?? this.cfg.promptBudgetTokens, decoder.shape.maxPositions - q.maxNewTokens),
      maxNewTokens: q.maxNewTokens,
    };
  }

  /** The decoder's chat template (its own, or the fallback), for chats without retrieval (the /v1 routes, the library's generate). */
  get chatTemplate(): ChatTemplate {
    this.chatForModel ??= ChatTemplate.forModel(this.models.decoder.tokenizer, this.models.decoder.bosId);
    return this.chatForModel;
  }
  private chatForModel: ChatTemplate | undefined;

  /**
   * Waits for the writes begun so far and for the engine's requests to end, then stops the service's
   * timers (GPU sampling). The models stay loaded for the process's life (their sessions are not reused).
   */
  async close(): Promise<void> {
    await this.settled();
    await this.engine.idle();
    this.gpu.stop();
    clearInterval(this.trendTimer);
    await this.store.close();
  }

  /**
   * What the store holds for its documents, predicted from their sizes (the store's running total:
   * faiss's vectors and HNSW links, the chunks' texts and objects, lexical postings; nothing for the
   * Postgres store, whose documents live in the database). Growth by this much is the index growing,
   * not a leak (growth.ts).
   */
  storeResidentBytes(): number {
    return this.store.residentBytes;
  }

  /**
   * Growth the process is expected to show: the store's documents, and the KV pool's blocks as they are
   * first used (a host pool's pages are written, and become resident, block by block: bounded by the
   * pool, not a leak), and the counting allocator's warm cache (freed run buffers kept resident for
   * reuse, filling as new run shapes come: bounded by RAGGUARD_ALLOCATOR_WARM_BYTES, not a leak). A device
   * pool adds nothing on the host.
   */
  expectedGrowthBytes(): number {
    const hostPool = this.engine.runner.pool.location !== 'device';
    const kv = hostPool ? this.blocks.stats().touchedBlocks * this.cfg.kvBlockSize * this.models.decoder.kvBytesPerToken : 0;
    return this.storeResidentBytes() + kv + (countingAllocator()?.warm() ?? 0);
  }

  /**
   * One sample of the slow-leak check (the timer's; tests call it to sample at once). Before it, glibc's
   * free heap pages go back to the OS once they pass TRIM_FREE_BYTES: a 10-minute soak grew the main
   * arena's free bytes from 28 to 155 MB (freed request buffers under the 2 MiB mmap threshold that
   * only a trim returns) while the bytes in use grew by 7 MB; resident memory then tracks what is live.
   */
  sampleMemory(at = Date.now()): void {
    const heap = mallocStats();
    if (heap && heap.freeBytes > TRIM_FREE_BYTES) trimMalloc();
    const m = processMemory();
    this.trend.record({ at, rss: m.rss, heapUsed: m.heapUsed, external: m.external, expectedBytes: this.expectedGrowthBytes() });
  }

  /** `onPhase` hears each start-up phase as it begins (the start-up log's progress). */
  static async start(cfg: Config, models?: Models, onPhase?: (phase: StartPhase, service: RagService) => void): Promise<RagService> {
    const m = models ?? (await loadModels(cfg));
    const store = await openStore(cfg, m.embedder.dimension);
    const service = new RagService(cfg, m, store);
    if (cfg.profileRun) onPhase?.({ phase: 'profile' }, service);
    if (cfg.profileRun) await service.profileMemory();
    if ((await store.counts()).documents === 0 && cfg.corpusDir) {
      const docs = await readCorpus(cfg.corpusDir);
      onPhase?.({ phase: 'ingest', documents: docs.length }, service);
      try {
        await service.ingest(docs);
      } catch (e) {
        // Replicas starting together on one Postgres: one of them ingested the corpus first.
        if (!(e instanceof DocumentExistsError) || store.kind === 'faiss') throw e;
      }
    }
    // BM25 over the corpus now, not in the first query's turn of the event loop (2864 chunks: most
    // of a second, during which a first burst's probes and 503s waited).
    if (store instanceof FaissStore && cfg.retrieval !== 'dense') store.lexicalIndex();
    onPhase?.({ phase: 'ready' }, service);
    return service;
  }

  /**
   * Calibrates the memory model by the profile run at the largest shapes the configuration allows, or
   * by the calibration a run under the same inputs stored (RAGGUARD_CALIBRATION_CACHE, calibration-cache.ts).
   * Call before serving: the measurement needs the process to itself.
   */
  async profileMemory(): Promise<ProfileReport> {
    const { embedder, reranker, decoder } = this.models;
    // The CUDA decoder's and encoders' runs allocate nothing (all at start-up): only the others' placement picks the meter.
    const measured = [embedder.cuda ? undefined : embedder, reranker.cuda ? undefined : reranker, decoder instanceof CudaDecoder ? undefined : decoder]
      .filter((m) => m !== undefined);
    if (measured.length === 0) {
      this.profile = { source: 'analytic', reason: 'every model runs on the CUDA backend, whose runs allocate nothing beyond what start-up allocated' };
      return this.profile;
    }
    const where = new Set(measured.map((m) => (m.provider === 'cpu' ? 'host' : 'device')));
    const promptTokens = Math.min(this.cfg.promptBudgetTokens, decoder.shape.maxPositions - 1);
    // All on the host: ONNX Runtime's accounted bytes (or the kernel's resident peak); all on the GPU:
    // NVML's sampled device memory.
    const meter = where.size > 1 ? undefined : where.has('host') ? hostMeter(this.cfg) : gpuPeakMeter(nvmlReader());
    const limits: ProfileLimits = {
      queryTokens: Math.min(embedder.maxTokens, this.cfg.maxQueryTokens + 2),
      rerankPairs: Math.min(RERANK_BATCH, this.cfg.maxTopK),
      pairTokens: reranker.maxTokens,
      promptTokens,
      contextTokens: Math.min(decoder.shape.maxPositions, promptTokens + this.cfg.maxNewTokensLimit),
      decodeRows: this.cfg.maxNumSeqs,
    };
    const cacheFile = this.cfg.calibrationCache && meter?.available ? path.join(this.cfg.indexDir, CALIBRATION_FILE) : undefined;
    this.profile = !meter
      ? { source: 'analytic', reason: 'models split between host and GPU: no single meter sees every run' }
      : await profileWithCache(cacheFile, () => calibrationKey(this.cfg, profilePlan(this.guard.model, limits), this.gpu.latest()),
        () => profileMemory(this.guard.model, {
          embed: (b, s) => embedder.profileRun(b, s),
          rerank: (b, s) => reranker.profileRun(b, s),
          // The CUDA decoder's runs add nothing to what start-up allocated (memory-model.ts `preallocated`).
          decoder: (r, s, c) => (decoder instanceof DecoderModel ? decoder.profileRun(r, s, c) : Promise.resolve()),
        }, limits, meter, (done, of) => (this.profileProgress = { done, of })));
    if (this.profile.source === 'profile') this.guard.model.calibrate(this.profile.calibration, Math.max(this.cfg.minHeadroom, this.profile.headroom));
    return this.profile;
  }

  /** Chunks, embeds and adds the documents, visible once one snapshot for the whole batch is durable. */
  ingest(docs: readonly DocumentInput[], signal?: AbortSignal): Promise<IngestResult[]> {
    const run = this.ingestTail.then(() => this.ingestNow(docs, signal));
    this.ingestTail = run.then(() => undefined, () => undefined); // nothing of the result kept
    return run;
  }

  /** Runs a write to the index after every earlier one (ingest, replacement, removal): one writer at a time. */
  writeExclusive<T>(work: () => Promise<T>): Promise<T> {
    const run = this.ingestTail.then(work);
    this.ingestTail = run.then(() => undefined, () => undefined); // nothing of the result kept
    return run;
  }

  /** Resolves when every write begun so far has settled (its snapshot durable, or nothing of it kept). */
  async settled(): Promise<void> {
    await this.ingestTail;
  }

  private async ingestNow(docs: readonly DocumentInput[], signal?: AbortSignal): Promise<IngestResult[]> {
    const { embedder } = this.models;
    const prepared = docs.map((d) => {
      const docId = d.docId ?? `doc-${createHash('sha256').update(d.text).digest('hex').slice(0, 16)}`;
      return { docId, title: d.title ?? docId, text: d.text, sections: d.sections ?? [{ text: d.text }], metadata: d.metadata, collection: d.collection ?? DEFAULT_COLLECTION };
    });
    const seen = new Set<string>();
    // Before any embedding: a duplicate fails fast (the store checks again as it commits).
    for (const d of prepared) {
      const k = `${d.collection}\u0000${d.docId}`;
      if (seen.has(k) || (await this.store.get(d.collection, d.docId))) throw new DocumentExistsError(d.docId, d.collection);
      seen.add(k);
    }
    const results: IngestResult[] = [];
    const batch: NewDocument[] = [];
    const progress = (this.ingestProgress = { done: 0, of: prepared.length });
    for (const d of prepared) {
      signal?.throwIfAborted(); // abandoned (or stopped by shutdown): nothing of the batch is kept
      const spans = chunkSections(d.sections, (w) => embedder.tokenizer.encode(w).length, {
        chunkTokens: this.cfg.chunkTokens,
        overlapTokens: this.cfg.chunkOverlapTokens,
      });
      const vectors = await embedder.embed(spans.map((s) => embeddingText(d.title, s.text)));
      batch.push({ doc: { docId: d.docId, title: d.title, bytes: Buffer.byteLength(d.text), collection: d.collection, ...(d.metadata ? { metadata: d.metadata } : {}) }, chunks: spans, vectors });
      results.push({ doc_id: d.docId, title: d.title, chunks: spans.length, collection: d.collection });
      progress.done++;
    }
    signal?.throwIfAborted();
    // Atomic: queries, /healthz and later snapshots see the batch only once its own snapshot is durable.
    await this.store.addBatch(batch);
    return results;
  }

  /** Answers the query; an abort of `signal` (client gone, shutdown) stops it between stages or at the engine's next step. */
  async query(q: QueryInput, requestSignal?: AbortSignal): Promise<QueryResult> {
    const { embedder, reranker, decoder } = this.models;
    // The request's signal (a hang-up, shutdown) and a stream's own (a closed stream) both stop every stage.
    const signals = [requestSignal, q.hooks?.signal].filter((x): x is AbortSignal => x !== undefined);
    const signal = signals.length > 1 ? AbortSignal.any(signals) : signals[0];
    signal?.throwIfAborted();
    let t = performance.now();
    const qv = await embedder.embed([q.query], undefined, signal);
    const embedMs = ms(t);
    // Retrieval and prompt assembly (a few ms of the main thread each) on turns of their own (runtime/turns.ts).
    await nextTurn();

    t = performance.now();
    // A turn between the lexical and the dense search as well (retriever.ts).
    const { hits, pruned } = await this.retriever.searchPaced(qv, q.query, q.topK, q.filter ?? { collection: DEFAULT_COLLECTION }, nextTurn);
    const unique = dedupe(pruned, this.cfg.dedupeJaccard);
    const searchMs = ms(t);

    signal?.throwIfAborted();
    t = performance.now();
    const titled = (h: Hit) => `${h.chunk.title}\n${h.chunk.text}`;
    // Rerank off: the first stage's order and scores stand, and no pair is scored.
    const { scores, pairTokens, runs: rerankRuns } = this.cfg.rerank
      ? await reranker.score(q.query, unique.map(titled), q.rerankBatch, signal)
      : { scores: unique.map((h) => h.score), pairTokens: 0, runs: [] };
    const ranked = unique
      .map((hit, i) => ({ hit, score: scores[i]! }))
      .sort((a, b) => b.score - a.score)
      .slice(0, q.rerankTopN);
    const rerankMs = ms(t);

    // Prompt assembly (a whole prompt through the tokenizer) on a turn of its own, too.
    await nextTurn();
    signal?.throwIfAborted();
    t = performance.now();
    const budget = Math.min(q.promptBudget ?? this.cfg.promptBudgetTokens, decoder.shape.maxPositions - q.maxNewTokens);
    const chunks = ranked.map((r) => ({ title: r.hit.chunk.title, text: r.hit.chunk.text }));
    // A turn of the event loop between two encodings of a long prompt (turns.ts).
    const prompt = q.promptFor ? await q.promptFor(chunks, budget, nextTurn)
      : this.chat ? await chatContextPrompt(this.chat, this.template, [{ role: 'user', content: q.query }], chunks, budget, nextTurn)
        : assemblePrompt(decoder.tokenizer, this.template, this.promptBosId, q.query, chunks, budget);
    const citations = prompt.included.map((i) => {
      const { hit, score } = ranked[i]!;
      return {
        doc_id: hit.chunk.docId,
        collection: hit.chunk.collection,
        title: hit.chunk.title,
        chunk_id: hit.chunk.id,
        score,
        retrieval_score: hit.score,
        text: hit.chunk.text,
        ...(hit.chunk.locator === undefined ? {} : { locator: hit.chunk.locator }),
      };
    });
    q.hooks?.onCitations?.(citations);
    // The adapter loads for generation only (nothing before it uses it) and is released right after.
    const lease = q.adapter === undefined ? undefined : await this.adapters.acquire(q.adapter, signal);
    let gen: Generation;
    try {
      const hooks = { ...q.hooks, signal };
      gen = await this.engine.generate(prompt.ids, { ...q.sampling, maxNewTokens: q.maxNewTokens, temperature: q.temperature, seed: q.seed, adapter: lease?.adapter, ...(q.cacheSalt === undefined ? {} : { cacheSalt: q.cacheSalt }) }, hooks);
    } finally {
      lease?.release();
    }
    const generateMs = ms(t);
    this.growth.record(processMemory());

    return {
      answer: gen.text,
      citations,
      finish_reason: gen.finishReason,
      usage: { prompt_tokens: prompt.ids.length, completion_tokens: gen.ids.length },
      retrieval: {
        hits: hits.length, after_prune: pruned.length, after_dedupe: unique.length, reranked: ranked.length,
        in_prompt: prompt.included.length, truncated: prompt.truncated.length,
      },
      timings_ms: { embed: embedMs, search: searchMs, rerank: rerankMs, generate: generateMs },
      shape: {
        queryTokens: embedder.inputIds(q.query).length, topK: this.cfg.rerank ? unique.length : 0, rerankTopN: q.rerankTopN, pairTokens,
        rerankBatch: q.rerankBatch ?? RERANK_BATCH, rerankRuns,
        promptTokens: prompt.ids.length, maxNewTokens: q.maxNewTokens, cachedTokens: gen.cachedTokens ?? 0,
      },
      ...(lease ? { adapter: { name: lease.info.name, key: lease.adapter.key } } : {}),
      ...(gen.steered ? { steered_to_close: true as const } : {}),
    };
  }
}

export type StartPhase = { phase: 'profile' } | { phase: 'ingest'; documents: number } | { phase: 'ready' };

/** A document of that id exists in that collection (the store's error, under the service's older name). */
export { DocumentExistsError as DuplicateDocumentError };

export { readCorpus } from '../retrieval/corpus.js';
