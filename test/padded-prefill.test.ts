/**
 * Batched prefill of newly admitted sequences, right-padded to the longest of a group (ort-runner.ts,
 * DecoderModel.paddedPrefill), on the shipped decoder converted to the genai layout here (as setup
 * builds models/decoder-gqa): the same logits, next tokens, greedy continuations and pool KV as
 * prefilling each alone; pads never reach the pool; prefix hits and a graph without per-row last
 * positions (a conversion cached before it) still prefill one a run, with the same tokens.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { copyFile, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { OrtModelRunner, ortEngine } from '../src/backends/ort/ort-runner.js';
import { BlockManager } from '../src/generate/block-manager.js';
import { DecoderModel } from '../src/backends/ort/decoder-model.js';

import { exportWeights } from '../src/backends/ort/convert/export-weights.js';
import { generate } from '../src/backends/ort/generator.js';
import { buildGqaDecoder, LAST_POSITIONS, type GqaSourceConfig } from '../src/backends/ort/convert/gqa-builder.js';
import type { KvArray } from '../src/generate/decoder-shape.js';
import type { RunnerStep, StepSink } from '../src/generate/model-runner.js';
import { Sequence } from '../src/generate/sequence.js';
import { readGraph, writeModel } from '../src/runtime/onnx-proto.js';
import { ROOT } from './helpers.js';

const BS = 16;
let tmp: string;
let model: DecoderModel;
/** The same conversion less the LAST_POSITIONS output: what a graph built before it looks like to the runner. */
let older: DecoderModel;
let prompts: number[][];
/** Each prompt's 12 greedy tokens, generated alone on the contiguous-cache path (generator.ts). */
let refs: number[][];

before(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), 'ragguard-padded-'));
  const src = path.join(ROOT, 'models', 'decoder');
  const current = path.join(tmp, 'current');
  execFileSync(process.execPath, ['--import', 'tsx', path.join(ROOT, 'scripts', 'build-gqa-decoder.ts'), src, current], { stdio: 'pipe' });
  const old = path.join(tmp, 'older');
  await mkdir(old);
  for (const f of await readdir(current)) if (f !== 'model.onnx') await copyFile(path.join(current, f), path.join(old, f));
  const cfg = JSON.parse(await readFile(path.join(src, 'config.json'), 'utf8')) as GqaSourceConfig;
  const g = buildGqaDecoder(cfg, exportWeights(readGraph(await readFile(path.join(src, 'onnx', 'model.onnx'))), cfg, 'decoder'));
  const outputs = g.outputs.filter((o) => o.name !== LAST_POSITIONS);
  assert.equal(outputs.length, g.outputs.length - 1);
  await writeFile(path.join(old, 'model.onnx'), writeModel({ name: 'decoder_gqa', ...g, outputs, opsets: { '': 17, 'com.microsoft': 1 } }));

  [model, older] = await Promise.all([DecoderModel.load(current, 'cpu'), DecoderModel.load(old, 'cpu')]);
  const tok = model.tokenizer;
  // Lengths of 7 to 25 or so: within PAD_LIMIT (ort-runner.ts) of each other in twos and threes, not all at once.
  prompts = ['ls', 'How do I list installed packages?', 'What does the sticky bit do on a directory?', 'Where are logs kept?', 'x',
    'Explain file permissions and what chmod 755 means for a script in my home directory', 'df', 'Why is my disk full?']
    .map((q) => [1, ...tok.encode(`Question: ${q}\nAnswer:`)]);
  refs = [];
  for (const p of prompts) refs.push((await generate(model, p, { maxNewTokens: 12, temperature: 0 })).ids);
});
after(() => rm(tmp, { recursive: true, force: true }));

test('the graph says it takes padded rows; the older graph does not, and a padded run on it is refused', async () => {
  assert.equal(model.paddedPrefill, true);
  assert.equal(older.paddedPrefill, false);
  const width = older.pastWidth([0, 0], 3);
  await assert.rejects(older.forward({ tokens: [[1, 2, 3], [1, 2, 2]], lengths: [0, 0], counts: [3, 2], width }), /padded prefill/);
});

test('a padded prefill run: each row\'s logits are its prefill alone\'s', async () => {
  const V = model.shape.vocabSize;
  const alone: Float32Array[] = [];
  for (const p of prompts) {
    const out = await model.forward({ tokens: [p], lengths: [0], width: model.pastWidth([0], p.length) });
    alone.push(out.lastLogits.slice());
    for (const t of out.present) t.dispose();
  }
  const longest = Math.max(...prompts.map((p) => p.length));
  const lengths = prompts.map(() => 0);
  const out = await model.forward({
    tokens: prompts.map((p) => [...p, ...new Array<number>(longest - p.length).fill(0)]), lengths,
    counts: prompts.map((p) => p.length), width: model.pastWidth(lengths, longest),
  });
  try {
    prompts.forEach((_, r) => {
      const got = out.lastLogits.subarray(r * V, (r + 1) * V);
      let diff = 0;
      for (let k = 0; k < V; k++) diff = Math.max(diff, Math.abs(got[k]! - alone[r]![k]!));
      assert.ok(diff < 1e-4, `row ${r}: logits differ by ${diff}`);
      assert.equal(out.greedyIds?.[r], refs[r]![0], `row ${r}: next token`);
    });
  } finally {
    for (const t of out.present) t.dispose();
  }
});

/** A sink that records what a runner reports, as the engine's does (numComputed, output ids). */
function sink(): StepSink & { next: Map<Sequence, number> } {
  const next = new Map<Sequence, number>();
  return {
    next,
    accept(seq, fed, id) {
      seq.numComputed += fed;
      seq.outputIds.push(id);
      next.set(seq, id);
      return undefined;
    },
    finish() {},
  };
}

/** The pool's KV of `len` positions from a block table, one row, left-aligned: [k0, v0, ...] each [heads, len, dim]. */
function poolKv(runner: OrtModelRunner, table: number[], len: number): KvArray[] {
  return runner.kv.gather([{ blocks: table, length: len }], len, 'left');
}

for (const kvWriteBack of ['eager', 'lazy'] as const) describe(`write-back ${kvWriteBack}`, () => {
  test('prefilling a step\'s newcomers in padded groups: the next tokens and the pool\'s KV of every real token are alone\'s, pads never reach it', async () => {
    const tables = prompts.map((p, i) => Array.from({ length: Math.ceil(p.length / BS) + 1 }, (_, b) => 4 * i + b));
    const run = async (groups: number[][]) => {
      const runner = new OrtModelRunner(model, { numBlocks: 4 * prompts.length, blockSize: BS, kvWriteBack, paceSliceMs: 0 });
      const seqs = prompts.map((p, i) => Object.assign(new Sequence(i, p, { maxNewTokens: 12, temperature: 0 }, i), { status: 'running' as const }));
      const s = sink();
      for (const g of groups) {
        const step: RunnerStep = { decodes: [], prefills: g.map((i) => seqs[i]!), blocks: (q) => tables[q.id]! };
        await runner.execute(step, s);
        await runner.barrier();
      }
      await runner.syncPool((q) => tables[q.id]!); // lazy: a carried group's KV reaches the pool
      return { runner, seqs, next: s.next };
    };
    const alone = await run(prompts.map((_, i) => [i]));
    const together = await run([prompts.map((_, i) => i)]);
    assert.equal(alone.runner.stats.paddedPrefills, 0);
    assert.ok(together.runner.stats.paddedPrefills >= 2, `the newcomers ran in padded groups (${together.runner.stats.paddedPrefills})`);
    assert.ok(together.runner.stats.paddedPrefills < prompts.length);
    assert.equal(together.runner.stats.paddedPrefillRows > together.runner.stats.paddedPrefills, true);
    prompts.forEach((p, i) => {
      assert.equal(together.next.get(together.seqs[i]!), refs[i]![0], `prompt ${i}: next token`);
      assert.equal(alone.next.get(alone.seqs[i]!), refs[i]![0], `prompt ${i}: next token alone`);
      const a = poolKv(alone.runner, tables[i]!, p.length);
      const b = poolKv(together.runner, tables[i]!, p.length);
      a.forEach((x, j) => {
        let diff = 0;
        for (let k = 0; k < x.length; k++) diff = Math.max(diff, Math.abs(x[k]! - b[j]![k]!));
        assert.ok(diff < 1e-4, `prompt ${i}, KV tensor ${j}: differs by ${diff}`);
      });
      // Past the row's tokens its blocks hold what the pool was made with (zeros): no pad was stored.
      const whole = poolKv(together.runner, tables[i]!, tables[i]!.length * BS);
      const { numKvHeads: H, headDim: D } = model.shape;
      const width = tables[i]!.length * BS;
      for (const t of whole) {
        for (let h = 0; h < H; h++) {
          const tail = t.subarray((h * width + p.length) * D, (h + 1) * width * D);
          assert.ok(tail.every((x) => x === 0), `prompt ${i}: positions past its ${p.length} tokens were written`);
        }
      }
    });
  });

  test('the engine with newcomers arriving together: every greedy continuation is the one generated alone', async () => {
    const blocks = new BlockManager({ numBlocks: 128, blockSize: BS, watermark: 0.01, enablePrefixCaching: true });
    const e = ortEngine(model, blocks, { numBlocks: 128, blockSize: BS, maxNumSeqs: 8, maxNumBatchedTokens: 4096, kvWriteBack });
    const outs = await Promise.all(prompts.map((p) => e.generate(p, { maxNewTokens: 12, temperature: 0 })));
    outs.forEach((g, i) => assert.deepEqual(g.ids, refs[i], `prompt ${i}`));
    assert.ok(e.stats.paddedPrefills > 0, 'some newcomers prefilled together');
    assert.equal(blocks.stats().usedBlocks, 0);
  });
});

test('a padded group that is the whole batch carries its present KV into the decode steps (lazy write-back): the same continuations', async () => {
  const blocks = new BlockManager({ numBlocks: 128, blockSize: BS, watermark: 0.01, enablePrefixCaching: true });
  const e = ortEngine(model, blocks, { numBlocks: 128, blockSize: BS, maxNumSeqs: 8, maxNumBatchedTokens: 4096, kvWriteBack: 'lazy' });
  const pick = [1, 3, 7]; // 18 or 19 tokens: one group
  const outs = await Promise.all(pick.map((i) => e.generate(prompts[i]!, { maxNewTokens: 12, temperature: 0 })));
  outs.forEach((g, k) => assert.deepEqual(g.ids, refs[pick[k]!], `prompt ${pick[k]}`));
  assert.equal(e.stats.paddedPrefills, 1);
  // 11 decode steps after the prefill's token, the first on the padded prefill's own present.
  assert.equal(e.stats.pastReused, 11, 'every decode step took the last run\'s present as its past');
  assert.equal(blocks.stats().usedBlocks, 0);
});

test('newcomers with prefix hits prefill alone, after the padded groups, beside fresh ones: the same continuations', async () => {
  const blocks = new BlockManager({ numBlocks: 128, blockSize: BS, watermark: 0.01, enablePrefixCaching: true });
  const e = ortEngine(model, blocks, { numBlocks: 128, blockSize: BS, maxNumSeqs: 8, maxNumBatchedTokens: 4096 });
  // Two prompts sharing a first block of 16 tokens with a finished one: their prefills start past it.
  const shared = [1, ...model.tokenizer.encode('Context: the quick brown fox jumps over the lazy dog again and again\n')].slice(0, BS);
  assert.equal(shared.length, BS);
  const hit = [[...shared, ...prompts[1]!.slice(1)], [...shared, ...prompts[3]!.slice(1)]];
  const hitRefs: number[][] = [];
  for (const p of hit) hitRefs.push((await generate(model, p, { maxNewTokens: 12, temperature: 0 })).ids);
  await e.generate([...shared, 5], { maxNewTokens: 1, temperature: 0 }); // leaves the block in the prefix cache
  const all = [...hit, ...prompts.slice(0, 6)];
  const want = [...hitRefs, ...refs.slice(0, 6)];
  const outs = await Promise.all(all.map((p) => e.generate(p, { maxNewTokens: 12, temperature: 0 })));
  outs.forEach((g, i) => assert.deepEqual(g.ids, want[i], `prompt ${i}`));
  assert.deepEqual(outs.map((g) => g.cachedTokens), [BS, BS, 0, 0, 0, 0, 0, 0], 'the first two started past the cached block');
  assert.ok(e.stats.paddedPrefills > 0, 'the fresh ones prefilled together');
});

test('a graph without per-row last positions prefills each newcomer alone, with the same continuations', async () => {
  const blocks = new BlockManager({ numBlocks: 128, blockSize: BS, watermark: 0.01, enablePrefixCaching: true });
  const e = ortEngine(older, blocks, { numBlocks: 128, blockSize: BS, maxNumSeqs: 8, maxNumBatchedTokens: 4096 });
  const outs = await Promise.all(prompts.map((p) => e.generate(p, { maxNewTokens: 12, temperature: 0 })));
  outs.forEach((g, i) => assert.deepEqual(g.ids, refs[i], `prompt ${i}`));
  assert.equal(e.stats.paddedPrefills, 0);
  assert.equal(e.stats.prefills, prompts.length);
});
