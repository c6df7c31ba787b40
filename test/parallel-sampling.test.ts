/**
 * logprobs and n on the engine, with the test decoder: the logprobs are the log-softmax of the model's
 * own logits (a reference forward pass of the decoder, outside the engine, on the same tokens), and n
 * samples of one prompt prefill it once and share its blocks (counted in the block manager).
 */
import assert from 'node:assert/strict';
import path from 'node:path';
import { before, test } from 'node:test';
import { BlockManager } from '../src/generate/block-manager.js';
import { DecoderModel } from '../src/backends/ort/decoder-model.js';
import type { Engine } from '../src/generate/engine.js';
import { ortEngine } from '../src/backends/ort/ort-runner.js';
import { tokenLogprobs, topIds, type TokenLogprobs } from '../src/generate/logprobs.js';
import { MemoryModel } from '../src/guards/memory-model.js';
import { ROOT, TEST_ENV } from './helpers.js';

const BS = 16;
let model: DecoderModel;
let prompt: number[];

before(async () => {
  model = await DecoderModel.load(path.join(ROOT, TEST_ENV['RAGGUARD_DECODER']!), 'cpu');
  prompt = [1, ...model.tokenizer.encode('Context:\n[1] The sticky bit on a directory lets only a file\'s owner delete it.\n\nQuestion: What does the sticky bit do?\nAnswer:')];
  assert.ok(prompt.length % BS !== 0 && prompt.length > 2 * BS, `the prompt (${prompt.length} tokens) ends in a partly filled block`);
});

function engine(opts: { prefixCaching?: boolean; kvWriteBack?: 'eager' | 'lazy' } = {}): { engine: Engine; blocks: BlockManager } {
  const blocks = new BlockManager({ numBlocks: 128, blockSize: BS, enablePrefixCaching: opts.prefixCaching ?? true });
  return { engine: ortEngine(model, blocks, { numBlocks: 128, blockSize: BS, maxNumSeqs: 16, maxNumBatchedTokens: 4096, paceSliceMs: 0, kvWriteBack: opts.kvWriteBack }), blocks };
}

/** The decoder's last logits for `ids`, one forward pass from an empty cache (no engine, no pool). */
async function referenceLogits(ids: number[]): Promise<Float32Array> {
  const out = await model.forward({ tokens: [ids], lengths: [0], past: undefined, width: model.pastWidth([0], ids.length + 1) });
  const logits = new Float32Array(out.lastLogits);
  for (const t of out.present) t.dispose();
  return logits;
}

/** log-softmax in float64 over a full sort: written apart from logprobs.ts, as the reference. */
function referenceLogSoftmax(logits: Float32Array): { id: number; lp: number }[] {
  const xs = Array.from(logits);
  const max = Math.max(...xs);
  const lse = max + Math.log(xs.reduce((a, x) => a + Math.exp(x - max), 0));
  return xs.map((x, id) => ({ id, lp: x - lse })).sort((a, b) => b.lp - a.lp || a.id - b.id);
}

test('topIds: the k largest, largest first, ties to the lower id', () => {
  const l = new Float32Array([1, 5, 3, 5, -2, 4, 3]);
  assert.deepEqual(topIds(l, 4), [1, 3, 5, 2]);
  assert.deepEqual(topIds(l, 0), []);
  assert.deepEqual(topIds(l, 10), [1, 3, 5, 2, 6, 0, 4]);
  const lp = tokenLogprobs(l, 4, 2);
  const sum = Array.from(l).reduce((a, x) => a + Math.exp(x), 0);
  assert.ok(Math.abs(lp.logprob - (-2 - Math.log(sum))) < 1e-9);
});

for (const temperature of [0, 0.8]) {
  test(`logprobs at temperature ${temperature}: each token's and its top 5 equal the log-softmax of a reference forward pass within 1e-3`, async () => {
    const { engine: e } = engine();
    const g = await e.generate(prompt, { maxNewTokens: 6, temperature, seed: 3, logprobs: 5, ignoreEos: true });
    assert.equal(g.logprobs?.length, g.ids.length);
    for (let k = 0; k < g.ids.length; k++) {
      const ref = referenceLogSoftmax(await referenceLogits([...prompt, ...g.ids.slice(0, k)]));
      const lp: TokenLogprobs = g.logprobs![k]!;
      assert.equal(lp.id, g.ids[k]);
      const chosen = ref.find((r) => r.id === lp.id)!;
      assert.ok(Math.abs(lp.logprob - chosen.lp) < 1e-3, `token ${k}: ${lp.logprob} against ${chosen.lp}`);
      assert.equal(lp.top.length, 5);
      lp.top.forEach((t, j) => {
        assert.ok(Math.abs(t.logprob - ref[j]!.lp) < 1e-3, `token ${k}, top ${j}: ${t.logprob} against ${ref[j]!.lp}`);
        // Ids may trade places only where their logprobs tie within the tolerance.
        if (t.id !== ref[j]!.id) assert.ok(Math.abs(ref.find((r) => r.id === t.id)!.lp - ref[j]!.lp) < 1e-3);
      });
      if (temperature === 0) assert.equal(lp.id, lp.top[0]!.id, 'greedy takes the most likely token');
    }
  });
}

test('no logprobs asked: none computed', async () => {
  const { engine: e } = engine();
  const g = await e.generate(prompt, { maxNewTokens: 3, temperature: 0 });
  assert.equal(g.logprobs, undefined);
});

for (const kvWriteBack of ['eager', 'lazy'] as const) test(`n = 4 (${kvWriteBack} KV write-back): one prefill, the prompt's blocks held once (forked, shared), seeded apart, reproducible`, async () => {
  const promptBlocks = Math.ceil(prompt.length / BS);
  const run = async () => {
    // No prefix cache: only the fork can share the prompt's blocks.
    const { engine: e, blocks } = engine({ prefixCaching: false, kvWriteBack });
    const firstSeen: number[] = [];
    let peak = 0;
    const gens = await e.generateMany(prompt, { maxNewTokens: 12, temperature: 1, seed: 42 }, 4, {
      onToken: (i, t) => {
        const used = blocks.stats().usedBlocks;
        peak = Math.max(peak, used);
        if (t.tokenId !== null && firstSeen[i] === undefined) firstSeen[i] = used;
      },
    });
    assert.equal(e.stats.prefills, 1, 'the prompt is prefilled once');
    assert.equal(blocks.stats().usedBlocks, 0, 'every block is back');
    return { gens, firstSeen, peak };
  };
  const a = await run();
  // At each sample's first token (right after the prefill) the four hold the prompt's blocks, once.
  assert.deepEqual(a.firstSeen, [promptBlocks, promptBlocks, promptBlocks, promptBlocks]);
  // Growing, each sample copies the shared partial block (one each but the last holder) and takes new
  // ones: far less than four prompts' worth.
  const perSample = Math.ceil((prompt.length + 12) / BS) - Math.floor(prompt.length / BS);
  assert.ok(a.peak <= Math.floor(prompt.length / BS) + 4 * perSample, `peak ${a.peak} blocks`);
  assert.ok(a.peak < 4 * promptBlocks, `peak ${a.peak} blocks, four copies of the prompt would be ${4 * promptBlocks}`);
  const b = await run();
  assert.deepEqual(b.gens.map((g) => g.ids), a.gens.map((g) => g.ids), 'the same seed gives the same four samples');
  assert.ok(new Set(a.gens.map((g) => g.ids.join(','))).size > 1, 'the samples differ');
  // Sample i is what n = 1 with seed 42 + i gives: its KV (the shared prompt, its own copy of the last block) is right.
  const { engine: e } = engine();
  for (let i = 0; i < 4; i++) {
    const alone = await e.generate(prompt, { maxNewTokens: 12, temperature: 1, seed: 42 + i });
    assert.deepEqual(a.gens[i]!.ids, alone.ids, `sample ${i}`);
  }
});

test('n = 3 with max_tokens 1 and with logprobs: every sample answers, blocks all back', async () => {
  const { engine: e, blocks } = engine();
  const gens = await e.generateMany(prompt, { maxNewTokens: 1, temperature: 0, logprobs: 2 }, 3);
  assert.equal(gens.length, 3);
  for (const g of gens) {
    assert.deepEqual(g.ids, gens[0]!.ids);
    assert.equal(g.logprobs?.length, 1);
    assert.equal(g.logprobs![0]!.top.length, 2);
  }
  assert.equal(blocks.stats().usedBlocks, 0);
});

test('n samples abandoned before their prefill: all reject, nothing held', async () => {
  const { engine: e, blocks } = engine();
  const ctl = new AbortController();
  const p = e.generateMany(prompt, { maxNewTokens: 8, temperature: 1 }, 3, { signal: ctl.signal });
  ctl.abort(new Error('gone'));
  await assert.rejects(p, /gone/);
  await e.idle();
  assert.equal(blocks.stats().usedBlocks, 0);
});

test('the memory model\'s n samples: the prompt\'s full blocks once, each sample its own from the last prompt block on; n decode rows', () => {
  const m = new MemoryModel({ numLayers: 2, hiddenSize: 128, numHeads: 4, intermediateSize: 512 },
    { numLayers: 4, hiddenSize: 256, numHeads: 8, numKvHeads: 2, headDim: 32, intermediateSize: 768, vocabSize: 4096 }, 16);
  const one = { queryTokens: 0, topK: 0, rerankTopN: 0, pairTokens: 0, promptTokens: 40, maxNewTokens: 30 };
  assert.equal(m.predict(one).kvBlocks, 5); // 70 tokens
  // 2 shared full blocks (32 tokens), then each sample's tokens 32..69: 3 blocks each.
  assert.equal(m.predict({ ...one, samples: 4 }).kvBlocks, 2 + 4 * 3);
  assert.ok(m.predict({ ...one, samples: 4 }).stages.decode > m.predict(one).stages.decode, 'four decode rows cost more than one');
  assert.equal(m.predict({ ...one, samples: 4 }).stages.prefill, m.predict(one).stages.prefill, 'one prefill');
});

test('a group of n is admitted when its samples fit max_num_seqs beside the running ones', async () => {
  const blocks = new BlockManager({ numBlocks: 128, blockSize: BS });
  const e = ortEngine(model, blocks, { numBlocks: 128, blockSize: BS, maxNumSeqs: 4, maxNumBatchedTokens: 4096, paceSliceMs: 0 });
  let most = 0;
  const watch = () => (most = Math.max(most, e.scheduler.running.length));
  const gens = await Promise.all([
    e.generate(prompt, { maxNewTokens: 6, temperature: 0, ignoreEos: true }, { onToken: watch }),
    e.generateMany(prompt, { maxNewTokens: 6, temperature: 1, seed: 1, ignoreEos: true }, 4, { onToken: watch }),
  ]);
  assert.equal(gens[1].length, 4);
  assert.ok(most <= 4, `${most} sequences ran at once, max_num_seqs 4`);
});
