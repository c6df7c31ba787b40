/**
 * The CUDA backend's pure parts, on the CPU (CI has no GPU; scripts/check-cuda.ts checks the device
 * against torch on the GPU host): the packed step the kernels read (slot mapping from block tables),
 * graph buckets, the device accountant's plan, Hugging Face checkpoints mapped onto the fused weights
 * (and refused where they would load into another model), rotary tables with scaling, and the engine
 * driving a runner it knows only by the ModelRunner interface.
 */
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { cudaBackend, cudaUnavailable } from '../src/backends/cuda/binding.js';
import { CudaModelRunner, CudaUnavailableError, deviceSampling } from '../src/backends/cuda/cuda-runner.js';
import { CheckpointError, openCheckpoint, parseConfig, placeTensor, WeightKind, weightElems } from '../src/backends/cuda/hf-checkpoint.js';
import { ropeInvFreq, UnsupportedRopeError } from '../src/backends/cuda/rope.js';
import { bucketFor, graphBuckets, kvBytesPerToken, maskWords, maxPenaltyEntries, packStep, planDevice, stepWords } from '../src/backends/cuda/step-pack.js';
import { BlockManager } from '../src/generate/block-manager.js';
import { Engine } from '../src/generate/engine.js';
import type { KvPoolInfo, ModelRunner, RunnerStep, StepSink } from '../src/generate/model-runner.js';
import type { Sequence } from '../src/generate/sequence.js';
import { writeSafetensors } from '../src/runtime/safetensors.js';
import { sampleNext, type SamplerSettings } from '../src/generate/sampler.js';
import { compileSchema, validates } from '../src/generate/structured/json-schema.js';
import { TokenGrammar, TokenVocabulary } from '../src/generate/structured/token-mask.js';
import { standInCuda, standInLogits, TINY, tinyTensors, writeTinyCheckpoint } from './cuda-standin.js';

const tiny = TINY;

describe('packed steps', () => {
  test('tokens, positions and slots follow each sequence\'s block table; per-sequence arrays and tables after', () => {
    const words = packStep([
      { tokens: [7, 8, 9], start: 0, blocks: [5], sampling: { temperature: 0, topK: 0, topP: 1, seed: 1, step: 0 } },
      { tokens: [4], start: 17, blocks: [2, 9], sampling: { temperature: 0.5, topK: 40, topP: 0.9, seed: 2 ** 33 + 3, step: 6 } },
    ], 16);
    const T = 4, S = 2, W = 2;
    assert.deepEqual([...words.subarray(0, 3)], [T, S, W]);
    assert.equal(words.length, stepWords(T, S, W));
    const at = (k: number) => words.subarray(4 + k * T, 4 + (k + 1) * T);
    assert.deepEqual([...at(0)], [7, 8, 9, 4]); // ids
    assert.deepEqual([...at(1)], [0, 1, 2, 17]); // positions
    assert.deepEqual([...at(2)], [80, 81, 82, 9 * 16 + 1]); // slots: block 5 slot 0..2; position 17 = block 9 slot 1
    assert.deepEqual([...at(3)], [0, 0, 0, 1]); // token -> sequence
    const seq = (k: number) => [...words.subarray(4 + 4 * T + k * S, 4 + 4 * T + (k + 1) * S)];
    assert.deepEqual(seq(0), [3, 18]); // context lengths after the step
    assert.deepEqual(seq(1), [2, 3]); // each sequence's last token: the one sampled after
    assert.deepEqual(seq(2), [0, 40]);
    assert.deepEqual(seq(3), [1, 3]); // seed, low word
    assert.deepEqual(seq(4), [0, 2]); // seed, high word
    assert.deepEqual(seq(5), [0, 6]);
    const f = new Float32Array(words.buffer);
    assert.deepEqual([f[4 + 4 * T + 6 * S], f[4 + 4 * T + 6 * S + 1]], [0, 0.5]);
    assert.ok(Math.abs(f[4 + 4 * T + 7 * S + 1]! - 0.9) < 1e-7);
    assert.deepEqual(seq(8), [0, 0]); // no adapter: the base model
    assert.deepEqual(seq(14), [0, 0]); // no token mask
    assert.deepEqual([...words.subarray(4 + 4 * T + 15 * S)], [5, 0, 2, 9]); // tables padded to W
    assert.equal(words[3], 0); // no penalty entries
    assert.deepEqual([9, 10, 11, 12, 13].map(seq), [[0, 0], [0, 0], [0, 0], [0, 0], [0, 0]]);
  });

  test('penalty entries follow the tables, each row pointing at its own', () => {
    const plain = { temperature: 0, topK: 0, topP: 1, seed: 1, step: 0 };
    const words = packStep([
      { tokens: [7], start: 3, blocks: [5], sampling: { ...plain, penalties: { repetition: 1.5, presence: 0.25, frequency: 0.5, tokens: [7, 3, 9], counts: [2, 0, 1] } } },
      { tokens: [4], start: 0, blocks: [2], sampling: plain },
      { tokens: [6], start: 0, blocks: [1], sampling: { ...plain, penalties: { repetition: 1, presence: -1, frequency: 0, tokens: [6], counts: [1] } } },
    ], 16);
    const T = 3, S = 3, W = 1, P = 4;
    assert.equal(words.length, stepWords(T, S, W, P));
    assert.equal(words[3], P);
    const seq = (k: number) => [...words.subarray(4 + 4 * T + k * S, 4 + 4 * T + (k + 1) * S)];
    const f = (k: number) => [...new Float32Array(words.buffer, (4 + 4 * T + k * S) * 4, S)];
    assert.deepEqual(f(9), [1.5, 0, 1]);
    assert.deepEqual(f(10), [0.25, 0, -1]);
    assert.deepEqual(f(11), [0.5, 0, 0]);
    assert.deepEqual(seq(12), [0, 0, 3]); // where each row's entries start
    assert.deepEqual(seq(13), [3, 0, 1]); // and how many
    const tail = 4 + 4 * T + 15 * S + S * W;
    assert.deepEqual([...words.subarray(tail, tail + P)], [7, 3, 9, 6]);
    assert.deepEqual([...words.subarray(tail + P)], [2, 0, 1, 1]);
  });

  test('token masks follow the penalty entries, each masked row pointing at its own (1-based; 0: none)', () => {
    const plain = { temperature: 0, topK: 0, topP: 1, seed: 1, step: 0 };
    const m1 = Uint32Array.of(0b1010, 0xffffffff), m2 = Uint32Array.of(1, 0x80000000);
    const words = packStep([
      { tokens: [7], start: 0, blocks: [5], sampling: { ...plain, penalties: { repetition: 1.5, presence: 0, frequency: 0, tokens: [7], counts: [1] } }, mask: m1 },
      { tokens: [4], start: 0, blocks: [2], sampling: plain },
      { tokens: [6], start: 0, blocks: [1], sampling: plain, mask: m2 },
    ], 16);
    const T = 3, S = 3, W = 1, P = 1;
    assert.equal(words.length, stepWords(T, S, W, P, 4));
    assert.deepEqual([...words.subarray(4 + 4 * T + 14 * S, 4 + 4 * T + 15 * S)], [1, 0, 2]);
    const masks = 4 + 4 * T + 15 * S + S * W + 2 * P;
    assert.deepEqual([...new Uint32Array(words.buffer, masks * 4, 4)], [0b1010, 0xffffffff, 1, 0x80000000]);
    assert.throws(() => packStep([{ tokens: [1], start: 0, blocks: [0], sampling: plain, mask: m1 }, { tokens: [1], start: 0, blocks: [0], sampling: plain, mask: Uint32Array.of(1) }], 16), /different widths/);
  });

  test('a block table too short for the positions is refused', () => {
    assert.throws(() => packStep([{ tokens: [1, 2], start: 15, blocks: [0], sampling: deviceSampling({ maxNewTokens: 1, temperature: 0 }, 0) }], 16), /cannot hold 17 positions/);
  });

  test('graph buckets are 1, 2, 4 and multiples of 8; a decode replays the smallest that holds it', () => {
    assert.deepEqual(graphBuckets(32), [1, 2, 4, 8, 16, 24, 32]);
    assert.deepEqual(graphBuckets(3), [1, 2]);
    assert.equal(bucketFor(graphBuckets(32), 5), 8);
    assert.equal(bucketFor(graphBuckets(32), 32), 32);
    assert.equal(bucketFor(graphBuckets(32), 33), undefined);
  });
});

describe('device accountant', () => {
  test('the plan counts every weight once, the pool by blocks, and the workspace from the step limits', () => {
    const c = parseConfig(tiny);
    const limits = { numBlocks: 10, blockSize: 16, maxBatchedTokens: 32, maxSeqs: 4, maxBlocksPerSeq: 4, cublasWorkspaceBytes: 1 << 20 };
    const p = planDevice(c, 'float16', limits);
    // tied: no lm_head; each weight rounded up to 256 bytes
    const r = (n: number) => Math.ceil((n * 2) / 256) * 256;
    const per = r(8) * 2 + r((2 * 4 + 2 * 4) * 8) + r(16) + r(8 * 8) + r(2 * 12 * 8) + r(8 * 12);
    assert.equal(p.weights, r(32 * 8) + r(8) + 2 * per);
    assert.equal(kvBytesPerToken(c, 'bfloat16'), 2 * 2 * 1 * 4 * 2);
    assert.equal(p.kvPool, 10 * 16 * kvBytesPerToken(c, 'float16'));
    assert.equal(p.cublasWorkspace, 1 << 20);
    assert.equal(p.total, p.weights + p.kvPool + p.workspace + p.cublasWorkspace + 2 * 4);
    // The pool is sized by blocks, never by max_position_embeddings.
    const longer = planDevice(parseConfig({ ...tiny, max_position_embeddings: 131072 }), 'float16', limits);
    assert.equal(longer.kvPool, p.kvPool);
    assert.equal(longer.workspace, p.workspace);
    assert.ok(planDevice(c, 'float16', { ...limits, maxBatchedTokens: 64 }).workspace > p.workspace);
  });

  test('the step staging holds every row\'s penalty entries: at most its positions, at most the vocabulary', () => {
    const c = parseConfig(tiny); // vocab 32
    const limits = { numBlocks: 10, blockSize: 16, maxBatchedTokens: 32, maxSeqs: 4, maxBlocksPerSeq: 1, cublasWorkspaceBytes: 0 };
    assert.equal(maxPenaltyEntries(4, 1, 16, 32), 4 * 16); // positions bound
    assert.equal(maxPenaltyEntries(4, 4, 16, 32), 4 * 32); // vocabulary bound
    const p = planDevice(c, 'float16', limits);
    assert.equal(p.hostPinned, (stepWords(32, 4, 1, 4 * 16, 4 * maskWords(32)) + 4) * 4, 'the pinned staging: the largest step, penalties and token masks included, and the sampled ids');
    // The largest packed step fits it: every row with a penalty list of its whole table's positions.
    const full = packStep(Array.from({ length: 4 }, (_, r) => ({
      tokens: [r], start: 15, blocks: [r],
      sampling: { temperature: 0, topK: 0, topP: 1, seed: 0, step: 0, penalties: { repetition: 1.2, presence: 0, frequency: 0, tokens: Array.from({ length: 16 }, (_, i) => i), counts: new Array<number>(16).fill(1) } },
    })), 16);
    assert.ok(full.length * 4 <= p.hostPinned - 4 * 4);
    // A longer table (more positions a row) grows the staging until the vocabulary bounds it.
    assert.ok(planDevice(c, 'float16', { ...limits, maxBlocksPerSeq: 2 }).workspace > p.workspace);
  });
});

describe('Hugging Face checkpoints', () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'ragguard-hf-'));
  });
  after(() => rm(dir, { recursive: true, force: true }));

  const c = parseConfig(tiny);

  test('q, k and v go side by side into one projection, gate and up into another', () => {
    assert.deepEqual(placeTensor(c, 'model.layers.1.self_attn.k_proj.weight'), { kind: WeightKind.qkv, layer: 1, dstOffset: 8 * 8, shape: [4, 8] });
    assert.deepEqual(placeTensor(c, 'model.layers.1.self_attn.v_proj.weight'), { kind: WeightKind.qkv, layer: 1, dstOffset: 12 * 8, shape: [4, 8] });
    assert.deepEqual(placeTensor(c, 'model.layers.0.self_attn.v_proj.bias'), { kind: WeightKind.qkvBias, layer: 0, dstOffset: 12, shape: [4] });
    assert.deepEqual(placeTensor(c, 'model.layers.0.mlp.up_proj.weight'), { kind: WeightKind.gateUp, layer: 0, dstOffset: 12 * 8, shape: [12, 8] });
    assert.equal(weightElems(c, WeightKind.qkv), 16 * 8);
    assert.equal(placeTensor(c, 'lm_head.weight'), null); // tied: the embedding serves
    assert.throws(() => placeTensor(c, 'model.layers.0.self_attn.o_proj.bias'), /no place/);
    assert.throws(() => placeTensor(c, 'model.layers.5.input_layernorm.weight'), /past num_hidden_layers/);
  });

  test('a sharded checkpoint is planned tensor by tensor, with file offsets', async () => {
    const all = [...tinyTensors()];
    const half = Math.floor(all.length / 2);
    await writeFile(path.join(dir, 'a.safetensors'), writeSafetensors(new Map(all.slice(0, half))));
    await writeFile(path.join(dir, 'b.safetensors'), writeSafetensors(new Map(all.slice(half))));
    const map = Object.fromEntries(all.map(([n], i) => [n, i < half ? 'a.safetensors' : 'b.safetensors']));
    await writeFile(path.join(dir, 'model.safetensors.index.json'), JSON.stringify({ weight_map: map }));
    await writeFile(path.join(dir, 'config.json'), JSON.stringify(tiny));
    const ck = await openCheckpoint(dir);
    assert.equal(ck.loads.length, all.length);
    assert.equal(ck.fileBytes, all.reduce((s, [, t]) => s + t.values.byteLength, 0));
    const k = ck.loads.find((l) => l.name === 'model.layers.1.self_attn.k_proj.weight')!;
    assert.equal(path.basename(k.file), 'b.safetensors');
    assert.deepEqual([k.kind, k.layer, k.dstOffset, k.count, k.dtype], [WeightKind.qkv, 1, 64, 32, 'F32']);
    assert.deepEqual([...ck.config.eosIds], [2]);
  });

  test('a missing or misshapen tensor is refused by name', async () => {
    const d2 = await mkdtemp(path.join(tmpdir(), 'ragguard-hf-'));
    try {
      await writeFile(path.join(d2, 'config.json'), JSON.stringify(tiny));
      const t = tinyTensors();
      t.delete('model.layers.1.mlp.down_proj.weight');
      await writeFile(path.join(d2, 'model.safetensors'), writeSafetensors(t));
      await assert.rejects(openCheckpoint(d2), /lacks 1 tensors, e.g. 'model.layers.1.mlp.down_proj.weight'/);
      t.set('model.layers.1.mlp.down_proj.weight', { shape: [12, 8], values: new Float32Array(96) });
      await writeFile(path.join(d2, 'model.safetensors'), writeSafetensors(t));
      await assert.rejects(openCheckpoint(d2), /down_proj.weight': shape \[12, 8\], expected \[8, 12\]/);
    } finally {
      await rm(d2, { recursive: true, force: true });
    }
  });

  test('what the backend cannot run as the checkpoint means it is refused, never converted into another model', () => {
    assert.throws(() => parseConfig({ ...tiny, model_type: 'gemma' }), CheckpointError);
    assert.throws(() => parseConfig({ ...tiny, use_sliding_window: true }), /sliding-window/);
    assert.throws(() => parseConfig({ ...tiny, model_type: 'llama', attention_bias: true }), /attention_bias/);
    assert.throws(() => parseConfig({ ...tiny, rope_scaling: { rope_type: 'yarn', factor: 4 } }), UnsupportedRopeError);
    assert.throws(() => parseConfig({ ...tiny, hidden_act: 'gelu' }), /hidden_act/);
    // transformers 5's rope_parameters carry the theta and the scaling.
    const p = parseConfig({ ...tiny, rope_theta: undefined, rope_parameters: { rope_type: 'linear', factor: 2, rope_theta: 500 } });
    assert.equal(p.ropeTheta, 500);
    assert.equal(p.ropeScaling?.rope_type, 'linear');
    assert.equal(parseConfig({ ...tiny, model_type: 'llama' }).qkvBias, false);
  });
});

describe('rotary tables', () => {
  test('default, linear and llama3 scaling as transformers computes them', () => {
    const base = ropeInvFreq(128, 500000);
    assert.equal(base[0], 1);
    assert.ok(Math.abs(base[1]! - Math.fround(1 / Math.pow(500000, 2 / 128))) < 1e-12);
    const lin = ropeInvFreq(128, 500000, { rope_type: 'linear', factor: 4 });
    assert.ok(lin.every((f, i) => Math.abs(f - base[i]! / 4) < 1e-12));
    const l3 = ropeInvFreq(128, 500000, { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192 });
    // High frequencies (wavelength under 8192/4) unchanged, low ones (over 8192) divided by 8, the rest between.
    base.forEach((f, i) => {
      const wl = (2 * Math.PI) / f;
      if (wl < 2048) assert.equal(l3[i], f);
      else if (wl > 8192) assert.ok(Math.abs(l3[i]! - f / 8) <= 1e-6 * f);
      else assert.ok(l3[i]! < f && l3[i]! > f / 8);
    });
    assert.throws(() => ropeInvFreq(64, 10000, { rope_type: 'dynamic', factor: 2 }), /not supported/);
  });
});

describe('without CUDA', () => {
  test('the backend says why it is unavailable, and loading a model fails with that reason', async () => {
    if (cudaBackend() !== null) return; // a machine with a GPU and the library built: scripts/check-cuda.ts covers it
    assert.match(cudaUnavailable(), /not built|no CUDA device/);
    await assert.rejects(CudaModelRunner.load('/nonexistent', { numBlocks: 1, blockSize: 16, maxBatchedTokens: 16, maxSeqs: 1 }), CudaUnavailableError);
  });
});

/**
 * A runner that "generates" token (last + 1) mod vocab on the device's side of the interface: the
 * engine, scheduler and block manager must drive it exactly as they drive the ONNX runner.
 */
class CountingRunner implements ModelRunner {
  readonly shape = { numLayers: 1, hiddenSize: 8, numHeads: 1, intermediateSize: 8, numKvHeads: 1, headDim: 8, vocabSize: 100, maxPositions: 512, kvDtype: 'float16' as const };
  readonly eosIds = new Set<number>([99]);
  readonly tokenizer = { decode: (ids: readonly number[]) => ids.join(' ') };
  readonly pool: KvPoolInfo = { bytes: 0, numBlocks: 64, blockSize: 4, bytesPerSlot: 0, location: 'device' };
  readonly steps: { decodes: number; prefills: number[] }[] = [];
  copies = 0;
  async barrier(): Promise<void> {}
  async syncPool(): Promise<void> {}
  copyBlocks(c: readonly { src: number; dst: number }[]): void {
    this.copies += c.length;
  }
  async execute(step: RunnerStep, sink: StepSink): Promise<void> {
    this.steps.push({ decodes: step.decodes.length, prefills: step.prefills.map((s) => s.pending.length) });
    for (const seq of [...step.decodes, ...step.prefills]) {
      const fed = step.decodes.includes(seq) ? 1 : seq.pending.length;
      assert.ok(step.blocks(seq).length * 4 >= seq.numComputed + fed, 'the block table covers every token fed');
      const last = seq.pending.at(-1)!;
      const reason = sink.accept(seq, fed, (last + 1) % 100);
      if (reason) sink.finish(seq, reason);
    }
  }
  abandon(): Sequence[] {
    return [];
  }
}

test('the engine drives any ModelRunner: batches, limits, end of sequence, replies', async () => {
  const runner = new CountingRunner();
  const blocks = new BlockManager({ numBlocks: 64, blockSize: 4, watermark: 0.01, enablePrefixCaching: true });
  const engine = new Engine(runner, blocks, { numBlocks: 64, blockSize: 4, maxNumSeqs: 8, maxNumBatchedTokens: 256 });
  const [a, b, c] = await Promise.all([
    engine.generate([1, 2, 3], { maxNewTokens: 4, temperature: 0 }),
    engine.generate([10, 11], { maxNewTokens: 2, temperature: 0 }),
    engine.generate([95, 96], { maxNewTokens: 10, temperature: 0 }),
  ]);
  assert.deepEqual(a.ids, [4, 5, 6, 7]);
  assert.equal(a.text, '4 5 6 7');
  assert.equal(a.finishReason, 'length');
  assert.deepEqual(b.ids, [12, 13]);
  assert.deepEqual(c.ids, [97, 98]); // 99 is end of sequence
  assert.equal(c.finishReason, 'stop');
  assert.deepEqual(runner.steps[0], { decodes: 0, prefills: [3, 2, 2] });
  assert.ok(runner.steps.slice(1).every((s) => s.prefills.length === 0 && s.decodes > 0));
  await engine.idle();
  assert.equal(blocks.stats().usedBlocks, 0, 'every block is back');
  assert.equal(engine.pool.location, 'device');
});

/**
 * The CUDA runner's own logic (decodes then packed prefills, chunked long prompts, graph buckets, the
 * plan check) on the CPU, over a stand-in for the native library whose "model" answers each sequence
 * with (its last token + 1) mod vocab, read back from the packed step as the kernels read it.
 */
describe('the CUDA runner over a stand-in native library', () => {
  let dir: string;
  const fake = standInCuda(tiny);
  const steps = fake.steps;

  before(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'ragguard-cudarun-'));
    await writeTinyCheckpoint(dir);
  });
  after(() => rm(dir, { recursive: true, force: true }));

  test('closed-loop requests at 1 and 8 concurrent all complete, decodes batched, long prompts chunked', async () => {
    const runner = await CudaModelRunner.load(dir, { numBlocks: 64, blockSize: 4, maxBatchedTokens: 8, maxSeqs: 8 }, fake);
    for (const c of [1, 8]) {
      const blocks = new BlockManager({ numBlocks: 64, blockSize: 4, watermark: 0.01, enablePrefixCaching: false });
      const engine = new Engine(runner, blocks, { numBlocks: 64, blockSize: 4, maxNumSeqs: c, maxNumBatchedTokens: 8 });
      const prompts = Array.from({ length: 12 }, (_, i) => [3 + (i % 5), 4, 5 + i].slice(0, 1 + (i % 3)));
      const outs: number[][] = [];
      let next = 0;
      const worker = async () => {
        while (next < prompts.length) {
          const i = next++;
          outs[i] = (await engine.generate(prompts[i]!, { maxNewTokens: 5, temperature: 0, ignoreEos: true })).ids;
        }
      };
      await Promise.all(Array.from({ length: c }, worker));
      outs.forEach((ids, i) => {
        const last = prompts[i]!.at(-1)!;
        assert.deepEqual(ids, [1, 2, 3, 4, 5].map((k) => (last + k) % 32));
      });
      await engine.idle();
      assert.equal(blocks.stats().usedBlocks, 0);
    }
    // A prompt longer than max_batched_tokens (8) runs in chunks; only the last chunk's token counts.
    steps.length = 0;
    const blocks = new BlockManager({ numBlocks: 64, blockSize: 4, watermark: 0.01, enablePrefixCaching: false });
    const engine = new Engine(runner, blocks, { numBlocks: 64, blockSize: 4, maxNumSeqs: 2, maxNumBatchedTokens: 64 });
    const long = Array.from({ length: 19 }, (_, i) => i + 1);
    const g = await engine.generate(long, { maxNewTokens: 2, temperature: 0, ignoreEos: true });
    assert.deepEqual(g.ids, [20, 21]);
    assert.deepEqual(steps.slice(0, 3).map(({ T, S }) => ({ T, S })), [{ T: 8, S: 1 }, { T: 8, S: 1 }, { T: 3, S: 1 }]);
    runner.close();
  });

  test('constrained rows take their token masks to the device sampler, beside free rows in the same steps', async () => {
    const runner = await CudaModelRunner.load(dir, { numBlocks: 64, blockSize: 4, maxBatchedTokens: 16, maxSeqs: 4 }, fake);
    // A 32-token vocabulary of JSON's characters, every one the schema needs (id 2: EOS, as TINY says).
    const texts = ['a', 'b', undefined, '{', '}', '"', 'k', ':', '1', '2', ',', ' ', '[', ']', 'x', 'y', '3', '"k"', '0', 'z', 'true', 'n', 'u', 'l', '-', '.', 'e', 'f', 'r', 's', 't', 'o'];
    const vocab = new TokenVocabulary(32, texts, [2]);
    const schema = { type: 'object', properties: { k: { type: 'integer' }, ok: { type: 'boolean' } }, required: ['k'], additionalProperties: false };
    const grammar = new TokenGrammar(compileSchema(schema), vocab);
    steps.length = 0;
    const blocks = new BlockManager({ numBlocks: 64, blockSize: 4, watermark: 0.01, enablePrefixCaching: false });
    const engine = new Engine(runner, blocks, { numBlocks: 64, blockSize: 4, maxNumSeqs: 4, maxNumBatchedTokens: 16 });
    const [constrained, free] = await Promise.all([
      engine.generate([3, 4], { maxNewTokens: 64, temperature: 0, grammar }),
      engine.generate([5], { maxNewTokens: 6, temperature: 0, ignoreEos: true }),
    ]);
    assert.equal(constrained.finishReason, 'stop', constrained.text);
    assert.ok(validates(JSON.parse(constrained.text), schema), constrained.text);
    // The free row answers as the stand-in's model does, unmasked.
    assert.deepEqual(free.ids, [6, 7, 8, 9, 10, 11]);
    assert.ok(steps.some((s) => s.S === 2), 'a constrained and a free row in one step');
    runner.close();
  });

  test('penalties run on the device sampler: the same choices as the CPU sampler makes from the same logits', async () => {
    const runner = await CudaModelRunner.load(dir, { numBlocks: 64, blockSize: 4, maxBatchedTokens: 16, maxSeqs: 4 }, fake);
    assert.equal(runner.refuse({ maxNewTokens: 4, temperature: 0, frequencyPenalty: 0.5 }), undefined);
    const blocks = new BlockManager({ numBlocks: 64, blockSize: 4, watermark: 0.01, enablePrefixCaching: false });
    const engine = new Engine(runner, blocks, { numBlocks: 64, blockSize: 4, maxNumSeqs: 4, maxNumBatchedTokens: 16 });
    // The CPU sampler over the stand-in's logits, token by token: what the device must choose.
    const expected = (prompt: number[], s: SamplerSettings, n: number): number[] => {
      const out: number[] = [];
      for (let i = 0; i < n; i++) out.push(sampleNext(standInLogits([...prompt, ...out].at(-1)!, 0, 32), s, () => 0, prompt, out));
      return out;
    };
    // Prompt tokens the model would continue with (repetition), and negative presence and frequency
    // penalties, which raise what was generated over the model's choice (a positive one lowers every
    // token of this cyclic model alike), in one batch with an unpenalized row.
    const cases: { prompt: number[]; s: SamplerSettings }[] = [
      { prompt: [5, 6, 7, 4], s: { temperature: 0, repetitionPenalty: 2 } },
      { prompt: [1], s: { temperature: 0, presencePenalty: -1.5 } },
      { prompt: [1], s: { temperature: 0, frequencyPenalty: -0.6, presencePenalty: 0.3 } },
      { prompt: [9, 10], s: { temperature: 0 } },
    ];
    const got = await Promise.all(cases.map((c) => engine.generate(c.prompt, { ...c.s, maxNewTokens: 40, ignoreEos: true })));
    cases.forEach((c, i) => assert.deepEqual(got[i]!.ids, expected(c.prompt, c.s, 40), JSON.stringify(c)));
    // The penalties changed something in each penalized row (or this test shows nothing).
    const plain = (p: number[]) => expected(p, { temperature: 0 }, 40);
    for (const c of cases.slice(0, 3)) assert.notDeepEqual(expected(c.prompt, c.s, 40), plain(c.prompt));
    assert.deepEqual(got[3]!.ids, plain([9, 10]));
    await engine.idle();
    runner.close();
  });
});

test('a request made as the last one settles is served (no request stranded between the loop\'s last check and its end)', async () => {
  // However many microtask turns after a reply the next request comes, it is served.
  for (let hops = 0; hops < 12; hops++) {
    const runner = new CountingRunner();
    const blocks = new BlockManager({ numBlocks: 64, blockSize: 4, watermark: 0.01, enablePrefixCaching: false });
    const engine = new Engine(runner, blocks, { numBlocks: 64, blockSize: 4, maxNumSeqs: 1, maxNumBatchedTokens: 64 });
    await engine.generate([10], { maxNewTokens: 2, temperature: 0, ignoreEos: true });
    for (let h = 0; h < hops; h++) await Promise.resolve();
    const next = engine.generate([20], { maxNewTokens: 2, temperature: 0, ignoreEos: true });
    const served = await Promise.race([next.then((g) => g.ids), engine.idle().then(() => next).then((g) => g.ids)]);
    assert.deepEqual(served, [21, 22], `after ${hops} turns`);
    assert.equal(engine.scheduler.waiting.length, 0);
  }
});
