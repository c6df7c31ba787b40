/**
 * The agreement check's own logic (scripts/check-agreement.ts; the GPU host runs it on the 7B files): the
 * KL divergence and top-1 of one position, teacher-forced prefixes through the CUDA runner (over the
 * stand-in native library), and the verdict that ours must be at least as close to the float32 reference
 * as llama.cpp on the same file.
 */
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { CudaModelRunner } from '../src/backends/cuda/cuda-runner.js';
import { oursAt, teacherForcedContexts, verdicts } from '../scripts/check-agreement.js';
import { agreementOf, positionAgreement, type Agreement } from '../scripts/logit-compare.js';
import { standInCuda, TINY, writeTinyCheckpoint } from './cuda-standin.js';

test('one position: KL(reference || ours) in nats and top-1', () => {
  const same = positionAgreement([1, 2, 3], [1, 2, 3], 3);
  assert.ok(same.kl < 1e-12);
  assert.equal(same.top1, true);
  // p = softmax(0, 0) = (0.5, 0.5), q = softmax(0, ln 3) = (0.25, 0.75): KL = 0.5 ln 2 + 0.5 ln(2/3).
  const a = positionAgreement([0, Math.log(3)], [0, 0], 2);
  assert.ok(Math.abs(a.kl - (0.5 * Math.log(2) + 0.5 * Math.log(2 / 3))) < 1e-12);
  // A shift of every logit changes nothing; a different winner is a top-1 miss.
  assert.ok(positionAgreement([11, 12, 13], [1, 2, 3], 3).kl < 1e-12);
  assert.equal(positionAgreement([3, 2, 1], [1, 2, 3], 3).top1, false);
});

test('teacher-forced contexts: every prefix from the first compared position on', () => {
  const ctx = teacherForcedContexts([{ first: 1, ids: [5, 6, 7] }, { first: 0, ids: [9] }]);
  assert.deepEqual(ctx.map((c) => c.prompt_ids), [[5, 6], [5, 6, 7], [9]]);
});

test('the verdict fails a side further from the reference than llama.cpp on the same file', () => {
  const side = (mean_kl: number, top1: number): Agreement => ({ rows: 10, top1, mean_kl, max_kl: mean_kl * 3, worst: { sequence: 0, position: 0 }, first_top1: 1 });
  const good = verdicts(new Map([['ours:Q4_K_M', side(0.03, 0.95)], ['file:llama-Q4_K_M', side(0.031, 0.94)], ['ours:dense', side(0.002, 1)], ['file:torch-dense', side(0.0021, 1)]]));
  assert.deepEqual(good.failures, []);
  assert.equal(good.pairs.length, 2);
  const bad = verdicts(new Map([['ours:Q8_0', side(0.02, 0.9)], ['file:llama-Q8_0', side(0.001, 0.99)]]));
  assert.equal(bad.failures.length, 1);
  assert.match(bad.failures[0]!, /ours:Q8_0 is further from the float32 reference than file:llama-Q8_0/);
  // A side with no peer in the run has no verdict.
  assert.equal(verdicts(new Map([['ours:Q6_K', side(1, 0)]])).pairs.length, 0);
  // Each way of running the file (dequantized tiles, the GEMV's half products) answers to llama.cpp on that file.
  const ways = verdicts(new Map([['ours:Q4_K_M-half2', side(0.05, 0.9)], ['ours:Q4_K_M-dequant', side(0.03, 0.95)], ['file:llama-Q4_K_M', side(0.031, 0.94)]]));
  assert.deepEqual(ways.pairs.map((p) => [p.ours, p.peer, p.ok]), [['ours:Q4_K_M-half2', 'file:llama-Q4_K_M', false], ['ours:Q4_K_M-dequant', 'file:llama-Q4_K_M', true]]);
});

let dir: string;
before(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'ragguard-agree-'));
  await writeTinyCheckpoint(dir);
});
after(() => rm(dir, { recursive: true, force: true }));

test('our logits at every compared position come from the runner, one prefix at a time, prefix blocks reused', async () => {
  // The stand-in model answers (last token + 1): each compared position's top-1 is its own token + 1.
  const runner = await CudaModelRunner.load(dir, { numBlocks: 32, blockSize: 4, maxBatchedTokens: 16, maxSeqs: 4 }, standInCuda(TINY));
  try {
    const sequences = [{ first: 2, ids: [3, 4, 5, 6, 7, 8, 9, 10, 11] }, { first: 0, ids: [20, 21] }];
    const rows = await oursAt(runner, sequences, { numBlocks: 32, blockSize: 4 });
    assert.equal(rows.length, 7 + 2);
    const V = TINY.vocab_size;
    const lasts = sequences.flatMap((s) => s.ids.slice(s.first));
    rows.forEach((r, i) => assert.equal(r.indexOf(Math.max(...r)), (lasts[i]! + 1) % V));
    // Against a reference that is the stand-in's own answer: top-1 everywhere, KL 0; against one whose
    // winner is another token: no top-1.
    const reference = new Float32Array(rows.length * V);
    rows.forEach((r, i) => reference.set(r, i * V));
    const a = agreementOf((i) => rows[i]!, reference, V, sequences);
    assert.deepEqual([a.rows, a.top1, a.first_top1], [9, 1, 1]);
    assert.ok(a.mean_kl < 1e-9);
    const shifted = new Float32Array(reference.length);
    for (let i = 0; i < rows.length; i++) shifted[i * V + ((lasts[i]! + 5) % V)] = 4;
    assert.equal(agreementOf((i) => rows[i]!, shifted, V, sequences).top1, 0);
  } finally {
    runner.close();
  }
});
