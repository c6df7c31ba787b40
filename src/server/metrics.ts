/**
 * GET /metrics: Prometheus text from prom-client.
 *
 * The engine's metrics carry vLLM's names (v1) after the prefix `ragguard:` instead of `vllm:`, with
 * vLLM's `model_name` label and histogram buckets, so that a vLLM dashboard works here by changing the
 * prefix. Times are the engine's, as in vLLM: from the moment the prompt reaches the engine (after
 * retrieval and reranking) to its first token (TTFT), between tokens (ITL) and to its end (e2e). What a
 * client sees end to end, retrieval included, is `ragguard:http_request_duration_seconds`.
 *
 * The guard's own metrics follow: admissions by decision, reshapes by field, the bytes it predicts and
 * reserves, the budget and its split, what is measured (ONNX Runtime's accounted host bytes, resident
 * memory, NVML's GPU memory) and the start-up profile's predicted against measured bytes per run.
 */
import path from 'node:path';
import type { NextFunction, Request, Response } from 'express';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { Sequence } from '../generate/sequence.js';
import type { Admission } from '../guards/admission.js';
import type { RagService } from '../service/rag.js';
import { countingAllocator } from '../backends/ort/ort-allocator.js';
import { mallocStats } from '../runtime/malloc.js';
import type { TenantKey } from '../config/keys-file.js';
import type { LimitEvents } from './limit-store.js';
import { scopedMetrics, visibleKeyNames } from './tenant-views.js';
import { tenantOf } from './tenant.js';

export const PREFIX = 'ragguard:';

// vLLM's buckets (vllm/v1/metrics/loggers.py), so that quantiles read the same.
const TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560];
const ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80];
const E2E_BUCKETS = [0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680];
const BYTES_BUCKETS = [1, 4, 16, 64, 256, 1024].flatMap((m) => [m * 2 ** 20, m * 2 ** 21]);

export class ServerMetrics {
  readonly registry = new Registry();
  private readonly lastToken = new WeakMap<Sequence, number>();
  /** The admission queues of the apps over this service (one per app). */
  private readonly queues = new Set<Admission>();
  private readonly ttft: Histogram;
  private readonly itl: Histogram;
  private readonly tpot: Histogram;
  private readonly e2e: Histogram;
  private readonly promptTokens: Counter;
  private readonly prefixQueries: Counter;
  private readonly prefixHits: Counter;
  private readonly generationTokens: Counter;
  private readonly success: Counter<'finished_reason'>;
  private readonly failed: Counter;
  private readonly admissions: Counter<'decision'>;
  private readonly reshapes: Counter<'field'>;
  private readonly predicted: Histogram;
  private readonly httpRequests: Counter<'method' | 'route' | 'status'>;
  private readonly rerankPairs: Counter<'route'>;
  private readonly httpDuration: Histogram<'method' | 'route'>;
  private readonly keyRequests: Counter<'key'>;
  private readonly keyTokens: Counter<'key'>;
  private readonly keyLimited: Counter<'key' | 'code'>;

  constructor(service: RagService) {
    const r = this.registry;
    const name = (n: string) => `${PREFIX}${n}`;
    r.setDefaultLabels({ model_name: path.basename(service.cfg.decoderPath) });
    collectDefaultMetrics({ register: r });
    const { engine, blocks, guard, budget } = service;

    // --- vLLM's engine metrics ---
    new Gauge({ name: name('num_requests_running'), help: 'Number of requests in model execution batches.', registers: [r],
      collect() { this.set(engine.scheduler.running.length); } });
    new Gauge({ name: name('num_requests_waiting'), help: 'Number of requests waiting to be processed.', registers: [r],
      collect() { this.set(engine.scheduler.waiting.length); } });
    new Gauge({ name: name('kv_cache_usage_perc'), help: 'KV-cache usage. 1 means 100 percent usage.', registers: [r],
      collect() { const s = blocks.stats(); this.set(s.totalBlocks > 0 ? s.usedBlocks / s.totalBlocks : 0); } });
    new Counter({ name: name('num_preemptions_total'), help: 'Cumulative number of preemptions from the engine.', registers: [r],
      collect() { this.reset(); this.inc(engine.stats.preemptions); } });
    this.promptTokens = new Counter({ name: name('prompt_tokens_total'), help: 'Number of prefill tokens processed.', registers: [r] });
    // vLLM v1's prefix-cache counters (tokens): the hit rate is hits / queries over a window.
    this.prefixQueries = new Counter({ name: name('prefix_cache_queries'), help: 'Prompt tokens looked up in the prefix cache.', registers: [r] });
    this.prefixHits = new Counter({ name: name('prefix_cache_hits'), help: 'Prompt tokens found in the prefix cache (their KV blocks reused, not computed).', registers: [r] });
    this.generationTokens = new Counter({ name: name('generation_tokens_total'), help: 'Number of generation tokens processed.', registers: [r] });
    this.success = new Counter({ name: name('request_success_total'), help: 'Count of successfully processed requests.', labelNames: ['finished_reason'], registers: [r] });
    this.ttft = new Histogram({ name: name('time_to_first_token_seconds'), help: 'Histogram of time to first token in seconds.', buckets: TTFT_BUCKETS, registers: [r] });
    this.itl = new Histogram({ name: name('inter_token_latency_seconds'), help: 'Histogram of inter-token latency in seconds.', buckets: ITL_BUCKETS, registers: [r] });
    // vLLM's earlier name for the same intervals, which older dashboards still chart.
    this.tpot = new Histogram({ name: name('time_per_output_token_seconds'), help: 'Histogram of time per output token in seconds (the inter-token latency under its earlier vLLM name).', buckets: ITL_BUCKETS, registers: [r] });
    this.e2e = new Histogram({ name: name('e2e_request_latency_seconds'), help: 'Histogram of e2e request latency in seconds.', buckets: E2E_BUCKETS, registers: [r] });
    this.failed = new Counter({ name: name('request_failed_total'), help: 'Requests whose generation failed in the engine.', registers: [r] });

    // --- the guard's own ---
    this.admissions = new Counter({ name: name('guard_admissions_total'), help: 'Guard decisions by decision (admit, queue, reject).', labelNames: ['decision'], registers: [r] });
    this.reshapes = new Counter({ name: name('guard_reshapes_total'), help: 'Reshaped dimensions of admitted requests, by field.', labelNames: ['field'], registers: [r] });
    this.predicted = new Histogram({ name: name('guard_predicted_bytes'), help: 'Predicted peak bytes (workspace + KV) of each decided request.', buckets: BYTES_BUCKETS, registers: [r] });
    new Gauge({ name: name('guard_reserved_bytes'), help: 'Workspace bytes reserved by running requests now (their predictions with headroom).', registers: [r],
      collect() { this.set(guard.reserved); } });
    new Gauge({ name: name('guard_requests_waiting_for_memory'), help: 'Requests waiting for a workspace reservation.', registers: [r],
      collect() { this.set(guard.waiting); } });
    new Gauge({ name: name('memory_budget_bytes'), help: 'The memory budget (RAGGUARD_MEMORY_BUDGET).', registers: [r],
      collect() { this.set(budget.budgetBytes); } });
    new Gauge({ name: name('memory_component_bytes'), help: 'The budget by component.', labelNames: ['component'], registers: [r],
      collect() {
        this.reset();
        const { loads } = service;
        this.labels('weights_embedder').set(loads.embedder.bytes);
        this.labels('weights_reranker').set(loads.reranker.bytes);
        this.labels('weights_decoder').set(loads.decoder.bytes);
        this.labels('kv_pool').set(engine.pool.bytes);
        this.labels('adapter_slots').set(service.adapterSlotBytes);
        this.labels('faiss_index').set(service.store.indexBytes);
        this.labels('allocator_warm').set(service.allocatorWarmBytes);
        this.labels('workspace').set(service.workspaceBytes);
      } });
    new Gauge({ name: name('kv_cache_blocks'), help: 'KV blocks by state (total, free, cached, used).', labelNames: ['state'], registers: [r],
      collect() {
        const s = blocks.stats();
        this.labels('total').set(s.totalBlocks);
        this.labels('free').set(s.freeBlocks);
        this.labels('cached').set(s.cachedBlocks);
        this.labels('used').set(s.usedBlocks);
      } });
    new Gauge({ name: name('onnxruntime_host_bytes'), help: "ONNX Runtime's host bytes as the counting allocator accounts them: live, peak, warm (freed, kept resident for reuse), and the live bytes in malloc's blocks (live_in_malloc: inside native_memory_bytes{kind=malloc_in_use} too; the rest lie in the allocator's reserved regions); absent where it is not installed.", labelNames: ['kind'], registers: [r],
      collect() {
        this.reset();
        const c = countingAllocator();
        if (!c) return;
        this.labels('live').set(c.live());
        this.labels('peak').set(c.peak());
        this.labels('warm').set(c.warm());
        this.labels('live_in_malloc').set(c.heapLive());
      } });
    new Gauge({ name: name('gpu_memory_bytes'), help: 'GPU memory as NVML reads it, per GPU (absent without a GPU).', labelNames: ['gpu', 'kind'], registers: [r],
      collect() {
        this.reset();
        const g = service.gpu.latest();
        if (g.source !== 'nvml') return;
        for (const x of g.gpus) {
          this.labels(String(x.index), 'total').set(x.totalBytes);
          this.labels(String(x.index), 'used').set(x.usedBytes);
        }
      } });
    // The start-up profile: per measured run, what the calibrated model predicts against what was measured.
    new Gauge({ name: name('profile_run_bytes'), help: 'Start-up profile runs: calibrated prediction against measured peak bytes, per stage and shape.', labelNames: ['stage', 'shape', 'kind'], registers: [r],
      collect() {
        this.reset();
        const p = service.profile;
        if (p.source !== 'profile') return;
        const fits = guard.model.calibration;
        for (const pt of p.points) {
          const f = fits[pt.stage];
          const shape = pt.shape.join('x');
          this.labels(pt.stage, shape, 'measured').set(pt.measured_bytes);
          this.labels(pt.stage, shape, 'predicted').set(f.scale * pt.analytic_bytes + f.offsetBytes);
        }
      } });

    // The leak checks' verdicts, for an alert rule: the slow one (a trend over time) and the per-window one.
    new Gauge({ name: name('memory_leak_suspected'), help: 'Leak checks: 1 where memory keeps growing beyond the stored documents\' predicted bytes (check=trend: a slope over RAGGUARD_LEAK_HORIZON_MS; check=window: growth across the last RAGGUARD_LEAK_WINDOW requests).', labelNames: ['check'], registers: [r],
      collect() {
        this.labels('trend').set(service.trend.report().flagged ? 1 : 0);
        this.labels('window').set(service.growth.report().flagged ? 1 : 0);
      } });
    new Gauge({ name: name('memory_growth_bytes_per_minute'), help: 'The slow-leak check\'s slopes: resident memory less expected growth (rss_adjusted), as it is (rss), the expected growth (expected) and V8 heap plus external (heap).', labelNames: ['kind'], registers: [r],
      collect() {
        const t = service.trend.report();
        this.labels('rss_adjusted').set(t.rss_slope_bytes_per_min);
        this.labels('rss').set(t.rss_raw_slope_bytes_per_min);
        this.labels('expected').set(t.expected_slope_bytes_per_min);
        this.labels('heap').set(t.heap_slope_bytes_per_min);
      } });
    new Gauge({ name: name('native_memory_bytes'), help: 'Native memory by holder: glibc malloc in use and free (mallinfo2), the store\'s predicted bytes.', labelNames: ['kind'], registers: [r],
      collect() {
        this.reset();
        const m = mallocStats();
        if (m) {
          this.labels('malloc_in_use').set(m.inUseBytes);
          this.labels('malloc_free').set(m.freeBytes);
        }
        this.labels('store_predicted').set(service.storeResidentBytes());
      } });
    new Gauge({ name: name('malloc_arenas'), help: 'glibc malloc arenas (one per contending thread up to arena_max; scripts/tuned.sh sets 1).', registers: [r],
      collect() {
        const m = mallocStats();
        if (m) this.set(m.arenas);
      } });

    const queues = this.queues;
    new Gauge({ name: name('admission_queue_requests'), help: 'Queries holding an admission slot (running) or waiting for one, before the guard and the engine.', labelNames: ['state'], registers: [r],
      collect() {
        let running = 0, waiting = 0;
        for (const q of queues) {
          running += q.running;
          waiting += q.waiting;
        }
        this.labels('running').set(running);
        this.labels('waiting').set(waiting);
      } });
    this.httpRequests = new Counter({ name: name('http_requests_total'), help: 'HTTP requests by method, route and status.', labelNames: ['method', 'route', 'status'], registers: [r] });
    this.httpDuration = new Histogram({ name: name('http_request_duration_seconds'), help: 'HTTP request latency as the client sees it (retrieval included).', labelNames: ['method', 'route'], buckets: E2E_BUCKETS, registers: [r] });

    // Per API key, by the key's name (RAGGUARD_KEYS_FILE; 'api', 'admin' for the single keys, 'open' without keys): never the key itself.
    this.keyRequests = new Counter({ name: name('key_requests_total'), help: 'Requests let in past authentication and the rate limit, by API key name.', labelNames: ['key'], registers: [r] });
    this.keyTokens = new Counter({ name: name('key_tokens_total'), help: 'Tokens charged (a generation\'s prompt plus generated; the input of embeddings, rerank and score), by API key name.', labelNames: ['key'], registers: [r] });
    this.keyLimited = new Counter({ name: name('key_limited_total'), help: 'Requests refused 429 by a per-key limit, by API key name and code (rate_limited, token_limit).', labelNames: ['key', 'code'], registers: [r] });

    this.rerankPairs = new Counter({ name: name('rerank_pairs_total'), help: 'Pairs scored by the reranker for /v1/rerank and /v1/score (rerank-routes.ts).', labelNames: ['route'], registers: [r] });

    engine.observer = {
      token: (seq, now) => {
        const last = this.lastToken.get(seq);
        if (last === undefined) this.ttft.observe((now - seq.arrival) / 1000);
        else {
          this.itl.observe((now - last) / 1000);
          this.tpot.observe((now - last) / 1000);
        }
        this.lastToken.set(seq, now);
      },
      finished: (seq, now, failed) => {
        this.lastToken.delete(seq);
        this.onSequenceEnded?.(seq, failed);
        this.promptTokens.inc(seq.promptIds.length);
        this.prefixQueries.inc(seq.promptIds.length);
        this.prefixHits.inc(seq.cachedPrefix ?? 0);
        this.generationTokens.inc(seq.outputIds.length);
        if (failed) {
          this.failed.inc();
          return;
        }
        this.success.labels(seq.finishReason ?? 'length').inc();
        this.e2e.observe((now - seq.arrival) / 1000);
      },
    };
    guard.onDecision = (d) => {
      this.admissions.labels(d.action).inc();
      this.predicted.observe(d.prediction.workspaceBytes + d.prediction.kvBytes);
      if (d.action !== 'reject') for (const s of d.reshaped) this.reshapes.labels(s.field).inc();
    };
  }

  /** Told of every sequence leaving the engine (rate-limits.ts charges the unfinished ones to their key). */
  onSequenceEnded: ((seq: Sequence, failed: boolean) => void) | undefined;

  /** Counts an app's admission queue in `admission_queue_requests`. */
  addQueue(admission: Admission): void {
    this.queues.add(admission);
  }

  /** The per-key limits' events, counted by key name (rate-limits.ts). */
  readonly keyEvents: LimitEvents = {
    request: (key) => this.keyRequests.labels(key).inc(),
    tokens: (key, n) => this.keyTokens.labels(key).inc(n),
    limited: (key, code) => this.keyLimited.labels(key, code).inc(),
  };

  /** Counts pairs the reranker scored for a route. */
  reranked(route: '/v1/rerank' | '/v1/score', pairs: number): void {
    this.rerankPairs.labels(route).inc(pairs);
  }

  /** Counts a finished HTTP request (called by the request logger). */
  httpRequest(method: string, route: string, status: number, seconds: number): void {
    this.httpRequests.labels(method, route, String(status)).inc();
    this.httpDuration.labels(method, route).observe(seconds);
  }
}

const perService = new WeakMap<RagService, ServerMetrics>();

/** One set of metrics per service: every app over it counts into the same registry. */
export function metricsFor(service: RagService): ServerMetrics {
  let m = perService.get(service);
  if (!m) perService.set(service, (m = new ServerMetrics(service)));
  return m;
}

/**
 * GET /metrics (an admin route: auth.ts). An admin key scoped to collections reads the per-key series of
 * its own keys only (tenant-views.ts); `keys`: the keys file's keys as they are now (reloads included).
 */
export function metricsHandler(metrics: ServerMetrics, keys: () => readonly TenantKey[] = () => []) {
  return async (_req: Request, res: Response, next: NextFunction): Promise<void> => {
    try {
      const text = scopedMetrics(await metrics.registry.metrics(), visibleKeyNames(tenantOf(res), keys()));
      res.type(metrics.registry.contentType).send(text);
    } catch (e) {
      next(e);
    }
  };
}
