/**
 * The RAG service: ingest documents into the store, answer queries (the query pipeline,
 * query-pipeline.ts), and hold what sits between the models and the store: the memory budget and its
 * guard, the KV block manager, the generation engine, the adapters, the leak checks. How it is built
 * (models loaded, backends picked, budget and engine wired) is bootstrap.ts's; how a request runs under
 * the admission queue and the guard, guarded-run.ts's.
 */
import { createHash } from 'node:crypto';
import { totalmem } from 'node:os';
import type { Config } from '../config/config.js';
import { AdapterNotFoundError, AdapterInvalidError, AdapterRegistry, resolveQueryAdapter, type QueryAdapter } from '../generate/adapters.js';
import type { BlockManager } from '../generate/block-manager.js';
import type { Engine } from '../generate/engine.js';
import { ChatTemplate } from '../generate/chat-template.js';
import type { PromptTemplate } from '../generate/prompt.js';
import type { BudgetPlan } from '../guards/budget.js';
import { GrowthTracker, MemoryTrend } from '../guards/growth.js';
import type { MemoryGuard } from '../guards/guard.js';
import type { RequestShape } from '../guards/memory-model.js';
import { GpuSampler, nvmlReader } from '../guards/nvml.js';
import { processMemory } from '../guards/process-memory.js';
import type { ProfileReport } from '../guards/profile.js';
import { mallocStats, trimMalloc } from '../runtime/malloc.js';
import { countingAllocator } from '../backends/ort/ort-allocator.js';
import { inSpan } from '../runtime/tracing.js';
import { chunkSections, type Section } from '../retrieval/chunker.js';
import { embeddingText, readCorpus } from '../retrieval/corpus.js';
import { Retriever } from '../retrieval/retriever.js';
import { openStore } from '../retrieval/open-store.js';
import { FaissStore } from '../retrieval/faiss-store.js';
import { DEFAULT_COLLECTION, DocumentExistsError, type Metadata, type NewDocument, type RetrievalStore } from '../retrieval/retrieval-store.js';
import { calibrateGuard, loadModels, wireEngine, type Models } from './bootstrap.js';
import { QueryPipeline, type QueryInput, type QueryResult } from './query-pipeline.js';

// What callers know the service by: the models and how they load, the query's types.
export { cudaDecoderLimits, decoderRuntime, encoderLoadBytes, loadModels, type Decoder, type Models } from './bootstrap.js';
export type { Citation, QueryHooks, QueryInput, QueryResult, SamplingOptions } from './query-pipeline.js';

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

/** Free bytes in glibc's arenas above which the leak check's sample trims them first (sampleMemory). */
const TRIM_FREE_BYTES = 64 * 2 ** 20;

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
  /** RAGGUARD_QUERY_ADAPTER as start() resolved it, and why (the start-up log's line). */
  private resolvedQueryAdapter: QueryAdapter = { name: undefined, note: '' };
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
  /** embed -> search -> prune -> rerank -> prompt -> generate, on this service's parts (query-pipeline.ts). */
  private readonly pipeline: QueryPipeline;
  /** Ingestion mutates the index and rewrites the snapshot: one at a time. */
  private ingestTail: Promise<unknown> = Promise.resolve();

  constructor(
    readonly cfg: Config,
    readonly models: Models,
    readonly store: RetrievalStore,
  ) {
    this.retriever = new Retriever(store, cfg);
    this.adapters = new AdapterRegistry(cfg.adapterDir, models.decoder, { maxLoras: cfg.maxLoras, maxRank: cfg.maxLoraRank, waitMs: cfg.queueTimeoutMs });
    this.growth = new GrowthTracker(cfg.leakWindow, cfg.leakThresholdBytes);
    this.trend = new MemoryTrend({
      horizonMs: cfg.leakHorizonMs, warmupMs: cfg.leakWarmupMs, minSpanMs: cfg.leakMinSpanMs, slopeBytesPerMin: cfg.leakSlopeBytesPerMin,
    });
    this.gpu = new GpuSampler(nvmlReader(), cfg.gpuSampleMs);
    if (this.gpu.latest().source === 'none') this.gpu.stop();
    const gpu = this.gpu.latest();
    // Budget, KV pool, runner, engine and guard (bootstrap.ts), planned from staticBytes' one sum.
    const w = wireEngine(cfg, models, this.adapters, gpu.source === 'nvml' ? gpu.gpus.reduce((s, g) => s + g.totalBytes, 0) : null, totalmem(),
      (loads) => this.heldBytes(loads), () => this.workspaceBytes);
    this.loads = w.loads;
    this.budget = w.budget;
    this.blocks = w.blocks;
    this.engine = w.engine;
    this.guard = w.guard;
    this.pipeline = new QueryPipeline({
      cfg, embedder: models.embedder, reranker: models.reranker, decoder: models.decoder,
      retriever: this.retriever, engine: this.engine, adapters: this.adapters, growth: this.growth,
    });
    this.template = this.pipeline.template;
    this.promptBosId = this.pipeline.promptBosId;
    this.chat = this.pipeline.chat;
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
    return this.heldBytes(this.loads);
  }

  /** staticBytes with the models' figures `loads` (the CUDA decoder's plan, before its runner exists). */
  private heldBytes(loads: Models['loads']): number {
    return loads.embedder.bytes + loads.reranker.bytes + loads.decoder.bytes + this.adapterSlotBytes + this.store.indexBytes + this.allocatorWarmBytes;
  }

  /** What the budget leaves model runs now (the index grows with ingestion). */
  get workspaceBytes(): number {
    return this.budget.budgetBytes - this.staticBytes - this.engine.pool.bytes;
  }

  /** A query's shape for the guards, at its worst case: the full prompt budget, the longest pairs. */
  requestShape(q: QueryInput): RequestShape {
    return this.pipeline.requestShape(q);
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
   * pool, not a leak), and the counting allocator's warm cache as far as it is resident (freed run
   * buffers kept for reuse, filling as new run shapes come and as their pages are first written: bounded
   * by RAGGUARD_ALLOCATOR_WARM_BYTES, not a leak). A device pool adds nothing on the host.
   * `warmResident`: the warm cache's resident bytes where the caller read them already (each read is a
   * pagemap pass over up to the whole cache).
   */
  expectedGrowthBytes(warmResident = countingAllocator()?.warmResident() ?? 0): number {
    const hostPool = this.engine.runner.pool.location !== 'device';
    const kv = hostPool ? this.blocks.stats().touchedBlocks * this.cfg.kvBlockSize * this.models.decoder.kvBytesPerToken : 0;
    return this.storeResidentBytes() + kv + warmResident;
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
    try {
      service.resolvedQueryAdapter = await resolveQueryAdapter(cfg.queryAdapter, service.adapters);
    } catch (e) {
      await service.close();
      if (e instanceof AdapterNotFoundError || e instanceof AdapterInvalidError) throw new Error(`RAGGUARD_QUERY_ADAPTER: ${e.message}`);
      throw e;
    }
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
    this.profile = await calibrateGuard(this.cfg, this.models, this.guard, () => this.gpu.latest(), (done, of) => (this.profileProgress = { done, of }));
    return this.profile;
  }

  /** Chunks, embeds and adds the documents, visible once one snapshot for the whole batch is durable. */
  ingest(docs: readonly DocumentInput[], signal?: AbortSignal): Promise<IngestResult[]> {
    // Traced (runtime/tracing.ts): an `ingest` span from its turn to its durable snapshot.
    const run = this.ingestTail.then(() => inSpan('ingest', async (span) => {
      const done = await this.ingestNow(docs, signal);
      span?.setAttributes({ 'ragguard.documents': done.length, 'ragguard.chunks': done.reduce((n, d) => n + d.chunks, 0) });
      return done;
    }));
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

  /** The adapter a query naming none runs with (RAGGUARD_QUERY_ADAPTER as start() resolved it), or undefined: the base model. */
  get queryAdapter(): string | undefined {
    return this.resolvedQueryAdapter.name;
  }

  /** Which adapter that is and why ("query adapter: coder-grounded (RAGGUARD_QUERY_ADAPTER=auto; ...)"), for the start-up log. */
  get queryAdapterNote(): string {
    return this.resolvedQueryAdapter.note;
  }

  /** The adapter a query generates with: the one it names, the base model for null, else RAGGUARD_QUERY_ADAPTER's. */
  queryAdapterFor(asked: string | null | undefined): string | undefined {
    return asked === undefined ? this.resolvedQueryAdapter.name : (asked ?? undefined);
  }

  /** Answers the query as it is given (the query pipeline); an abort of `signal` stops it between stages or at the engine's next step. */
  query(q: QueryInput, requestSignal?: AbortSignal): Promise<QueryResult> {
    return this.pipeline.run(q, requestSignal);
  }
}

export type StartPhase = { phase: 'profile' } | { phase: 'ingest'; documents: number } | { phase: 'ready' };

/** A document of that id exists in that collection (the store's error, under the service's older name). */
export { DocumentExistsError as DuplicateDocumentError };

export { readCorpus } from '../retrieval/corpus.js';
