/**
 * The server as a library call, `serve()`: a Ragguard (ragguard.ts) whose router answers on a port. Its
 * start and stop: listen at once, then load, profile (or restore the cached calibration), ingest the sample
 * corpus into an empty index, warm up, and become ready (service/startup.ts says why in that order,
 * server/starting.ts what is answered meanwhile); on a signal, drain (server/shutdown.ts). The `ragguard
 * serve` command (cli/serve.ts) is this call and its signals.
 */
import { storeLabel } from '../retrieval/store-label.js';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Config } from '../config/config.js';
import type { Models } from '../service/rag.js';
import { Startup } from '../service/startup.js';
import { createLogger, type Logger } from '../server/logging.js';
import { Lifecycle } from '../server/shutdown.js';
import { AppHandoff, startingApp } from '../server/starting.js';
import { startTracing, stopTracing } from '../runtime/tracing.js';
import { traceRequests } from '../server/request-trace.js';
import { allocatorTuned } from '../runtime/malloc.js';
import { Ragguard, resolveConfig, type RagguardOptions } from './ragguard.js';

/**
 * The service, its app and what they bring (ONNX Runtime, faiss, koffi, the model code): loaded once
 * the port is open. Loading them took 2 s of a loaded 2-core machine, before which no probe was answered.
 */
const serviceModules = () => Promise.all([
  import('../service/bootstrap.js'), import('../server/startup-log.js'), import('../server/warmup.js'),
  import('../guards/budget.js'), import('../runtime/thread-priority.js'),
]);

/** How long the shutdown waits for the last spans to reach the collector. */
const TRACE_FLUSH_MS = 5000;

export interface ServeOptions extends RagguardOptions {
  /** Where the server's lines go (pino, JSON on stdout at RAGGUARD_LOG_LEVEL by default). */
  logger?: Logger;
  /** How the models are loaded (loadModels unless given: a test hands in loaded ones, or holds the phase). */
  loadModels?: (cfg: Config, onLoaded: (done: number, of: number) => void, note: (message: string) => void) => Promise<Models>;
}

export interface Serving {
  server: http.Server;
  /** Where its lines go (ServeOptions.logger's, or its own). */
  logger: Logger;
  port: number;
  startup: Startup;
  /** The instance the server answers with, once ready (warm-up done); rejects when the start failed. */
  ready: Promise<Ragguard>;
  /**
   * Drains and closes (shutdown.ts); resolves with the exit code: 0 when nothing in flight was dropped.
   * Stopped before it is ready: closes the port at once (the start's work in progress is dropped; an
   * ingest under way keeps nothing, being atomic) and resolves 0: the caller exits.
   */
  stop(signal: string): Promise<number>;
  lifecycle: Lifecycle;
}

/**
 * Listens on the configured host and port (HOST, PORT), resolved once listening; the start goes on behind
 * `ready`. Configured as createRagguard is: `env` (RAGGUARD_* settings; process.env only when passed in),
 * then `config`. Rejects with a ConfigError before listening when the configuration is not valid.
 */
export async function serve(opts: ServeOptions = {}): Promise<Serving> {
  const cfg = resolveConfig(opts);
  const log = opts.logger ?? createLogger(cfg.logLevel);
  if (!allocatorTuned()) {
    log.warn('GLIBC_TUNABLES lacks the allocator settings of scripts/tuned.sh (npm start applies them): ' +
      'freed run buffers will stay resident, so resident memory overstates what runs hold');
  }
  if (!cfg.apiKey && !cfg.adminKey && cfg.keys.length === 0 && !['127.0.0.1', 'localhost', '::1'].includes(cfg.host)) {
    log.warn({ host: cfg.host }, 'listening beyond loopback without RAGGUARD_API_KEY: every route is open to whoever reaches the port');
  }
  const startup = new Startup();
  const lifecycle = new Lifecycle();
  const handoff = new AppHandoff(startup, startingApp(cfg, startup, log));
  // OpenTelemetry traces where an endpoint is set (runtime/tracing.ts): the SDK loads only then, and
  // each request gets its root span (request-trace.ts); otherwise the listener is the handoff's own.
  if (await startTracing(cfg)) log.info({ endpoint: cfg.otlpTracesEndpoint, service: cfg.serviceName }, 'OpenTelemetry traces on (OTLP over HTTP)');
  const server = http.createServer(traceRequests(handoff.listener));
  // Idle keep-alive connections outlive the router's own (RAGGUARD_KEEPALIVE_TIMEOUT_MS); the headers'
  // timeout stays above it, as Node asks, so that a connection is never cut while its next request arrives.
  server.keepAliveTimeout = cfg.keepAliveTimeoutMs;
  server.headersTimeout = cfg.keepAliveTimeoutMs + 1000;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(cfg.port, cfg.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  log.info({ host: cfg.host, port, ms: startup.status()?.elapsed_ms },
    `ragguard listening on http://${cfg.host}:${port}: starting (GET /readyz answers 200 once ready)`);

  let rg: Ragguard | undefined;
  const ready = (async () => {
    const [{ loadModels }, { logCapacity, logModels, startProgress }, { warmUp }, { describeKvPool }, { lowerOtherThreads }] =
      await serviceModules();
    const t0 = performance.now();
    log.info({ embedder: cfg.embedderPath, reranker: cfg.rerankerPath, decoder: cfg.decoderPath }, 'loading models');
    // The conversion's and kernels' notes as log lines (JSON, as every other line the server writes).
    const models = await (opts.loadModels ?? loadModels)(cfg, startup.onModelLoaded, (m) => log.info(m));
    logModels(log, cfg, models, performance.now() - t0);
    const progress = startProgress(log);
    let started: Ragguard;
    try {
      started = await Ragguard.create({ config: cfg }, {
        models,
        onPhase: (p, s) => {
          startup.onPhase(p, s);
          progress.onPhase(p, s);
        },
      });
    } finally {
      progress.stop();
    }
    const { service } = started;
    await logCapacity(log, service);
    // After the models are loaded and profiled: their threads exist now (thread-priority.ts says why).
    const lowered = lowerOtherThreads(cfg.workerThreadNice);
    log.info({ nice: cfg.workerThreadNice, ...lowered }, lowered.skipped ?? `${lowered.threads} threads besides the event loop's at nice ${cfg.workerThreadNice}`);
    log.info({ kv_pool_bytes: service.budget.kvPoolBytes }, describeKvPool(service.budget, cfg.maxNumSeqs));
    startup.enter('warming');
    handoff.serve(started.router({ logger: log, lifecycle }));
    rg = started;
    // One query through every request path before the first client (warmup.ts says why).
    if (cfg.warmup) {
      const w = await warmUp(cfg.host, port, cfg.apiKey || cfg.adminKey);
      (w.status === 200 ? log.info.bind(log) : log.warn.bind(log))({ warmup_ms: w.ms, status: w.status, error: w.error }, 'warm-up query');
    }
    startup.finish();
    const counts = await service.store.counts();
    log.info({ host: cfg.host, port, start_ms: Math.round(performance.now() - t0), phases_ms: startup.durations(),
      documents: counts.documents, chunks: counts.chunks, store: storeLabel(cfg.store) },
    `ragguard ready on http://${cfg.host}:${port}`);
    return started;
  })();

  const stop = async (sig: string): Promise<number> => {
    if (!rg) {
      log.info({ signal: sig, phase: startup.phase }, `${sig} while starting (${startup.describe()}): stopping without serving`);
      server.close();
      server.closeAllConnections();
      await flushTraces();
      return 0;
    }
    log.info({ signal: sig, in_flight: lifecycle.inFlight, grace_ms: cfg.shutdownGraceMs },
      `${sig}: draining: no new requests (503 shutting_down, /readyz 503); requests in flight get RAGGUARD_SHUTDOWN_GRACE_MS`);
    const report = await lifecycle.drain(cfg.shutdownGraceMs);
    const code = report.dropped === 0 ? 0 : 3;
    // Ingest is atomic (durable before its reply): one still writing settles here, kept whole or not at all.
    await rg.service.settled();
    const { documents } = await rg.service.store.counts().catch(() => ({ documents: NaN }));
    // The engine idle, the timers and the GPU sampler stopped, the store closed.
    await rg.close().catch(() => undefined);
    log.info({ ms: report.ms, in_flight: report.inFlight, finished: report.finished, dropped: report.dropped, refused: report.refused,
      documents, exit: code },
    `drained in ${report.ms} ms: ${report.finished} of ${report.inFlight} in-flight requests finished, ` +
      `${report.dropped} stopped at the grace deadline (answered 503 shutting_down), ${report.refused} new ones refused; ` +
      `index: ${documents} documents durable; exit ${code}`);
    server.close();
    server.closeAllConnections();
    // The drained requests' spans go out before the exit (the exporter then shuts down).
    await flushTraces();
    return code;
  };
  const flushTraces = () => stopTracing(TRACE_FLUSH_MS).catch((e: unknown) =>
    log.warn({ err: e, endpoint: cfg.otlpTracesEndpoint }, `could not export the last spans: ${e instanceof Error ? e.message : String(e)}`));
  return { server, logger: log, port, startup, ready, stop, lifecycle };
}
