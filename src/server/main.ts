/** Entry point: configuration, models, store (ingesting the sample corpus on first start), HTTP. JSON logs (pino) throughout. */
import { ConfigError, loadConfig, type Config } from '../config/config.js';
import { describeKvPool } from '../guards/budget.js';
import { loadModels, RagService } from '../service/rag.js';
import { allocatorTuned } from '../runtime/malloc.js';
import { lowerOtherThreads } from '../runtime/thread-priority.js';
import { createApp } from './app.js';
import { createLogger } from './logging.js';
import { Lifecycle } from './shutdown.js';
import { warmUp } from './warmup.js';
import { logCapacity, logModels, startProgress } from './startup-log.js';

async function main(): Promise<void> {
  let cfg: Config;
  try {
    cfg = loadConfig();
  } catch (e) {
    if (e instanceof ConfigError) {
      createLogger().fatal({ problems: e.problems }, e.message);
      process.exit(2);
    }
    throw e;
  }
  const log = createLogger(cfg.logLevel);
  if (!allocatorTuned()) {
    log.warn('GLIBC_TUNABLES lacks the allocator settings of scripts/tuned.sh (npm start applies them): ' +
      'freed run buffers will stay resident, so resident memory overstates what runs hold');
  }
  if (!cfg.apiKey && !['127.0.0.1', 'localhost', '::1'].includes(cfg.host)) {
    log.warn({ host: cfg.host }, 'listening beyond loopback without RAGGUARD_API_KEY: every route is open to whoever reaches the port');
  }
  const t0 = performance.now();
  log.info({ embedder: cfg.embedderPath, reranker: cfg.rerankerPath, decoder: cfg.decoderPath }, 'loading models');
  const models = await loadModels(cfg);
  logModels(log, cfg, models, performance.now() - t0);
  const progress = startProgress(log);
  let service: RagService;
  try {
    service = await RagService.start(cfg, models, progress.onPhase);
  } finally {
    progress.stop();
  }
  logCapacity(log, service);
  // After the models are loaded and profiled: their threads exist now (thread-priority.ts says why).
  const lowered = lowerOtherThreads(cfg.workerThreadNice);
  log.info({ nice: cfg.workerThreadNice, ...lowered }, lowered.skipped ?? `${lowered.threads} threads besides the event loop's at nice ${cfg.workerThreadNice}`);
  log.info({ kv_pool_bytes: service.budget.kvPoolBytes }, describeKvPool(service.budget, cfg.maxNumSeqs));
  const lifecycle = new Lifecycle();
  const server = createApp(service, { logger: log, lifecycle }).listen(cfg.port, cfg.host, () => {
    const addr = server.address();
    const port = typeof addr === 'object' && addr ? addr.port : cfg.port;
    // One query through every request path before the first client (warmup.ts says why).
    void (cfg.warmup ? warmUp(cfg.host, port, cfg.apiKey) : Promise.resolve(undefined)).then((w) => {
      if (w) (w.status === 200 ? log.info.bind(log) : log.warn.bind(log))({ warmup_ms: w.ms, status: w.status, error: w.error }, 'warm-up query');
      log.info({ host: cfg.host, port, start_ms: Math.round(performance.now() - t0), documents: service.store.documentCount, chunks: service.store.chunkCount },
        `ragguard listening on http://${cfg.host}:${port}`);
    });
  });
  let stopping = false;
  const stop = async (sig: string) => {
    if (stopping) {
      log.warn({ signal: sig, in_flight: lifecycle.inFlight }, `${sig} again: exiting now`);
      process.exit(1);
    }
    stopping = true;
    log.info({ signal: sig, in_flight: lifecycle.inFlight, grace_ms: cfg.shutdownGraceMs },
      `${sig}: draining: no new requests (503 shutting_down, /readyz 503); requests in flight get RAGGUARD_SHUTDOWN_GRACE_MS`);
    const report = await lifecycle.drain(cfg.shutdownGraceMs);
    const code = report.dropped === 0 ? 0 : 3;
    // Ingest is atomic (durable before its reply): one still writing settles here, kept whole or not at all.
    await service.settled();
    log.info({ ms: report.ms, in_flight: report.inFlight, finished: report.finished, dropped: report.dropped, refused: report.refused,
      documents: service.store.documentCount, exit: code },
    `drained in ${report.ms} ms: ${report.finished} of ${report.inFlight} in-flight requests finished, ` +
      `${report.dropped} stopped at the grace deadline (answered 503 shutting_down), ${report.refused} new ones refused; ` +
      `index: ${service.store.documentCount} documents durable; exit ${code}`);
    server.close();
    server.closeAllConnections();
    service.gpu.stop();
    process.exit(code);
  };
  process.on('SIGINT', () => void stop('SIGINT'));
  process.on('SIGTERM', () => void stop('SIGTERM'));
}

main().catch((e: unknown) => {
  createLogger().fatal({ err: e }, `ragguard failed to start: ${e instanceof Error ? e.message : String(e)}`);
  process.exit(1);
});
