/**
 * Entry point: configuration, then the server (serve.ts): listening at once, ready once the models are
 * loaded, calibrated and the sample corpus is in the index. JSON logs (pino) throughout.
 */
import { ConfigError, loadConfig, type Config } from '../config/config.js';
import { allocatorTuned } from '../runtime/malloc.js';
import { createLogger } from './logging.js';
import { serve } from './serve.js';

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
  const serving = await serve(cfg, { logger: log });
  serving.ready.catch((e: unknown) => {
    log.fatal({ err: e, phase: serving.startup.phase }, `ragguard failed to start: ${e instanceof Error ? e.message : String(e)}`);
    process.exit(1);
  });
  let stopping = false;
  const stop = async (sig: string) => {
    if (stopping) {
      log.warn({ signal: sig, in_flight: serving.lifecycle.inFlight }, `${sig} again: exiting now`);
      process.exit(1);
    }
    stopping = true;
    process.exit(await serving.stop(sig));
  };
  process.on('SIGINT', () => void stop('SIGINT'));
  process.on('SIGTERM', () => void stop('SIGTERM'));
}

main().catch((e: unknown) => {
  createLogger().fatal({ err: e }, `ragguard failed to start: ${e instanceof Error ? e.message : String(e)}`);
  process.exit(1);
});
