/** The KV pool is sized from the request limits within the budget, never from max_position_embeddings. */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { describeKvPool, planBudget } from '../src/guards/budget.js';

const GiB = 2 ** 30;
const base = {
  memoryBudget: { bytes: 8 * GiB }, kvCacheBytes: 0, kvFraction: 0.5, maxNumSeqs: 32,
  promptBudgetTokens: 768, maxNewTokensLimit: 256, kvBlockSize: 16,
};
const kv = { bytesPerToken: 12288, maxPositions: 32768 }; // a small Qwen2 with 32k positions

test('request limits, not max positions, size the pool', () => {
  const plan = planBudget(base, 100e6, null, 64 * GiB, kv);
  assert.equal(plan.kv.bound, 'request_limits');
  assert.equal(plan.kv.tokensPerSequence, 1024);
  assert.equal(plan.kvPoolBytes, 32 * 1024 * 12288);
  assert.ok(plan.kvPoolBytes < 32 * 32768 * 12288 / 30);
  assert.match(describeKvPool(plan, 32), /KV pool 384\.0 MiB \(request limits: 32 sequences x 1024 tokens/);
});

test('whole blocks; a model shorter than the limits caps a sequence at its positions', () => {
  const odd = planBudget({ ...base, promptBudgetTokens: 770 }, 0, null, 0, kv);
  assert.equal(odd.kvPoolBytes, 32 * Math.ceil(1026 / 16) * 16 * 12288);
  const short = planBudget(base, 0, null, 0, { bytesPerToken: 100, maxPositions: 512 });
  assert.equal(short.kv.tokensPerSequence, 512);
  assert.equal(short.kvPoolBytes, 32 * 512 * 100);
});

test('the budget share bounds the pool when the limits need more; an explicit size wins', () => {
  const small = planBudget({ ...base, memoryBudget: { bytes: 400 * 2 ** 20 } }, 100 * 2 ** 20, null, 0, kv);
  assert.equal(small.kv.bound, 'budget_share');
  assert.equal(small.kvPoolBytes, 150 * 2 ** 20);
  assert.match(describeKvPool(small, 32), /budget share .* below the request limits' 384\.0 MiB/);
  const explicit = planBudget({ ...base, kvCacheBytes: 1e6 }, 0, null, 0, kv);
  assert.equal(explicit.kvPoolBytes, 1e6);
  assert.equal(explicit.kv.bound, 'explicit');
});
