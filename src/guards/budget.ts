/**
 * The memory budget and how it is split: weights and the index are what they are; of what they
 * leave, RAGGUARD_KV_FRACTION goes to the KV block pool and the rest is workspace for model runs, which
 * the guard hands out. The pool is capped at what the request limits can use: max_num_seqs sequences of
 * min(prompt budget + largest max_new_tokens, the model's positions) tokens each, in whole blocks. It is
 * never sized from max_position_embeddings alone: a 32k-position model serving 768-token prompts would
 * otherwise reserve forty times what any request can touch.
 */
import type { Config } from '../config/config.js';

export interface BudgetPlan {
  budgetBytes: number;
  /** Where the budget came from: an explicit byte count, or a fraction of the GPU's or host's memory. */
  source: 'bytes' | 'gpu' | 'host';
  kvPoolBytes: number;
  /** How the pool size was reached, for the start-up log. */
  kv: KvSizing;
}

export interface KvSizing {
  /** Tokens one sequence can hold at most under the request limits. */
  tokensPerSequence: number;
  /** max_num_seqs x tokensPerSequence (in whole blocks) x bytes per token. */
  neededBytes: number;
  /** kvFraction of what the budget leaves after weights and index. */
  shareBytes: number;
  /** Which bound set the pool: the explicit RAGGUARD_KV_CACHE_BYTES, the request limits, or the budget's share. */
  bound: 'explicit' | 'request_limits' | 'budget_share';
}

export function planBudget(
  cfg: Pick<Config, 'memoryBudget' | 'kvCacheBytes' | 'kvFraction' | 'maxNumSeqs' | 'promptBudgetTokens' | 'maxNewTokensLimit' | 'kvBlockSize'>,
  staticBytes: number,
  gpuTotalBytes: number | null,
  hostTotalBytes: number,
  kv: { bytesPerToken: number; maxPositions: number },
): BudgetPlan {
  const b = cfg.memoryBudget;
  const source = 'bytes' in b ? 'bytes' : gpuTotalBytes !== null ? 'gpu' : 'host';
  const budgetBytes = 'bytes' in b ? b.bytes : Math.floor(b.fraction * (gpuTotalBytes ?? hostTotalBytes));
  const left = budgetBytes - staticBytes;
  if (left <= 0) {
    throw new Error(`RAGGUARD_MEMORY_BUDGET: ${budgetBytes} bytes do not even hold the weights and index (${staticBytes} bytes)`);
  }
  const tokensPerSequence = Math.min(kv.maxPositions, cfg.promptBudgetTokens + cfg.maxNewTokensLimit);
  const blocksPerSequence = Math.ceil(tokensPerSequence / cfg.kvBlockSize);
  const neededBytes = cfg.maxNumSeqs * blocksPerSequence * cfg.kvBlockSize * kv.bytesPerToken;
  const shareBytes = Math.floor(cfg.kvFraction * left);
  const bound: KvSizing['bound'] = cfg.kvCacheBytes > 0 ? 'explicit' : neededBytes <= shareBytes ? 'request_limits' : 'budget_share';
  const kvPoolBytes = bound === 'explicit' ? cfg.kvCacheBytes : Math.min(shareBytes, neededBytes);
  if (kvPoolBytes >= left) {
    throw new Error(`RAGGUARD_KV_CACHE_BYTES: a ${kvPoolBytes}-byte pool leaves no workspace in a ${budgetBytes}-byte budget`);
  }
  return { budgetBytes, source, kvPoolBytes, kv: { tokensPerSequence, neededBytes, shareBytes, bound } };
}

/** One line for the start-up log: the pool, and what sized it. */
export function describeKvPool(plan: BudgetPlan, maxNumSeqs: number): string {
  const mib = (x: number) => `${(x / 2 ** 20).toFixed(1)} MiB`;
  const { kv } = plan;
  const why = kv.bound === 'explicit' ? 'RAGGUARD_KV_CACHE_BYTES'
    : kv.bound === 'request_limits' ? `request limits: ${maxNumSeqs} sequences x ${kv.tokensPerSequence} tokens (prompt budget + max new tokens)`
      : `budget share (RAGGUARD_KV_FRACTION) below the request limits' ${mib(kv.neededBytes)}`;
  return `KV pool ${mib(plan.kvPoolBytes)} (${why}; budget ${mib(plan.budgetBytes)} from ${plan.source})`;
}
