/** Entry point: configuration, models, store (ingesting the sample corpus on first start), HTTP. */
import { ConfigError, loadConfig, type Config } from '../config/config.js';
import { RagService } from '../rag.js';
import { allocatorTuned } from '../runtime/malloc.js';
import { createApp } from './app.js';
import { Lifecycle } from './shutdown.js';

async function main(): Promise<void> {
  let cfg: Config;
  try {
    cfg = loadConfig();
  } catch (e) {
    if (e instanceof ConfigError) {
      console.error(e.message);
      process.exit(2);
    }
    throw e;
  }
  if (!allocatorTuned()) {
    console.warn('GLIBC_TUNABLES lacks the allocator settings of scripts/tuned.sh (npm start applies them): ' +
      'freed run buffers will stay resident, so resident memory overstates what runs hold');
  }
  const t0 = performance.now();
  const service = await RagService.start(cfg);
  const { embedder, reranker, decoder } = service.models;
  console.log(
    `models: embedder ${embedder.provider}, reranker ${reranker.provider}, decoder ${decoder.provider}; ` +
      `index: ${service.store.documentCount} documents, ${service.store.chunkCount} chunks ` +
      `(${Math.round(performance.now() - t0)} ms to start)`,
  );
  const lifecycle = new Lifecycle();
  const server = createApp(service, lifecycle).listen(cfg.port, cfg.host, () => {
    const addr = server.address();
    const port = typeof addr === 'object' && addr ? addr.port : cfg.port;
    console.log(`ragguard listening on http://${cfg.host}:${port}`);
  });
  let stopping = false;
  const stop = async (sig: string) => {
    if (stopping) {
      console.log(`${sig} again: exiting now, ${lifecycle.inFlight} requests still in flight`);
      process.exit(1);
    }
    stopping = true;
    console.log(`${sig}: draining: no new requests (503 shutting_down, /readyz 503); ${lifecycle.inFlight} in flight get ` +
      `${cfg.shutdownGraceMs} ms (RAGGUARD_SHUTDOWN_GRACE_MS)`);
    const report = await lifecycle.drain(cfg.shutdownGraceMs);
    const code = report.dropped === 0 ? 0 : 3;
    // Ingest is atomic (durable before its reply): one still writing settles here, kept whole or not at all.
    await service.settled();
    console.log(`drained in ${report.ms} ms: ${report.finished} of ${report.inFlight} in-flight requests finished, ` +
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
  console.error('ragguard failed to start:', e instanceof Error ? e.message : e);
  process.exit(1);
});
