/** The validated configuration's shape (config.ts reads it from the environment and re-exports these names). */
import type { TenantKey } from './keys-file.js';

/** What a reshape may shrink, in the order RAGGUARD_RESHAPE_ORDER lists them (guards/policy.ts applies them). */
export type ReshapeStep = 'batch' | 'rerank' | 'context' | 'new_tokens';
export const RESHAPE_STEPS: readonly ReshapeStep[] = ['batch', 'rerank', 'context', 'new_tokens'];

/** ONNX Runtime's WebGPU storage-buffer cache modes (RAGGUARD_WEBGPU_BUFFER_CACHE). */
export type WebGpuBufferCache = 'disabled' | 'lazyRelease' | 'simple' | 'bucket';

export type ExecutionProvider = 'cpu' | 'webgpu' | 'cuda' | 'auto';
export type ModelRole = 'embedder' | 'reranker' | 'decoder';
export type RetrievalMode = 'hybrid' | 'dense' | 'lexical';
export const PROVIDERS = ['cpu', 'webgpu', 'cuda', 'auto'] as const;

export interface Config {
  host: string;
  port: number;
  /** Model directories in the Hugging Face / Optimum export layout. */
  embedderPath: string;
  rerankerPath: string;
  decoderPath: string;
  /** A .gguf decoder's weights in the converted graph, and where conversions are cached. */
  ggufWeights: 'nbits' | 'dequant';
  /** The CUDA decoder's matrices: as the checkpoint holds them, or FP8 made at load. */
  cudaWeights: 'model' | 'fp8';
  cudaFp8Gemm: 'cublaslt' | 'tiles';
  cudaQgemv: 'float' | 'half2' | 'int8';
  cudaQgemm: 'mma' | 'int8';
  /** Who runs a converted GGUF's block products on the CPU: ragguard's QMatMul8 and QMatMul4, or ONNX Runtime's MatMulNBits. */
  cpuKernels: 'ragguard' | 'onnxruntime';
  /** LoRA inputs in a .gguf decoder's converted graph: on, off, or auto (on where an adapter in adapterDir fits it). */
  decoderLora: 'auto' | 'on' | 'off';
  ggufCacheDir: string;
  /** An Optimum export as the decoder: converted into the genai layout (cached) on the CPU, always, or never (export-decoder.ts). */
  decoderConvert: 'auto' | 'genai' | 'off';
  /** Directory of LoRA adapters (one PEFT directory each); '' = adapters off. */
  adapterDir: string;
  /** The adapter a /query that names none generates with: auto (the shipped grounded one where it fits), off, or a name. */
  queryAdapter: string;
  /** Adapter slots: resident at once, and the largest rank of one module. */
  maxLoras: number;
  maxLoraRank: number;
  executionProvider: ExecutionProvider;
  /** Per model: its own RAGGUARD_*_EP, else RAGGUARD_EXECUTION_PROVIDER. */
  providers: Record<ModelRole, ExecutionProvider>;
  /** WebGPU storage-buffer cache mode; undefined = ONNX Runtime's default. */
  webgpuBufferCache: WebGpuBufferCache | undefined;
  /** The CUDA encoder's runs (RAGGUARD_EMBEDDER_EP / RAGGUARD_RERANKER_EP=cuda): sequences, and sequences x padded width, at most. */
  cudaEncoderRows: number;
  cudaEncoderTokens: number;
  /** Threads that tokenize for an encoder on the CUDA encoder ('auto': the cores less two, at most 8). */
  tokenizerThreads: number | 'auto';
  /** Where the index snapshot lives; created when missing. */
  indexDir: string;
  /** The retrieval store: 'faiss' (in process, snapshot in indexDir) or a PostgreSQL URL (pgvector, shared by replicas). */
  store: string;
  /** pgvector's hnsw.ef_search on the Postgres store. */
  pgEfSearch: number;
  /** The Postgres store's connection pool, its connect and statement timeouts (ms; 0: none). */
  pgPoolSize: number;
  pgConnectTimeoutMs: number;
  pgStatementTimeoutMs: number;
  /** pgvector's HNSW build settings for a new database's index. */
  pgHnswM: number;
  pgHnswEfConstruction: number;
  /** Whether the server brings a Postgres schema that is behind forward at start (auto) or refuses (never). */
  pgMigrate: 'auto' | 'never';
  /** The faiss store: chunks from which its index is HNSW (0: never), HNSW's search and build settings. */
  faissAnnMin: number;
  faissEfSearch: number;
  faissHnswM: number;
  faissEfConstruction: number;
  /** The faiss store's snapshot size from which writes go to its log, and the log's compaction threshold. */
  faissLogBytes: number;
  /** Corpus ingested when the index is empty at start-up ('' = none). */
  corpusDir: string;
  chunkTokens: number;
  chunkOverlapTokens: number;
  defaultTopK: number;
  maxTopK: number;
  defaultRerankTopN: number;
  maxRerankTopN: number;
  defaultMaxNewTokens: number;
  maxNewTokensLimit: number;
  /** Largest `n` (samples per request) the /v1 generation routes take. */
  maxN: number;
  /** Upper bound on prompt tokens given to the decoder (context + question + template). */
  promptBudgetTokens: number;
  /** /query answers' code spans copied from the prompt's chunks; 'first': the answer opens with one (generate/span-answer.ts). */
  queryCopySpan: 'off' | 'first' | 'ticks';
  /** Sentences of each chunk kept in a /query prompt, those sharing most of the question's words (retrieval/focus.ts); 0 = whole chunks. */
  contextSentences: number;
  maxQueryTokens: number;
  /** Hits scoring below best - pruneMargin (cosine) are dropped before rerank. */
  pruneMargin: number;
  /** Word-shingle Jaccard similarity at or above which two hits count as duplicates. */
  dedupeJaccard: number;
  /** First stage: dense (faiss), lexical (BM25), or both fused by reciprocal rank; its weights and depth. */
  retrieval: RetrievalMode;
  rrfK: number;
  rrfDenseWeight: number;
  rrfLexicalWeight: number;
  retrievalDepth: number;
  bm25K1: number;
  bm25B: number;
  /** Cross-encoder rerank of the first stage's hits; off: they keep the first stage's order. */
  rerank: boolean;
  maxDocumentBytes: number;
  /** Largest file upload (multipart, or base64 in JSON) to POST /documents or PUT /documents/:id, per request. */
  maxUploadBytes: number;
  /** Paged KV cache: tokens per block, pool size, admission watermark, batching limits. */
  kvBlockSize: number;
  /** Explicit KV pool size; 0 = the budget's share (kvFraction of what weights and index leave). */
  kvCacheBytes: number;
  /** Memory budget: bytes, or a fraction of the GPU's memory (of the host's without a GPU). */
  memoryBudget: { bytes: number } | { fraction: number };
  kvFraction: number;
  /** Memory guards on (predict, reshape, reserve, 413/503); off only to measure what they prevent. */
  guards: boolean;
  /** Calibrate the memory model by a profile run at start-up. */
  profileRun: boolean;
  /** Keep the profile run's calibration in indexDir/calibration.json and restore it while nothing it depends on changed. */
  calibrationCache: boolean;
  /** What the profile run measures of a run on the host: ONNX Runtime's accounted bytes, or resident memory. */
  hostMeter: 'accounted' | 'resident';
  /** Bytes of freed large blocks the counting allocator keeps resident for reuse (counting-allocator.c). */
  allocatorWarmBytes: number;
  /** Reservations are predictions x (1 + headroom), the headroom at least this. */
  minHeadroom: number;
  reshapeOrder: ReshapeStep[];
  minPromptTokens: number;
  minNewTokens: number;
  kvWatermark: number;
  blockTableBuckets: number[];
  prefixCaching: boolean;
  /** POST /v1/route-key: the key's cap in KV blocks when the request names none (0: up to the first user message). */
  routeKeyBlocks: number;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  /** Leak check: requests in the growth window, and the growth that flags it. */
  leakWindow: number;
  leakThresholdBytes: number;
  /** The slow-leak check (guards/growth.ts MemoryTrend): sampling period, warm-up, horizon, shortest span and slope that flags. */
  leakSampleMs: number;
  leakWarmupMs: number;
  leakHorizonMs: number;
  leakMinSpanMs: number;
  leakSlopeBytesPerMin: number;
  /** NVML sampling period for GPU memory readings. */
  gpuSampleMs: number;
  /** Requests generating at once; more wait in the queue. */
  maxConcurrentQueries: number;
  maxQueueLength: number;
  queueTimeoutMs: number;
  /** Bearer keys (auth.ts): '' = not required. */
  apiKey: string;
  adminKey: string;
  /** RAGGUARD_KEYS_FILE's path ('' = none) and its keys, each scoped to collections with its limits (keys-file.ts). */
  keysFile: string;
  keys: TenantKey[];
  /** Origins allowed by CORS; ['*'] = any; [] = CORS off. */
  corsOrigins: string[];
  logLevel: 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent';
  /** On SIGTERM/SIGINT: how long requests in flight may take to finish before they are stopped. */
  shutdownGraceMs: number;
  /** How long an idle keep-alive connection stays open (Node's server.keepAliveTimeout). */
  keepAliveTimeoutMs: number;
  /** Linux: nice value of every thread but the event loop's (runtime/thread-priority.ts); 0 = unchanged. */
  workerThreadNice: number;
  /** Intra-op threads of each CPU session through the C API (0 = ONNX Runtime's default). */
  intraOpThreads: number;
  /** Whether those threads spin while a run goes on ('runs') or always sleep when idle ('off'). */
  intraOpSpin: 'off' | 'runs';
  /** One query through the server before it reports ready (server/warmup.ts). */
  warmup: boolean;
  /** OTEL_EXPORTER_OTLP_ENDPOINT: the OTLP/HTTP base URL ('' = none). */
  otlpEndpoint: string;
  /** Where spans are exported (OTLP over HTTP): OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else the base URL's /v1/traces; '' = tracing off. */
  otlpTracesEndpoint: string;
  /** OTEL_SERVICE_NAME: the service.name of the spans' resource. */
  serviceName: string;
}
