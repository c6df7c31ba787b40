/** Entry point: configuration, models, store (ingesting the sample corpus on first start), HTTP. */
import { ConfigError, loadConfig, type Config } from '../config/config.js';
import { describeKvPool } from '../guards/budget.js';
import { RagService } from '../rag.js';
import { allocatorTuned } from '../runtime/malloc.js';
import { createApp } from './app.js';

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
  console.log(describeKvPool(service.budget, cfg.maxNumSeqs));
  const server = createApp(service).listen(cfg.port, cfg.host, () => {
    const addr = server.address();
    const port = typeof addr === 'object' && addr ? addr.port : cfg.port;
    console.log(`ragguard listening on http://${cfg.host}:${port}`);
  });
  const stop = (sig: string) => {
    console.log(`${sig}: closing`);
    server.close(() => process.exit(0));
    setTimeout(() => process.exit(0), 5000).unref();
  };
  process.on('SIGINT', () => stop('SIGINT'));
  process.on('SIGTERM', () => stop('SIGTERM'));
}

main().catch((e: unknown) => {
  console.error('ragguard failed to start:', e instanceof Error ? e.message : e);
  process.exit(1);
});
