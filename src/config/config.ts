/**
 * All configuration, read once from the environment and validated.
 *
 * Every variable is listed in VARIABLES with its default and meaning; the README's table is generated
 * from the same list (`npm run config:doc`). An invalid value stops start-up with a message naming
 * the variable, never a silent fallback.
 */
import { createHash } from 'node:crypto';
import type { Config } from './settings.js';
import type { Variable } from './variables/parse.js';
import { MEMORY_VARIABLES } from './variables/memory.js';
import { MODEL_VARIABLES } from './variables/models.js';
import { QUERY_VARIABLES } from './variables/query.js';
import { LISTEN_VARIABLES, SERVER_VARIABLES } from './variables/server.js';
import { STORE_VARIABLES } from './variables/store.js';
import { TELEMETRY_VARIABLES } from './variables/telemetry.js';

export { RESHAPE_STEPS, type Config, type ExecutionProvider, type ModelRole, type ReshapeStep, type RetrievalMode, type WebGpuBufferCache } from './settings.js';

class ConfigError extends Error {
  constructor(readonly problems: string[]) {
    super(`invalid configuration:\n  ${problems.join('\n  ')}`);
    this.name = 'ConfigError';
  }
}
export { ConfigError };

/** Every variable, by area (variables/*.ts), in the README's order. */
export const VARIABLES: readonly Variable[] = [
  ...LISTEN_VARIABLES, ...MODEL_VARIABLES, ...STORE_VARIABLES, ...QUERY_VARIABLES, ...MEMORY_VARIABLES, ...SERVER_VARIABLES, ...TELEMETRY_VARIABLES,
];

/** Reads and validates the configuration; throws ConfigError naming every bad variable. */
export function loadConfig(env: Readonly<Record<string, string | undefined>> = process.env): Config {
  const cfg: Partial<Config> = {};
  const problems: string[] = [];
  for (const v of VARIABLES) {
    const raw = env[v.name] ?? v.default;
    try {
      v.apply(cfg, raw);
    } catch (e) {
      problems.push(`${v.name}: ${(e as Error).message}`);
    }
  }
  const c = cfg as Config;
  if (problems.length === 0) {
    const own: Partial<Config['providers']> = c.providers ?? {};
    // cuda names the decoder's native backend; the encoders stay on ONNX Runtime, whose CUDA provider
    // is rarely installed: they take the first of its providers that loads (the start-up log says which).
    const encoders = c.executionProvider === 'cuda' ? 'auto' : c.executionProvider;
    c.providers = { embedder: own.embedder ?? encoders, reranker: own.reranker ?? encoders, decoder: own.decoder ?? c.executionProvider };
    if (c.chunkOverlapTokens >= c.chunkTokens) problems.push('RAGGUARD_CHUNK_OVERLAP: must be smaller than RAGGUARD_CHUNK_TOKENS');
    if (c.retrieval === 'hybrid' && c.rrfDenseWeight + c.rrfLexicalWeight === 0) problems.push('RAGGUARD_RRF_DENSE_WEIGHT, RAGGUARD_RRF_LEXICAL_WEIGHT: not both 0');
    if (c.defaultTopK > c.maxTopK) problems.push('RAGGUARD_TOP_K: must not exceed RAGGUARD_MAX_TOP_K');
    if (c.pgHnswEfConstruction < 2 * c.pgHnswM) problems.push('RAGGUARD_PG_HNSW_EF_CONSTRUCTION: must be at least 2 x RAGGUARD_PG_HNSW_M (pgvector refuses less)');
    if (c.leakMinSpanMs > c.leakHorizonMs) problems.push('RAGGUARD_LEAK_MIN_SPAN_MS: must not exceed RAGGUARD_LEAK_HORIZON_MS');
    if (c.defaultRerankTopN > c.maxRerankTopN) problems.push('RAGGUARD_RERANK_TOP_N: must not exceed RAGGUARD_MAX_RERANK_TOP_N');
    if (c.adminKey !== '' && c.adminKey === c.apiKey) problems.push('RAGGUARD_ADMIN_KEY: must differ from RAGGUARD_API_KEY');
    for (const [v, key] of [['RAGGUARD_API_KEY', c.apiKey], ['RAGGUARD_ADMIN_KEY', c.adminKey]] as const) {
      const digest = key === '' ? '' : createHash('sha256').update(key).digest('hex');
      const same = c.keys.find((k) => k.sha256 === digest);
      if (same) problems.push(`RAGGUARD_KEYS_FILE: '${same.name}' has the same key as ${v}`);
    }
    if (c.maxN > c.maxNumSeqs) {
      // The default follows a smaller RAGGUARD_MAX_NUM_SEQS; a value set above it is refused.
      if (env['RAGGUARD_MAX_N'] === undefined) c.maxN = c.maxNumSeqs;
      else problems.push('RAGGUARD_MAX_N: must not exceed RAGGUARD_MAX_NUM_SEQS (the samples of one request decode in one batch)');
    }
    if (c.defaultMaxNewTokens > c.maxNewTokensLimit) {
      problems.push('RAGGUARD_MAX_NEW_TOKENS: must not exceed RAGGUARD_MAX_NEW_TOKENS_LIMIT');
    }
  }
  if (problems.length) throw new ConfigError(problems);
  return c;
}

/** Markdown table of every variable, for the README. */
export function configTable(): string {
  const rows = VARIABLES.map((v) => `| \`${v.name}\` | \`${v.default === '' ? "''" : v.default}\` | ${v.doc} |`);
  return ['| variable | default | meaning |', '| --- | --- | --- |', ...rows].join('\n');
}
