import assert from 'node:assert/strict';
import { test } from 'node:test';
import { BlockManager } from '../src/generate/block-manager.js';
import { Scheduler } from '../src/generate/scheduler.js';
import { Sequence } from '../src/generate/sequence.js';

const BS = 4;
let nextId = 0;
const seq = (len: number) => new Sequence(nextId++, Array.from({ length: len }, (_, i) => 100 + nextId * 50 + i), { maxNewTokens: 100, temperature: 0 }, nextId);
function manager(numBlocks: number, watermark = 0): BlockManager {
  return new BlockManager({ numBlocks, blockSize: BS, watermark, enablePrefixCaching: false });
}

test('admits FCFS up to max_num_seqs and the step token budget; later arrivals wait their turn', () => {
  const s = new Scheduler(manager(100), { maxNumSeqs: 2, maxNumBatchedTokens: 1000 });
  const [a, b, c] = [seq(8), seq(8), seq(8)];
  [a, b, c].forEach((x) => s.add(x!));
  const p1 = s.schedule();
  assert.deepEqual(p1.prefills, [a, b]);
  assert.deepEqual(s.waiting, [c]);
  const budget = new Scheduler(manager(100), { maxNumSeqs: 10, maxNumBatchedTokens: 20 });
  const [d, e, f] = [seq(8), seq(8), seq(30)];
  [d, e, f].forEach((x) => budget.add(x!));
  assert.deepEqual(budget.schedule().prefills, [d, e], '8 + 8 fit 20 tokens, the third does not');
  budget.finish(d!);
  budget.finish(e!);
  assert.deepEqual(budget.schedule().prefills, [f], 'a prompt over the budget runs alone rather than never');
});

test('the watermark holds admission back; a prompt larger than the pool is rejected', () => {
  const s = new Scheduler(manager(10, 0.2), { maxNumSeqs: 10, maxNumBatchedTokens: 1000 });
  const a = seq(4 * BS); // 4 blocks: 10 - 4 = 6 free >= 2 watermark
  const b = seq(4 * BS); // would leave 2 - ... 6 - 4 = 2 free: still >= watermark of 2
  const c = seq(2 * BS); // 2 - 2 = 0 < 2: later
  const huge = seq(11 * BS);
  [huge, a, b, c].forEach((x) => s.add(x));
  const plan = s.schedule();
  assert.deepEqual(plan.rejected, [huge]);
  assert.deepEqual(plan.prefills, [a, b]);
  assert.deepEqual(s.waiting, [c]);
});

test('when the pool runs out, the last admitted is preempted and requeued first; the others decode', () => {
  const bm = manager(4);
  const s = new Scheduler(bm, { maxNumSeqs: 10, maxNumBatchedTokens: 1000 });
  const a = seq(2 * BS);
  const b = seq(2 * BS);
  const late = seq(1);
  [a, b].forEach((x) => s.add(x));
  s.schedule();
  [a, b].forEach((x) => {
    x.numComputed = x.length;
    x.outputIds.push(7);
  });
  s.add(late);
  // each needs a third block for its next token; only one can have it
  const plan = s.schedule();
  assert.deepEqual(plan.decodes, [a]);
  assert.deepEqual(plan.preempted, [b]);
  assert.equal(b.numComputed, 0);
  assert.equal(b.preemptions, 1);
  assert.deepEqual(s.waiting, [b, late], 'preempted work resumes before newer arrivals');
  assert.deepEqual(plan.prefills, [], 'nothing is admitted in a step that preempted');
  assert.equal(bm.stats().usedBlocks, 3);
});
