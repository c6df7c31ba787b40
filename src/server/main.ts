/** Entry point: configuration, models, store (ingesting the sample corpus on first start), HTTP. JSON logs (pino) throughout. */
import { ConfigError, loadConfig, type Config } from '../config/config.js';
import { loadModels, RagService } from '../rag.js';
import { allocatorTuned } from '../runtime/malloc.js';
import { createApp } from './app.js';
import { createLogger } from './logging.js';
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
  const server = createApp(service, { logger: log }).listen(cfg.port, cfg.host, () => {
    const addr = server.address();
    const port = typeof addr === 'object' && addr ? addr.port : cfg.port;
    log.info({ host: cfg.host, port, start_ms: Math.round(performance.now() - t0), documents: service.store.documentCount, chunks: service.store.chunkCount },
      `ragguard listening on http://${cfg.host}:${port}`);
  });
  const stop = (sig: string) => {
    log.info({ signal: sig }, 'closing');
    server.close(() => process.exit(0));
    setTimeout(() => process.exit(0), 5000).unref();
  };
  process.on('SIGINT', () => stop('SIGINT'));
  process.on('SIGTERM', () => stop('SIGTERM'));
}

main().catch((e: unknown) => {
  createLogger().fatal({ err: e }, `ragguard failed to start: ${e instanceof Error ? e.message : String(e)}`);
  process.exit(1);
});
