/**
 * Per-request sampling on the engine with the shipped decoder (genai layout): stop sequences cut the
 * text, top_k = 1 is greedy, seeds replay (batched and preempted too), penalties and top_p change the
 * choice deterministically; the incremental detokenizer never emits half a character; an aborted
 * sequence is finished and its blocks freed. The sampler's arithmetic is checked on small logits.
 */
import assert from 'node:assert/strict';
import path from 'node:path';
import { before, describe, test } from 'node:test';
import { BlockManager } from '../src/generate/block-manager.js';
import { DecoderModel } from '../src/backends/ort/decoder-model.js';
import { Engine, type TokenEvent } from '../src/generate/engine.js';
import { OutputText } from '../src/generate/output-text.js';
import { PenaltyTally } from '../src/generate/penalty-tally.js';
import { applyPenalties, argmax, sampleNext, seededRandom } from '../src/generate/sampler.js';
import type { SamplingParams } from '../src/generate/sequence.js';
import { applyPenaltyEntries } from './cuda-standin.js';
import { ROOT } from './helpers.js';
import { ortEngine } from '../src/backends/ort/ort-runner.js';

const BS = 16;
let model: DecoderModel;
let prompts: number[][];

function engine(numBlocks = 256): { engine: Engine; blocks: BlockManager } {
  const blocks = new BlockManager({ numBlocks, blockSize: BS, watermark: 0.01, enablePrefixCaching: true });
  return { engine: ortEngine(model, blocks, { numBlocks, blockSize: BS, maxNumSeqs: 32, maxNumBatchedTokens: 4096 }), blocks };
}

before(async () => {
  model = await DecoderModel.load(path.join(ROOT, 'models', 'decoder-gqa'), 'cpu');
  const tok = model.tokenizer;
  prompts = ['How do I list installed packages?', 'What does the sticky bit do?', 'Where are logs kept?', 'What is a named pipe?']
    .map((q) => [1, ...tok.encode(`Context:\n[1] note: some words here\n\nQuestion: ${q}\nAnswer:`)]);
});

const greedy = (maxNewTokens = 30): SamplingParams => ({ maxNewTokens, temperature: 0 });

describe('the sampler on small logits', () => {
  const logits = Float32Array.from([2, 1, 0.5, -1, 3]);

  test('repetition penalty divides positive and multiplies negative logits of seen tokens only', () => {
    const out = applyPenalties(logits, { temperature: 0, repetitionPenalty: 2 }, [0], [3]);
    assert.deepEqual([...out], [1, 1, 0.5, -2, 3]);
    assert.deepEqual([...logits], [2, 1, 0.5, -1, 3], 'the model\'s buffer is untouched');
  });

  test('presence and frequency penalties count the output only', () => {
    const out = applyPenalties(logits, { temperature: 0, presencePenalty: 0.5, frequencyPenalty: 0.25 }, [1], [4, 4, 0]);
    assert.deepEqual([...out], [2 - 0.75, 1, 0.5, -1, 3 - 1]);
  });

  test('a penalty tally lists what applyPenalties acts on: applied as the device applies it, the same logits', () => {
    const random = seededRandom(3);
    const prompt = [4, 9, 9, 1, 30], out: number[] = [];
    const settings = [{ temperature: 0, repetitionPenalty: 1.3 }, { temperature: 0, presencePenalty: 0.4, frequencyPenalty: 0.25 },
      { temperature: 0, repetitionPenalty: 0.8, presencePenalty: -0.5, frequencyPenalty: 1 }];
    const tallies = settings.map((s) => PenaltyTally.for(s, prompt, 32)!);
    assert.equal(PenaltyTally.for({ temperature: 0.7, repetitionPenalty: 1 }, prompt, 32), undefined, 'no penalty, no list');
    for (let step = 0; step < 40; step++) {
      const logits = Float32Array.from({ length: 32 }, () => random() * 4 - 2);
      settings.forEach((s, k) => {
        const list = tallies[k]!.list(out);
        assert.equal(new Set(list.tokens).size, list.tokens.length, 'each token once');
        const device = new Float32Array(logits);
        applyPenaltyEntries(device, list, list.tokens, list.counts);
        // Equal up to float32 rounding (the device rounds between its operations).
        const cpu = applyPenalties(logits, s, prompt, out);
        device.forEach((x, i) => assert.ok(Math.abs(x - cpu[i]!) <= 1e-6 * Math.max(1, Math.abs(x)), `step ${step}, settings ${k}, token ${i}: ${x} vs ${cpu[i]}`));
      });
      out.push(Math.floor(random() * 12)); // repeats, so counts grow past 1
    }
    assert.throws(() => tallies[0]!.list([]), /shrank/);
  });

  test('greedy takes the argmax after penalties; top_k = 1 is greedy at any temperature', () => {
    const r = seededRandom(1);
    assert.equal(sampleNext(logits, { temperature: 0 }, r, [], []), 4);
    assert.equal(sampleNext(logits, { temperature: 0, frequencyPenalty: 2 }, r, [], [4]), 0);
    for (let i = 0; i < 50; i++) assert.equal(sampleNext(logits, { temperature: 5, topK: 1 }, r, [], []), 4);
  });

  test('argmax is the first index of the largest logit, whatever the length, ties and NaNs', () => {
    const naive = (l: Float32Array) => {
      let best = 0;
      for (let i = 1; i < l.length; i++) if (l[i]! > l[best]!) best = i;
      return best;
    };
    const r = seededRandom(7);
    for (let n = 1; n <= 40; n++) {
      for (let k = 0; k < 30; k++) {
        // Few distinct values: the maximum recurs, in any lane, before and after the tail.
        const l = Float32Array.from({ length: n }, () => Math.floor(r() * 4));
        if (k % 5 === 1) l[Math.floor(r() * n)] = NaN;
        if (k % 5 === 2) l[0] = NaN;
        if (k % 5 === 3) l.fill(-Infinity);
        assert.equal(argmax(l), naive(l), `[${[...l]}]`);
      }
    }
    assert.equal(argmax(new Float32Array(0)), 0);
  });

  test('top_k and top_p keep only the head of the distribution', () => {
    const r = seededRandom(2);
    const seen = new Set<number>();
    for (let i = 0; i < 400; i++) seen.add(sampleNext(logits, { temperature: 1, topK: 2 }, r, [], []));
    assert.deepEqual([...seen].sort(), [0, 4]);
    // p(4) = 0.61 at temperature 1: top_p 0.5 keeps it alone, top_p 0.8 adds token 0 (0.22).
    seen.clear();
    for (let i = 0; i < 400; i++) seen.add(sampleNext(logits, { temperature: 1, topP: 0.5 }, r, [], []));
    assert.deepEqual([...seen], [4]);
    seen.clear();
    for (let i = 0; i < 400; i++) seen.add(sampleNext(logits, { temperature: 1, topP: 0.8 }, r, [], []));
    assert.deepEqual([...seen].sort(), [0, 4]);
  });

  test('top_k and top_p draw what a full sort of the vocabulary gives, seed for seed (ties by lower id)', () => {
    /** The candidates by sorting every id, as the sampler did before taking them from a heap. */
    function bySort(l: Float32Array, temperature: number, topK: number, topP: number, random: () => number): number {
      const order = Array.from({ length: l.length }, (_, i) => i).sort((a, b) => l[b]! - l[a]! || a - b).slice(0, topK || l.length);
      const p = order.map((i) => Math.exp((l[i]! - l[order[0]!]!) / temperature));
      let sum = p.reduce((a, b) => a + b, 0);
      let keep = p.length;
      if (topP < 1) {
        let acc = 0;
        for (let i = 0; i < p.length; i++) {
          acc += p[i]! / sum;
          if (acc >= topP) {
            keep = i + 1;
            break;
          }
        }
        sum = p.slice(0, keep).reduce((a, b) => a + b, 0);
      }
      let r = random() * sum;
      for (let i = 0; i < keep; i++) {
        r -= p[i]!;
        if (r <= 0) return order[i]!;
      }
      return order[keep - 1]!;
    }
    const values = seededRandom(11);
    // 4096 logits on a coarse grid, so that many tie.
    const l = Float32Array.from({ length: 4096 }, () => Math.round(values() * 64) / 8);
    for (const [topK, topP] of [[5, 1], [50, 0.9], [0, 0.5], [0, 0.95], [400, 0.99]] as const) {
      const a = seededRandom(5), b = seededRandom(5);
      for (let i = 0; i < 300; i++) {
        const want = bySort(l, 0.7, topK, topP, a);
        assert.equal(sampleNext(l, { temperature: 0.7, topK, topP }, b, [], []), want, `top_k ${topK}, top_p ${topP}, draw ${i}`);
      }
    }
  });
});

describe('incremental detokenization', () => {
  test('never half a UTF-8 character; the deltas add up to the decoded text', () => {
    const tok = model.tokenizer;
    const text = '漢字 and “quotes” — café 🎉 done';
    const ids = tok.encode(text);
    const out = new OutputText(tok);
    const deltas = ids.map((id) => out.push(id));
    deltas.push(out.finish());
    for (const d of deltas) assert.ok(!d.includes('\uFFFD'), JSON.stringify(d));
    assert.ok(deltas.filter((d) => d === '').length >= 3, 'byte tokens inside a character emit nothing until it completes');
    assert.equal(deltas.join(''), tok.decode(ids).trim());
    assert.equal(out.text, deltas.join(''));
  });

  test('a stop sequence split across tokens: held back, then cut', () => {
    const tok = model.tokenizer;
    const ids = tok.encode(' one two three four five');
    const out = new OutputText(tok, ['three f']);
    const deltas: string[] = [];
    for (const id of ids) {
      deltas.push(out.push(id));
      if (out.stopped) break;
    }
    assert.equal(out.stopped, 'three f');
    assert.equal(deltas.join(''), 'one two');
    assert.equal(out.text, 'one two');
  });
});

describe('sampling parameters on the engine', () => {
  test('stop: the output ends before the stop text, finish_reason stop; streamed text agrees', async () => {
    const { engine: e } = engine();
    const full = await e.generate(prompts[0]!, greedy(40));
    // A word from the middle of the greedy answer.
    const words = full.text.split(' ');
    assert.ok(words.length > 6, full.text);
    const stop = ` ${words[4]}`;
    const cut = full.text.slice(0, full.text.indexOf(stop)).trimEnd();
    let streamed = '';
    const g = await e.generate(prompts[0]!, { ...greedy(40), stop: ['never-in-this-text', stop] }, { onToken: (t) => (streamed += t.text) });
    assert.equal(g.text, cut);
    assert.equal(g.finishReason, 'stop');
    assert.equal(streamed, cut);
    assert.deepEqual(g.ids, full.ids.slice(0, g.ids.length), 'the same tokens up to the stop');
    assert.ok(g.ids.length < full.ids.length);
  });

  test('max_tokens bounds the output; finish_reason length', async () => {
    const g = await engine().engine.generate(prompts[1]!, greedy(5));
    assert.equal(g.ids.length, 5);
    assert.equal(g.finishReason, 'length');
  });

  test('top_k = 1 at temperature 1 equals greedy', async () => {
    const { engine: e } = engine();
    for (const p of prompts.slice(0, 2)) {
      const a = await e.generate(p, greedy(20));
      const b = await e.generate(p, { maxNewTokens: 20, temperature: 1, topK: 1, seed: 99 });
      assert.deepEqual(b.ids, a.ids);
    }
  });

  test('seeded sampling is repeatable, differs across seeds, and survives preemption', async () => {
    const params = (seed: number): SamplingParams => ({ maxNewTokens: 20, temperature: 1, topP: 0.95, topK: 50, seed });
    const alone = await Promise.all(prompts.map((p) => engine().engine.generate(p, params(11))));
    const again = await engine().engine.generate(prompts[0]!, params(11));
    assert.deepEqual(again.ids, alone[0]!.ids);
    const other = await engine().engine.generate(prompts[0]!, params(12));
    assert.notDeepEqual(other.ids, alone[0]!.ids);
    // A pool too small for all four at once: the scheduler preempts and recomputes.
    const longest = Math.max(...prompts.map((p) => p.length)) + 20;
    const small = engine(Math.ceil(longest / BS) + 4);
    const batched = await Promise.all(prompts.map((p) => small.engine.generate(p, params(11))));
    assert.ok(small.engine.stats.preemptions > 0, 'the pool forced preemption');
    batched.forEach((g, i) => assert.deepEqual(g.ids, alone[i]!.ids, `prompt ${i}`));
    assert.equal(small.blocks.stats().usedBlocks, 0);
  });

  test('penalties change the greedy choice, the same way every time', async () => {
    const { engine: e } = engine();
    // A prompt that invites repetition: penalties have something to act on.
    const prompt = [1, ...model.tokenizer.encode('The package the package the package the package')];
    const plain = await e.generate(prompt, greedy(30));
    for (const p of [{ repetitionPenalty: 1.5 }, { presencePenalty: 1.5 }, { frequencyPenalty: 2 }]) {
      const a = await e.generate(prompt, { ...greedy(30), ...p });
      const b = await e.generate(prompt, { ...greedy(30), ...p });
      assert.deepEqual(a.ids, b.ids, JSON.stringify(p));
      assert.notDeepEqual(a.ids, plain.ids, JSON.stringify(p));
      // Where they first part, the unpenalized choice was a token the penalty counts: one already
      // generated (or, for the repetition penalty, in the prompt).
      const k = a.ids.findIndex((t, i) => t !== plain.ids[i]);
      const seen = new Set([...('repetitionPenalty' in p ? prompt : []), ...plain.ids.slice(0, k)]);
      assert.ok(seen.has(plain.ids[k]!), `${JSON.stringify(p)}: token ${plain.ids[k]} at ${k}`);
    }
  });
});

describe('cancellation', () => {
  test('an aborted sequence is finished at the next barrier, its blocks freed; the others go on', async () => {
    const { engine: e, blocks } = engine();
    const ac = new AbortController();
    const events: TokenEvent[] = [];
    const aborted = e.generate(prompts[0]!, { maxNewTokens: 200, temperature: 0, ignoreEos: true }, {
      signal: ac.signal,
      onToken: (t) => {
        events.push(t);
        if (events.length === 3) ac.abort();
      },
    });
    const other = e.generate(prompts[1]!, { maxNewTokens: 30, temperature: 0, ignoreEos: true });
    await assert.rejects(aborted, (err: Error) => err.name === 'AbortError');
    // The token of the step that was running when it aborted may still come: no more.
    assert.ok(events.length <= 4, `${events.length} tokens`);
    assert.equal((await other).ids.length, 30);
    await e.idle();
    assert.equal(blocks.stats().usedBlocks, 0);
    // An already aborted signal never enters the engine.
    await assert.rejects(e.generate(prompts[0]!, greedy(5), { signal: AbortSignal.abort() }), (err: Error) => err.name === 'AbortError');
  });

  test('a sequence still waiting for admission is dropped from the queue', async () => {
    const { engine: e, blocks } = engine();
    const ac = new AbortController();
    const first = e.generate(prompts[0]!, greedy(10));
    const queued = e.generate(prompts[1]!, greedy(10), { signal: ac.signal });
    // Aborted once queued, before the loop's first barrier (a microtask away) admits it.
    ac.abort();
    await assert.rejects(queued, (err: Error) => err.name === 'AbortError');
    assert.equal((await first).ids.length > 0, true);
    await e.idle();
    assert.equal(e.scheduler.waiting.length, 0);
    assert.equal(blocks.stats().usedBlocks, 0);
  });
});
