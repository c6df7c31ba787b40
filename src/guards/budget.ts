/**
 * The memory budget and how it is split: weights and the index are what they are; of what they
 * leave, RAGGUARD_KV_FRACTION goes to the KV block pool (capped at what max_num_seqs sequences of the
 * model's full length could use) and the rest is workspace for model runs, which the guard hands out.
 */
import type { Config } from '../config/config.js';

export interface BudgetPlan {
  budgetBytes: number;
  /** Where the budget came from: an explicit byte count, or a fraction of the GPU's or host's memory. */
  source: 'bytes' | 'gpu' | 'host';
  kvPoolBytes: number;
}

export function planBudget(
  cfg: Pick<Config, 'memoryBudget' | 'kvCacheBytes' | 'kvFraction' | 'maxNumSeqs'>,
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
  const useful = cfg.maxNumSeqs * kv.maxPositions * kv.bytesPerToken;
  const kvPoolBytes = cfg.kvCacheBytes > 0 ? cfg.kvCacheBytes : Math.min(Math.floor(cfg.kvFraction * left), useful);
  if (kvPoolBytes >= left) {
    throw new Error(`RAGGUARD_KV_CACHE_BYTES: a ${kvPoolBytes}-byte pool leaves no workspace in a ${budgetBytes}-byte budget`);
  }
  return { budgetBytes, source, kvPoolBytes };
}
