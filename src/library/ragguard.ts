/**
 * The library's service: `createRagguard()` loads the models and the store and gives ingest, query,
 * generate, close, and the HTTP API as an express router to mount under any path of an existing app.
 * The server (library/serve.ts: `serve()`) is this router on a listening port, started through the same
 * `Ragguard.create`.
 *
 * Configuration is the server's own typed object (config/config.ts): defaults, then RAGGUARD_* style
 * settings given as `env` (validated as the server validates its environment), then typed `config`
 * fields over them. process.env is read only when passed in: an application embedding ragguard
 * decides what configures it.
 *
 * Every call runs under the same admission queue and memory guard as the HTTP routes: a request that
 * can never fit the budget is refused (TooLargeError), the rest wait for their slot and workspace (or are
 * refused with a BusyError when none comes within RAGGUARD_QUEUE_TIMEOUT_MS). These refusals are
 * RagguardErrors with the `code` the HTTP routes answer with (runtime/errors.ts).
 *
 * The service's modules (ONNX Runtime, faiss, the model code, the HTTP app) load when an instance is
 * created, not when the library is imported: importing it is cheap, so a server opens its port (and
 * answers its probes) before they load.
 */
import type express from 'express';
import { loadConfig, type Config } from '../config/config.js';
import type { ChatMessage } from '../generate/chat-template.js';
import type { FinishReason } from '../generate/generation.js';
import type { SamplingOptions } from '../service/rag.js';
import { Admission } from '../guards/admission.js';
import { ClosedError, InvalidRequestError, TooLargeError } from '../runtime/errors.js';
import { generationShape, guardedQuery, guardedRun } from '../service/guarded-run.js';
import type { SearchFilter } from '../retrieval/retrieval-store.js';
import type { Citation, DocumentInput, IngestResult, Models, QueryResult, RagService, StartPhase } from '../service/rag.js';
import type { createApp } from '../server/app.js';
import type { Lifecycle } from '../server/shutdown.js';
import { followGlobalTracing, startTracing, stopTracing, tracingOn } from '../runtime/tracing.js';
import type { Logger } from '../server/logging.js';

export type { ChatMessage, Citation, Config, DocumentInput, FinishReason, IngestResult, QueryResult, SamplingOptions, SearchFilter };

export interface RagguardOptions {
  /** RAGGUARD_* settings by name, as the server reads them from its environment (validated the same way). */
  env?: Readonly<Record<string, string | undefined>>;
  /** Typed settings over the defaults and `env`. */
  config?: Partial<Config>;
}

export interface QueryOptions {
  query: string;
  /** Defaults: RAGGUARD_TOP_K, RAGGUARD_RERANK_TOP_N, RAGGUARD_MAX_NEW_TOKENS; temperature 0 (greedy). */
  topK?: number;
  rerankTopN?: number;
  maxNewTokens?: number;
  temperature?: number;
  seed?: number;
  /** A LoRA adapter's name under RAGGUARD_ADAPTER_DIR; null for the base model; left out, RAGGUARD_QUERY_ADAPTER's (`queryAdapter`). */
  adapter?: string | null;
  /** A tenant's prefix-cache salt: its cached prompt blocks are found only by requests with the same salt (vLLM's cache_salt). */
  cacheSalt?: string;
  /** The collection searched ('default' when left out) and metadata conditions every hit meets. */
  filter?: SearchFilter;
  sampling?: SamplingOptions;
  /** Stops the query at its next stage or engine step; it then rejects with the signal's reason. */
  signal?: AbortSignal;
}

export interface GenerateOptions {
  /** A plain prompt (encoded as the decoder's tokenizer does) or a chat, rendered by the model's chat template. */
  prompt?: string;
  messages?: ChatMessage[];
  maxNewTokens?: number;
  temperature?: number;
  seed?: number;
  adapter?: string;
  /** A tenant's prefix-cache salt: its cached prompt blocks are found only by requests with the same salt (vLLM's cache_salt). */
  cacheSalt?: string;
  sampling?: SamplingOptions;
  signal?: AbortSignal;
}

export interface GenerateResult {
  text: string;
  finishReason: FinishReason;
  usage: { promptTokens: number; completionTokens: number };
}

export interface RouterOptions {
  /** Where request lines go (pino); JSON on stdout by default. */
  logger?: Logger;
  /** Readiness, draining and each request's AbortSignal: serve() drains it on SIGTERM (server/shutdown.ts). */
  lifecycle?: Lifecycle;
}

/** How a start goes, for a caller that shows it (serve(): the probes' phase and the start-up log). */
export interface StartOptions {
  /** The models, loaded already (serve() loads them itself, to report each as it loads); else loaded here. */
  models?: Models;
  /** Told as the start enters each phase after loading (the profile run, the sample corpus' ingest). */
  onPhase?: (phase: StartPhase, service: RagService) => void;
}

/** Resolves the configuration as createRagguard does, without loading anything. */
export function resolveConfig(opts: RagguardOptions = {}): Config {
  return { ...loadConfig(opts.env ?? {}), ...opts.config };
}

export class Ragguard {
  /** One queue for every way in (library calls and the routers mounted from this instance). */
  private readonly admission: Admission;
  private closed = false;
  /** This instance started the OpenTelemetry SDK (its configuration named an endpoint): its close flushes it. */
  private ownsTracing = false;

  private constructor(readonly service: RagService, private readonly app: typeof createApp) {
    const { cfg } = service;
    this.admission = new Admission({ concurrency: cfg.maxConcurrentQueries, maxQueue: cfg.maxQueueLength, timeoutMs: cfg.queueTimeoutMs });
  }

  static async create(opts: RagguardOptions = {}, start: StartOptions = {}): Promise<Ragguard> {
    const cfg = resolveConfig(opts);
    const [{ RagService }, { createApp }] = await Promise.all([import('../service/rag.js'), import('../server/app.js')]);
    // Traces as the server makes them: the SDK started here where the configuration names an endpoint
    // (OTEL_EXPORTER_OTLP_ENDPOINT in `env`); else, where the application registered an OpenTelemetry SDK
    // of its own, ragguard's spans go to it; else none.
    const owns = !tracingOn() && (await startTracing(cfg));
    if (!owns) followGlobalTracing();
    let service: RagService;
    try {
      service = await RagService.start(cfg, start.models, start.onPhase);
    } catch (e) {
      if (owns) await stopTracing().catch(() => {});
      throw e;
    }
    const rg = new Ragguard(service, createApp);
    rg.ownsTracing = owns;
    return rg;
  }

  get config(): Config {
    return this.service.cfg;
  }

  /** The adapter a query that names none generates with (RAGGUARD_QUERY_ADAPTER as start-up resolved it), or undefined. */
  get queryAdapter(): string | undefined {
    return this.service.queryAdapter;
  }

  /** Chunks, embeds and stores the documents; durable once it resolves (one snapshot for the batch). */
  ingest(docs: readonly DocumentInput[], signal?: AbortSignal): Promise<IngestResult[]> {
    this.open();
    return this.service.ingest(docs, signal);
  }

  /** Retrieves, reranks and answers, under the admission queue and the memory guard (it may be reshaped, as /query is). */
  async query(o: QueryOptions): Promise<QueryResult> {
    this.open();
    const { cfg } = this.service;
    const q = {
      query: o.query, topK: o.topK ?? cfg.defaultTopK, rerankTopN: o.rerankTopN ?? cfg.defaultRerankTopN,
      maxNewTokens: o.maxNewTokens ?? cfg.defaultMaxNewTokens, temperature: o.temperature ?? 0, seed: o.seed,
      adapter: this.service.queryAdapterFor(o.adapter), sampling: o.sampling, filter: o.filter, ...(o.cacheSalt === undefined ? {} : { cacheSalt: o.cacheSalt }),
    };
    return (await guardedQuery(this.service, this.admission, q, { signal: o.signal })).result;
  }

  /** Generates without retrieval, under the same queue and guard (the prompt is the caller's: never shortened). */
  async generate(o: GenerateOptions): Promise<GenerateResult> {
    this.open();
    const { service } = this;
    const { decoder } = service.models;
    if ((o.prompt === undefined) === (o.messages === undefined)) throw new InvalidRequestError('invalid_body', 'give either prompt or messages');
    const ids = o.messages ? service.chatTemplate.encode(o.messages) : service.chatTemplate.encodeText(o.prompt!);
    const maxNewTokens = o.maxNewTokens ?? service.cfg.defaultMaxNewTokens;
    if (ids.length + maxNewTokens > decoder.shape.maxPositions) {
      throw new TooLargeError('context_too_long', `the prompt's ${ids.length} tokens plus ${maxNewTokens} new tokens exceed the decoder's ${decoder.shape.maxPositions} positions`);
    }
    const { result: g } = await guardedRun(service, this.admission, {
      shape: () => generationShape(ids.length, maxNewTokens),
      floor: { promptTokens: ids.length, message: `a prompt of ${ids.length} tokens with ${maxNewTokens} new tokens can never fit the memory budget` },
      work: async (shape) => {
        const lease = o.adapter === undefined ? undefined : await service.adapters.acquire(o.adapter, o.signal);
        try {
          return await service.engine.generate(ids, {
            ...o.sampling, maxNewTokens: shape?.maxNewTokens ?? maxNewTokens, temperature: o.temperature ?? 0, seed: o.seed, adapter: lease?.adapter,
            ...(o.cacheSalt === undefined ? {} : { cacheSalt: o.cacheSalt }),
          }, { signal: o.signal });
        } finally {
          lease?.release();
        }
      },
    }, { signal: o.signal });
    return { text: g.text, finishReason: g.finishReason, usage: { promptTokens: ids.length, completionTokens: g.ids.length } };
  }

  /**
   * The HTTP API (POST /query, /documents, the OpenAI routes, /healthz, /metrics, /debug/memory) as an
   * express app to mount: `app.use('/rag', ragguard.router())`. Paths inside are the server's own.
   */
  router(opts: RouterOptions = {}): express.Express {
    return this.app(this.service, { logger: opts.logger, lifecycle: opts.lifecycle, admission: this.admission });
  }

  /** Waits for the writes begun so far and the requests in the engine, then stops the service's timers. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    try {
      await this.service.close();
    } finally {
      if (this.ownsTracing) await stopTracing();
    }
  }

  private open(): void {
    if (this.closed) throw new ClosedError('closed', 'this ragguard instance is closed');
  }
}

/** Loads the models and the store (ingesting RAGGUARD_CORPUS_DIR into an empty index) and returns the service. */
export function createRagguard(opts: RagguardOptions = {}, start: StartOptions = {}): Promise<Ragguard> {
  return Ragguard.create(opts, start);
}
