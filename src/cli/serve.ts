/**
 * `ragguard serve` and `npm start`: the library's serve() (library/serve.ts) configured by the process's
 * environment, stopped by its signals: SIGTERM or SIGINT drains (a second one exits at once), and the
 * process exits with the drain's code. A configuration that is not valid exits 2 before the port opens.
 */
import { ConfigError, createLogger, serve, type Serving } from '../index.js';

async function main(): Promise<void> {
  let serving: Serving;
  try {
    serving = await serve({ env: process.env });
  } catch (e) {
    if (e instanceof ConfigError) {
      createLogger().fatal({ problems: e.problems }, e.message);
      process.exit(2);
    }
    throw e;
  }
  const log = serving.logger;
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
