/**
 * What the server logs as it starts: the models and where they run, then progress through the
 * profile run and the first ingest, then the capacity summary as vLLM logs it (the budget and its
 * split, the KV blocks, and how many sequences fit at the prompt limit).
 */
import type { StoreCounts } from '../retrieval/retrieval-store.js';
import type { Config } from '../config/config.js';
import { decoderRuntime, type Models, type RagService, type StartPhase } from '../service/rag.js';
import type { Logger } from './logging.js';

const MiB = (b: number) => Math.round((b / 2 ** 20) * 10) / 10;

export function logModels(log: Logger, cfg: Config, models: Models, ms: number): void {
  const { embedder, reranker, decoder, loads } = models;
  log.info({
    ms: Math.round(ms),
    models: {
      embedder: { path: cfg.embedderPath, provider: embedder.provider, bytes: loads.embedder.bytes },
      reranker: { path: cfg.rerankerPath, provider: reranker.provider, bytes: loads.reranker.bytes },
      decoder: { path: cfg.decoderPath, provider: decoder.provider, bytes: loads.decoder.bytes, ...decoderRuntime(decoder) },
    },
  }, `models loaded: embedder on ${embedder.provider}, reranker on ${reranker.provider}, decoder on ${decoder.provider}`);
}

/** The capacity figures: budget split, KV blocks, sequences that fit. */
export function capacity(service: RagService, counts: StoreCounts) {
  const { cfg, engine, budget } = service;
  const pool = engine.pool;
  const maxPositions = service.models.decoder.shape.maxPositions;
  const promptLimit = Math.min(cfg.promptBudgetTokens, maxPositions);
  const fullLimit = Math.min(cfg.promptBudgetTokens + cfg.maxNewTokensLimit, maxPositions);
  const blocksFor = (tokens: number) => Math.ceil(tokens / pool.blockSize);
  return {
    budget_bytes: budget.budgetBytes,
    budget_source: budget.source,
    weights_bytes: service.weightBytes,
    adapter_slot_bytes: service.adapterSlotBytes,
    index_bytes: service.store.indexBytes,
    kv_pool_bytes: pool.bytes,
    workspace_bytes: service.workspaceBytes,
    kv_blocks: pool.numBlocks,
    block_size: pool.blockSize,
    kv_bytes_per_token: pool.bytesPerSlot,
    kv_tokens: pool.numBlocks * pool.blockSize,
    prompt_limit_tokens: promptLimit,
    // vLLM's "maximum concurrency for N tokens per request": whole blocks per sequence, as they are taken.
    seqs_at_prompt_limit: Math.floor(pool.numBlocks / blocksFor(promptLimit)),
    seqs_at_prompt_and_new_tokens_limit: Math.floor(pool.numBlocks / blocksFor(fullLimit)),
    prompt_and_new_tokens_limit: fullLimit,
    max_num_seqs: cfg.maxNumSeqs,
    guards: cfg.guards,
    documents: counts.documents,
    chunks: counts.chunks,
  };
}

export async function logCapacity(log: Logger, service: RagService): Promise<void> {
  const c = capacity(service, await service.store.counts());
  log.info({ capacity: c },
    `memory budget ${MiB(c.budget_bytes)} MiB (${c.budget_source}): weights ${MiB(c.weights_bytes)} MiB, adapter slots ${MiB(c.adapter_slot_bytes)} MiB, ` +
    `index ${MiB(c.index_bytes)} MiB, KV pool ${MiB(c.kv_pool_bytes)} MiB, workspace ${MiB(c.workspace_bytes)} MiB`);
  log.info({ kv_blocks: c.kv_blocks, block_size: c.block_size, kv_tokens: c.kv_tokens },
    `# KV blocks: ${c.kv_blocks} of ${c.block_size} tokens (${c.kv_tokens} tokens, ${c.kv_bytes_per_token} bytes per token)`);
  log.info({ seqs: c.seqs_at_prompt_limit, tokens: c.prompt_limit_tokens },
    `maximum concurrency for ${c.prompt_limit_tokens} tokens per request (the prompt limit): ${c.seqs_at_prompt_limit} sequences ` +
    `(${c.seqs_at_prompt_and_new_tokens_limit} at ${c.prompt_and_new_tokens_limit} tokens with the largest max_new_tokens; max_num_seqs ${c.max_num_seqs})`);
  log.info({ query_adapter: service.queryAdapter ?? null }, service.queryAdapterNote);
}

/**
 * Follows RagService.start's phases: says when the profile run starts and ends (and, every `everyMs`,
 * that it is still going), and how far the first ingest has got (every `everyMs`, from the store's
 * document count). Returns the listener and a stop.
 */
export function startProgress(log: Logger, everyMs = 2000): { onPhase: (p: StartPhase, s: RagService) => void; stop: () => void } {
  let timer: NodeJS.Timeout | undefined;
  let phaseStart = performance.now();
  let current: StartPhase['phase'] | undefined;
  const end = (service: RagService) => {
    if (timer) clearInterval(timer);
    timer = undefined;
    const ms = Math.round(performance.now() - phaseStart);
    if (current === 'profile') logCalibration(log, service, ms);
    if (current === 'ingest') {
      void service.store.counts().then(({ documents, chunks }) => log.info({ ms, documents, chunks }, `ingest done in ${ms} ms`));
    }
  };
  return {
    onPhase: (p, service) => {
      end(service);
      current = p.phase;
      phaseStart = performance.now();
      if (p.phase === 'profile') {
        log.info(service.cfg.calibrationCache
          ? 'calibrating the memory model: the cached calibration if nothing it depends on changed, else the profile run (each model at the largest allowed shapes)'
          : 'profile run: measuring each model at the largest allowed shapes to calibrate the memory model');
        timer = setInterval(() => {
          const { done, of } = service.profileProgress ?? { done: 0, of: 0 };
          log.info({ elapsed_ms: Math.round(performance.now() - phaseStart), done, of }, `profile run: still measuring (${done} of ${of} runs)`);
        }, everyMs);
        timer.unref();
      }
      if (p.phase === 'ingest') {
        log.info({ documents: p.documents }, `ingesting ${p.documents} documents from RAGGUARD_CORPUS_DIR`);
        // The batch becomes visible only once its snapshot is durable (atomic ingest): progress counts the
        // documents chunked and embedded so far.
        timer = setInterval(() => {
          const done = service.ingestProgress?.done ?? 0;
          log.info({ done, of: p.documents }, `ingesting: ${done} of ${p.documents} documents embedded`);
        }, everyMs);
        timer.unref();
      }
    },
    stop: () => {
      if (timer) clearInterval(timer);
    },
  };
}

/** How the memory model was calibrated: restored from the cache, measured (stored, and why the cache did not serve), or analytic. */
function logCalibration(log: Logger, service: RagService, ms: number): void {
  const p = service.profile;
  if (p.source !== 'profile') {
    log.info({ ms, calibration: p.source, reason: p.reason }, `profile run done in ${ms} ms (analytic: ${p.reason})`);
    return;
  }
  const c = p.cache;
  const fields = { ms, calibration: p.source, runs: p.points.length, headroom: p.headroom, ...(c ? { cache: c } : {}) };
  if (c?.restored) {
    log.info(fields, `calibration restored from ${c.file} (measured ${c.written_at}) in ${ms} ms: nothing it depends on changed`);
    return;
  }
  if (c?.damaged) log.warn({ file: c.file, why: c.why }, `ignored a damaged calibration cache: ${c.why}`);
  if (c?.write_error) log.warn({ file: c.file, error: c.write_error }, `could not store the calibration in ${c.file}: ${c.write_error} (the next start profiles again)`);
  log.info(fields, `profile run done in ${ms} ms (${p.source}${c ? `; ${c.why}${c.write_error ? '' : `; stored in ${c.file}`}` : ''})`);
}
