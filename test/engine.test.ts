/**
 * Continuous batching on the paged KV cache, with the shipped decoder in both layouts (its Optimum
 * export, and the genai conversion setup makes of it): greedy output is the same alone, inside any
 * batch, and after preemption; the pool ends empty.
 */
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { after, before, describe, test } from 'node:test';
import { execFileSync } from 'node:child_process';
import { BlockManager } from '../src/generate/block-manager.js';
import { DecoderModel } from '../src/backends/ort/decoder-model.js';
import { Engine, PromptNeverFitsError } from '../src/generate/engine.js';
import { generate } from '../src/backends/ort/generator.js';
import { ROOT } from './helpers.js';
import { ortEngine } from '../src/backends/ort/ort-runner.js';

const BS = 16;
let tmp: string;

before(async () => {
  // The genai layout is built here from the shipped export, as setup builds models/decoder-gqa.
  tmp = await mkdtemp(path.join(tmpdir(), 'ragguard-gqa-'));
  execFileSync(process.execPath, ['--import', 'tsx', path.join(ROOT, 'scripts', 'build-gqa-decoder.ts'), path.join(ROOT, 'models', 'decoder'), tmp], { stdio: 'pipe' });
});
after(() => rm(tmp, { recursive: true, force: true }));

for (const layout of ['optimum', 'genai'] as const) describe(`decoder layout ${layout}`, () => {
let model: DecoderModel;
let prompts: number[][];
let refs: number[][];

function engine(numBlocks: number, maxNumSeqs = 32, kvWriteBack: 'eager' | 'lazy' = 'eager'): { engine: Engine; blocks: BlockManager } {
  const blocks = new BlockManager({ numBlocks, blockSize: BS, watermark: 0.01, enablePrefixCaching: true });
  return { engine: ortEngine(model, blocks, { numBlocks, blockSize: BS, maxNumSeqs, maxNumBatchedTokens: 4096, kvWriteBack }), blocks };
}

before(async () => {
  model = await DecoderModel.load(layout === 'genai' ? tmp : path.join(ROOT, 'models', 'decoder'), 'cpu');
  assert.equal(model.layout, layout);
  const v = JSON.parse(await readFile(path.join(ROOT, 'models', 'testvectors.json'), 'utf8')) as {
    decoder: { prompt_ids: number[]; greedy_ids: number[] }[];
  };
  const tok = model.tokenizer;
  const extra = ['How do I list installed packages?', 'What does the sticky bit do?', 'Where are logs kept?', 'x']
    .map((q, i) => [1, ...tok.encode(`Context:\n[1] note ${i}: ${'some words '.repeat(3 + 5 * i)}\n\nQuestion: ${q}\nAnswer:`)]);
  prompts = [...v.decoder.map((d) => d.prompt_ids), ...extra];
  refs = [];
  for (const p of prompts) refs.push((await generate(model, p, { maxNewTokens: 20, temperature: 0 })).ids);
  // the sequential path itself reproduces the reference implementation (see reference-vectors.test.ts),
  // in the genai layout too: the conversion keeps the model
  v.decoder.forEach((d, i) => assert.deepEqual(refs[i], d.greedy_ids.filter((t) => !model.eosIds.has(t)).slice(0, 20)));
});

test('alone on the paged cache: the same greedy ids as the contiguous-cache path', async () => {
  const { engine: e, blocks } = engine(256);
  for (let i = 0; i < prompts.length; i++) {
    const g = await e.generate(prompts[i]!, { maxNewTokens: 20, temperature: 0 });
    assert.deepEqual(g.ids, refs[i], `prompt ${i}`);
  }
  assert.equal(blocks.stats().usedBlocks, 0);
});

test('inside a batch of mixed lengths: identical to alone', async () => {
  const { engine: e, blocks } = engine(256);
  const outs = await Promise.all(prompts.map((p) => e.generate(p, { maxNewTokens: 20, temperature: 0 })));
  outs.forEach((g, i) => assert.deepEqual(g.ids, refs[i], `prompt ${i}`));
  assert.ok(e.stats.decodeRows > e.stats.steps, 'decode steps ran several sequences at once');
  assert.ok(e.stats.pastReused > 0, 'steady batches reused last step\'s present KV as past');
  assert.equal(blocks.stats().usedBlocks, 0, 'every block is back');
});

test('a batch that shrinks step by step (staggered lengths): outputs unchanged; on a direct session its new pasts are made in the last ones\' memory', async () => {
  const { engine: e, blocks } = engine(256);
  const lengths = prompts.map((_, i) => Math.min(20, 4 + 3 * i)); // the references are 20 tokens long
  const outs = await Promise.all(prompts.map((p, i) => e.generate(p, { maxNewTokens: lengths[i]!, temperature: 0 })));
  outs.forEach((g, i) => assert.deepEqual(g.ids, refs[i]!.slice(0, lengths[i]), `prompt ${i}`));
  const direct = model.runPath.path === 'direct';
  if (direct) assert.ok(e.stats.spareTaken > 0, 'a shrunk batch\'s past was made in a spare tensor');
  else assert.equal(e.stats.spareTaken, 0, 'onnxruntime-node\'s tensors are never reused');
  assert.equal(blocks.stats().usedBlocks, 0, 'every block is back');
});

test('a batch step\'s main-thread work paced (slices of 0 ms): a turn of the event loop between rows, outputs unchanged', async () => {
  const blocks = new BlockManager({ numBlocks: 256, blockSize: BS, watermark: 0.01, enablePrefixCaching: true });
  const e = ortEngine(model, blocks, { numBlocks: 256, blockSize: BS, maxNumSeqs: 32, maxNumBatchedTokens: 4096, paceSliceMs: 0 });
  const outs = await Promise.all(prompts.map((p) => e.generate(p, { maxNewTokens: 20, temperature: 0 })));
  outs.forEach((g, i) => assert.deepEqual(g.ids, refs[i], `prompt ${i}`));
  // Every decode row's sampling waits for its turn (the releases and gathers add more).
  assert.ok(e.stats.paced >= e.stats.decodeRows, `${e.stats.paced} turns for ${e.stats.decodeRows} decode rows`);
  assert.equal(blocks.stats().usedBlocks, 0, 'every block is back');
});

test('preempted by a pool too small for all at once: same outputs, nothing leaked', async () => {
  const longest = Math.max(...prompts.map((p) => p.length)) + 20;
  const { engine: e, blocks } = engine(Math.ceil(longest / BS) + 6);
  const outs = await Promise.all(prompts.map((p) => e.generate(p, { maxNewTokens: 20, temperature: 0 })));
  outs.forEach((g, i) => assert.deepEqual(g.ids, refs[i], `prompt ${i}`));
  assert.ok(e.stats.preemptions > 0, 'the pool forced preemption');
  assert.equal(blocks.stats().usedBlocks, 0);
});

test('seeded sampling gives the same stream alone and in a batch', async () => {
  const params = { maxNewTokens: 12, temperature: 0.8, seed: 7 };
  const alone = await engine(256).engine.generate(prompts[1]!, params);
  const { engine: e } = engine(256);
  const [, inBatch] = await Promise.all([e.generate(prompts[0]!, params), e.generate(prompts[1]!, params), e.generate(prompts[2]!, params)]);
  assert.deepEqual(inBatch!.ids, alone.ids);
});

test('a prompt that can never fit the pool fails alone; the others are served', async () => {
  const { engine: e, blocks } = engine(8);
  const huge = Array.from({ length: 8 * BS + 1 }, (_, i) => 5 + (i % 50));
  const [bad, good] = await Promise.allSettled([
    e.generate(huge, { maxNewTokens: 4, temperature: 0 }),
    e.generate(prompts[7]!, { maxNewTokens: 4, temperature: 0 }),
  ]);
  assert.equal(bad.status, 'rejected');
  assert.ok((bad as PromiseRejectedResult).reason instanceof PromptNeverFitsError);
  assert.equal(good.status, 'fulfilled');
  assert.deepEqual((good as PromiseFulfilledResult<{ ids: number[] }>).value.ids, refs[7]!.slice(0, 4));
  assert.equal(blocks.stats().usedBlocks, 0);
});

// The device path's policy (KV stays with the model between steps, the pool is written back only when
// blocks change hands), run on the CPU: the same outputs, and the pool right whenever blocks move.
test('lazy write-back: identical outputs batched and preempted; written back only when blocks move', async () => {
  const { engine: e, blocks } = engine(256, 32, 'lazy');
  const outs = await Promise.all(prompts.map((p) => e.generate(p, { maxNewTokens: 20, temperature: 0 })));
  outs.forEach((g, i) => assert.deepEqual(g.ids, refs[i], `prompt ${i}`));
  assert.ok(e.stats.writeBacks > 0 && e.stats.writeBacks < e.stats.steps / 2, `${e.stats.writeBacks} write-backs in ${e.stats.steps} steps`);
  assert.equal(blocks.stats().usedBlocks, 0);

  const longest = Math.max(...prompts.map((p) => p.length)) + 20;
  const small = engine(Math.ceil(longest / BS) + 6, 32, 'lazy');
  const again = await Promise.all(prompts.map((p) => small.engine.generate(p, { maxNewTokens: 20, temperature: 0 })));
  again.forEach((g, i) => assert.deepEqual(g.ids, refs[i], `prompt ${i} after preemption`));
  assert.ok(small.engine.stats.preemptions > 0);
});

test('lazy write-back: blocks filled by generated tokens serve a later prefix hit with the right KV', async () => {
  const { engine: e } = engine(256, 32, 'lazy');
  const i = prompts.findIndex((p) => p.length > BS);
  const first = await e.generate(prompts[i]!, { maxNewTokens: 40, temperature: 0, ignoreEos: true });
  // The follow-up prompt is the first prompt plus its answer: its leading full blocks, generated tokens
  // included, come from the prefix cache, whose KV only reached the pool by write-back.
  const follow = [...prompts[i]!, ...first.ids, 5, 6, 7];
  const expected = (await generate(model, follow, { maxNewTokens: 12, temperature: 0 })).ids;
  const hit = await e.generate(follow, { maxNewTokens: 12, temperature: 0 });
  assert.ok((hit.cachedTokens ?? 0) >= prompts[i]!.length, `prefix hit of ${hit.cachedTokens} tokens`);
  assert.deepEqual(hit.ids, expected);
});

test('lazy write-back, one request at a time: the prefill\'s KV is carried into decode and written back once, at the end', async () => {
  const { engine: e, blocks } = engine(256, 32, 'lazy');
  for (let i = 0; i < 4; i++) {
    const g = await e.generate(prompts[i]!, { maxNewTokens: 20, temperature: 0 });
    assert.deepEqual(g.ids, refs[i], `prompt ${i}`);
  }
  assert.equal(e.stats.writeBacks, 4, 'one write-back per request, when it finishes');
  assert.equal(e.stats.pastReused, e.stats.steps - e.stats.prefills, 'every decode step reused the carried KV');
  assert.equal(blocks.stats().usedBlocks, 0);
});

test('a batch that outgrows its past buffer goes on in a wider one, outputs unchanged', async () => {
  // Rows near a 64-position boundary of the genai buffer, generating across it (and the optimum
  // layout's ever-growing present, for comparison).
  const i = prompts.findIndex((p) => p.length > 400);
  const long = [prompts[i]!, [...prompts[i]!.slice(0, 450)], [...prompts[i]!.slice(0, 300)]];
  const params = { maxNewTokens: 48, temperature: 0, ignoreEos: true };
  const expected = await Promise.all(long.map((p) => generate(model, p, params)));
  for (const mode of ['eager', 'lazy'] as const) {
    const { engine: e, blocks } = engine(256, 32, mode);
    const outs = await Promise.all(long.map((p) => e.generate(p, params)));
    outs.forEach((g, r) => assert.deepEqual(g.ids, expected[r]!.ids, `${mode}: row ${r}`));
    assert.ok(e.stats.pastReused > 40, `${mode}: the batch kept its KV across steps (${e.stats.pastReused} reuses)`);
    assert.equal(blocks.stats().usedBlocks, 0);
  }
});
});
