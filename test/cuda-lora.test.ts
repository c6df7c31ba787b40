/**
 * LoRA adapters on the CUDA backend, on the CPU (scripts/check-cuda.ts compares the device with
 * transformers + peft on the GPU host): the accountant's figures for the device slots, each sequence's
 * adapter entry in the packed step, and the adapter registry driving the CUDA runner's slots through a
 * stand-in native library: PEFT files written into an entry slot by slot (rank zero-padded, untouched
 * slots zeroed), steps that mix adapter and base rows, entries freed and reused, prefix-cache blocks kept
 * apart per adapter.
 */
import assert from 'node:assert/strict';
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { before, describe, test } from 'node:test';
import type { CudaBackend } from '../src/backends/cuda/binding.js';
import { cudaLoraPool, LORA_PROJECTIONS } from '../src/backends/cuda/cuda-lora.js';
import { CudaModelRunner } from '../src/backends/cuda/cuda-runner.js';
import { parseConfig } from '../src/backends/cuda/hf-checkpoint.js';
import { loraSlotBytes, packStep, planDevice, SEQ_ARRAYS, stepWords, type DeviceLimits } from '../src/backends/cuda/step-pack.js';
import { AdapterRegistry, type AdapterHost } from '../src/generate/adapters.js';
import { BlockManager } from '../src/generate/block-manager.js';
import { Engine } from '../src/generate/engine.js';
import { loraSlots } from '../src/generate/lora.js';
import type { SamplingParams } from '../src/generate/sequence.js';
import { writeSafetensors } from '../src/runtime/safetensors.js';
import { tempDir } from './helpers.js';
import { standInCuda, TINY, tinyTensors } from './cuda-standin.js';

const tiny = TINY;
const tinyCheckpoint = tinyTensors;


/** The shared stand-in (its "model" adds 10 x the row's LoRA entry), as this file's tests take it. */
function standIn(opts: { omitLoraFromPlan?: boolean } = {}) {
  const native = standInCuda(tiny, opts);
  return { native, writes: native.writes, steps: native.steps, config: () => native.created };
}

describe('device LoRA slots in the accountant', () => {
  const c = parseConfig(tiny);
  const base: DeviceLimits = { numBlocks: 10, blockSize: 16, maxBatchedTokens: 32, maxSeqs: 4, maxBlocksPerSeq: 4, cublasWorkspaceBytes: 1 << 20 };

  test('max_loras + 1 entries of every projection\'s A and B, in the model dtype, plus the shrink\'s float32 scratch', () => {
    const r = (n: number) => Math.ceil(n / 256) * 256;
    const E = 4, R = 4, e = 2; // 3 adapters + the zero entry, rank 4, 2-byte elements
    // qkv: in 8, capacity 3R (q, k, v side by side), out 8+4+4; o: 8 -> 8; gate, up: 8 -> 12; down: 12 -> 8.
    const perLayer = r(E * 8 * 3 * R * e) + r(E * 3 * R * 16 * e) + r(E * 8 * R * e) + r(E * R * 8 * e) +
      2 * (r(E * 8 * R * e) + r(E * R * 12 * e)) + r(E * 12 * R * e) + r(E * R * 8 * e);
    assert.equal(loraSlotBytes(c, 'bfloat16', 3, R), 2 * perLayer);
    const without = planDevice(c, 'float16', base);
    const withSlots = planDevice(c, 'float16', { ...base, maxLoras: 3, maxLoraRank: R });
    assert.equal(without.lora, 0);
    assert.equal(withSlots.lora, 2 * perLayer);
    assert.equal(withSlots.workspace - without.workspace, r(32 * 3 * R * 4), 'shrink output [max_batched_tokens, 3 x rank] float32');
    assert.equal(withSlots.total - without.total, 2 * perLayer + r(32 * 3 * R * 4));
    assert.equal(withSlots.weights, without.weights);
    assert.equal(withSlots.kvPool, without.kvPool);
    // No slots asked for: nothing allocated, whatever the rank says.
    assert.equal(planDevice(c, 'float16', { ...base, maxLoras: 0, maxLoraRank: 16 }).total, without.total);
    // The slot order the native side carves and rg_lora_write indexes: lora.ts's, projection by projection.
    assert.deepEqual(loraSlots(c).slice(0, 5).map((s) => s.projection), LORA_PROJECTIONS);
  });

  test('each sequence\'s adapter entry goes into the step, base rows 0', () => {
    const sampling = { temperature: 0, topK: 0, topP: 1, seed: 1, step: 0 };
    const words = packStep([
      { tokens: [7, 8], start: 0, blocks: [5], sampling, lora: 2 },
      { tokens: [4], start: 3, blocks: [1], sampling },
      { tokens: [9], start: 0, blocks: [3], sampling, lora: 1 },
    ], 16);
    const T = 4, S = 3, W = 1;
    assert.equal(words.length, stepWords(T, S, W));
    assert.deepEqual([...words.subarray(4 + 4 * T + 8 * S, 4 + 4 * T + 9 * S)], [2, 0, 1]);
    assert.deepEqual([...words.subarray(4 + 4 * T + SEQ_ARRAYS * S)], [5, 1, 3], 'block tables after the per-sequence arrays');
  });
});

describe('the adapter registry over the CUDA runner (stand-in native library)', () => {
  let model: string;
  let adapters: string;
  const key = (l: number, m: string, ab: 'A' | 'B') => `base_model.model.model.layers.${l}.${m}.lora_${ab}.weight`;
  const SCALE = 2; // lora_alpha 4 / r 2

  before(async () => {
    model = await tempDir('ragguard-cudalora-');
    await writeFile(path.join(model, 'config.json'), JSON.stringify(tiny));
    await writeFile(path.join(model, 'model.safetensors'), writeSafetensors(tinyCheckpoint()));
    adapters = await tempDir('ragguard-cudalora-adapters-');
    // 'qv': q and v of layer 0 at rank 2 (values index-coded so a misplaced one shows), up of layer 1.
    const t = new Map<string, { shape: number[]; values: Float32Array }>();
    const coded = (shape: number[], base: number) => ({ shape, values: Float32Array.from({ length: shape[0]! * shape[1]! }, (_, i) => base + i) });
    t.set(key(0, 'self_attn.q_proj', 'A'), coded([2, 8], 100));
    t.set(key(0, 'self_attn.q_proj', 'B'), coded([8, 2], 200));
    t.set(key(0, 'self_attn.v_proj', 'A'), coded([2, 8], 300));
    t.set(key(0, 'self_attn.v_proj', 'B'), coded([4, 2], 400));
    t.set(key(1, 'mlp.up_proj', 'A'), coded([2, 8], 500));
    t.set(key(1, 'mlp.up_proj', 'B'), coded([12, 2], 600));
    for (const name of ['qv', 'other']) {
      await mkdir(path.join(adapters, name));
      await writeFile(path.join(adapters, name, 'adapter_config.json'), JSON.stringify({ peft_type: 'LORA', r: 2, lora_alpha: 4 }));
    }
    await writeFile(path.join(adapters, 'qv', 'adapter_model.safetensors'), writeSafetensors(t));
    // 'other': only layer 1's down_proj.
    await writeFile(path.join(adapters, 'other', 'adapter_model.safetensors'), writeSafetensors(new Map([
      [key(1, 'mlp.down_proj', 'A'), coded([2, 12], 1)], [key(1, 'mlp.down_proj', 'B'), coded([8, 2], 2)],
    ])));
  });

  const load = (native: CudaBackend, maxLoras = 2) =>
    CudaModelRunner.load(model, { numBlocks: 64, blockSize: 4, maxBatchedTokens: 16, maxSeqs: 8, maxLoras, maxLoraRank: 4 }, native);

  test('slots are made at load and both plans must count them; without slots adapters are refused', async () => {
    const s = standIn();
    const runner = await load(s.native);
    assert.deepEqual([s.config()!.max_loras, s.config()!.max_lora_rank], [2, 4]);
    assert.equal(runner.loraSlots?.length, 2 * 5);
    assert.equal(runner.loraPoolFor(2, 4).bytes, runner.plan.lora);
    assert.ok(runner.plan.lora > 0);
    assert.throws(() => runner.loraPoolFor(3, 4), /2 x rank 4, not 3 x 4/);
    await assert.rejects(load(standIn({ omitLoraFromPlan: true }).native), /device plan mismatch/);

    const plain = await CudaModelRunner.load(model, { numBlocks: 64, blockSize: 4, maxBatchedTokens: 16, maxSeqs: 8 }, standIn().native);
    assert.equal(plain.loraSlots, null);
    assert.equal(plain.plan.lora, 0);
    const registry = new AdapterRegistry(adapters, plain, { maxLoras: 2, maxRank: 4, waitMs: 1000 });
    assert.match(registry.unavailable, /no LoRA inputs/);
    const lease = await new AdapterRegistry(adapters, runner, { maxLoras: 2, maxRank: 4, waitMs: 1000 }).acquire('qv');
    assert.match(plain.refuse({ maxNewTokens: 1, temperature: 0, adapter: lease.adapter }) ?? '', /no LoRA slots/);
    assert.equal(runner.refuse({ maxNewTokens: 1, temperature: 0, adapter: lease.adapter }), undefined);
    lease.release();
    assert.match(runner.refuse({ maxNewTokens: 1, temperature: 0, adapter: lease.adapter }) ?? '', /not resident/);
  });

  test('loading writes every slot of a free entry: the adapter\'s rank-padded, the others zeroed', async () => {
    const s = standIn();
    const runner = await load(s.native);
    const registry = new AdapterRegistry(adapters, runner, { maxLoras: 2, maxRank: 4, waitMs: 1000 });
    const lease = await registry.acquire('qv');
    assert.equal(lease.adapter.entry, 1);
    assert.equal(s.writes.length, 2 * 5, 'one write per slot');
    assert.ok(s.writes.every((w) => w.entry === 1));
    const at = (layer: number, p: string) => s.writes.find((w) => w.layer === layer && LORA_PROJECTIONS[w.projection] === p)!;
    for (const w of s.writes) {
      const written = (w.layer === 0 && w.projection === 0) || (w.layer === 1 && LORA_PROJECTIONS[w.projection] === 'mlp.up_proj');
      assert.equal(w.a !== null, written, `layer ${w.layer} ${LORA_PROJECTIONS[w.projection]}`);
    }
    // qkv: capacity 3 x 4; A [8, 12] holds q's A^T in columns 0-1, v's in 2-3 (k has none), zeros after.
    const qkv = at(0, 'self_attn.qkv_proj');
    assert.equal(qkv.a!.length, 8 * 12);
    assert.deepEqual([...qkv.a!.subarray(0, 12)], [100, 108, 300, 308, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert.deepEqual([...qkv.a!.subarray(12 * 7, 12 * 7 + 4)], [107, 115, 307, 315]);
    // B [12, 16], scaled: row 0 = q's B column 0 into q's 8 outputs, then zeros for k and v.
    assert.equal(qkv.b!.length, 12 * 16);
    assert.deepEqual([...qkv.b!.subarray(0, 16)], [...[0, 2, 4, 6, 8, 10, 12, 14].map((i) => SCALE * (200 + i)), ...new Array<number>(8).fill(0)]);
    // Row 2 = v's B column 0 into v's 4 outputs (columns 12-15).
    assert.deepEqual([...qkv.b!.subarray(2 * 16, 3 * 16)], [...new Array<number>(12).fill(0), ...[0, 2, 4, 6].map((i) => SCALE * (400 + i))]);
    assert.ok(qkv.b!.subarray(4 * 16).every((x) => x === 0), 'rank padding is zeros');
    const up = at(1, 'mlp.up_proj');
    assert.deepEqual([up.a!.length, up.b!.length], [8 * 4, 4 * 12]);
    assert.deepEqual([...up.a!.subarray(0, 4)], [500, 508, 0, 0]);

    // Unloading frees the entry and writes nothing; the next adapter takes it and overwrites every slot.
    lease.release();
    assert.equal(s.writes.length, 10, 'unloading touches no device memory');
    assert.equal(registry.stats().slots.free, 2);
    const other = await registry.acquire('other');
    assert.equal(other.adapter.entry, 1, 'the freed entry is reused');
    const second = s.writes.slice(10);
    assert.equal(second.length, 10);
    assert.deepEqual(second.filter((w) => w.a).map((w) => [w.layer, LORA_PROJECTIONS[w.projection]]), [[1, 'mlp.down_proj']]);
    assert.ok(second.filter((w) => w.layer === 0 && w.projection === 0).every((w) => w.a === null && w.b === null), 'qv\'s old qkv weights zeroed');
    other.release();
  });

  test('one step mixes rows of different adapters and base rows; prefix-cache blocks are per adapter', async () => {
    const s = standIn();
    const runner = await load(s.native);
    const registry = new AdapterRegistry(adapters, runner, { maxLoras: 2, maxRank: 4, waitMs: 1000 });
    const [qv, other] = [await registry.acquire('qv'), await registry.acquire('other')];
    assert.deepEqual([qv.adapter.entry, other.adapter.entry], [1, 2]);
    const blocks = new BlockManager({ numBlocks: 64, blockSize: 4, watermark: 0.01, enablePrefixCaching: true });
    const engine = new Engine(runner, blocks, { numBlocks: 64, blockSize: 4, maxNumSeqs: 8, maxNumBatchedTokens: 16 });
    const greedy: SamplingParams = { maxNewTokens: 3, temperature: 0, ignoreEos: true };
    const [base, withQv, withOther] = await Promise.all([
      engine.generate([3, 4, 5], greedy),
      engine.generate([3, 4, 5], { ...greedy, adapter: qv.adapter }),
      engine.generate([6, 7], { ...greedy, adapter: other.adapter }),
    ]);
    assert.deepEqual(base.ids, [6, 7, 8]);
    assert.deepEqual(withQv.ids, [16, 27, 6], '+11 a token (mod 32): entry 1');
    assert.deepEqual(withOther.ids, [28, 17, 6], '+21 a token: entry 2');
    assert.ok(s.steps.some((st) => st.lora.includes(0) && st.lora.includes(1) && st.lora.includes(2)), 'base and both adapters in one step');
    // The same 8-token prompt (two full blocks) with and without an adapter: no shared KV between them.
    const prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9];
    const first = await engine.generate(prompt, greedy);
    const adapted = await engine.generate(prompt, { ...greedy, adapter: qv.adapter });
    const again = await engine.generate(prompt, { ...greedy, adapter: qv.adapter });
    assert.equal(first.cachedTokens ?? 0, 0);
    assert.equal(adapted.cachedTokens ?? 0, 0, 'the base model\'s blocks are not the adapter\'s');
    assert.equal(again.cachedTokens, 8, 'the adapter\'s own blocks are reused');
    assert.deepEqual(again.ids, adapted.ids);
    await engine.idle();
    qv.release();
    other.release();
    assert.equal(registry.stats().slots.free, 2);
    // Every sequence decoded with its own entry from the first step to the last.
    assert.ok(s.steps.every((st) => st.lora.every((e) => e >= 0 && e <= 2)));
  });

  test('a pool made before the runner (the server builds its registry first) is bound by the runner created with it', async () => {
    const c = parseConfig(tiny);
    const pool = cudaLoraPool(c, 'float16', 2, 4);
    const host: AdapterHost = { loraSlots: loraSlots(c), shape: { ...c, kvDtype: 'float16' }, loraPoolFor: () => pool };
    const registry = new AdapterRegistry(adapters, host, { maxLoras: 2, maxRank: 4, waitMs: 1000 });
    await assert.rejects(registry.acquire('qv'), /not allocated yet/);
    assert.equal(registry.stats().slots.free, 2, 'the refused load took no entry');
    const opts = { numBlocks: 64, blockSize: 4, maxBatchedTokens: 16, maxSeqs: 8 };
    await assert.rejects(CudaModelRunner.load(model, { ...opts, maxLoras: 3, loraPool: pool }, standIn().native), /differ from the LoRA pool's 2 x 4/);
    assert.equal(pool.bound, false);
    const s = standIn();
    const runner = await CudaModelRunner.load(model, { ...opts, loraPool: pool }, s.native);
    assert.deepEqual([s.config()!.max_loras, s.config()!.max_lora_rank], [2, 4], 'the pool sets the slots');
    assert.equal(runner.plan.lora, pool.bytes);
    assert.equal(runner.loraPoolFor(2, 4), pool);
    const lease = await registry.acquire('qv');
    assert.equal(s.writes.length, 10, 'written through the runner\'s engine');
    const blocks = new BlockManager({ numBlocks: 64, blockSize: 4, watermark: 0.01, enablePrefixCaching: false });
    const engine = new Engine(runner, blocks, { numBlocks: 64, blockSize: 4, maxNumSeqs: 8, maxNumBatchedTokens: 16 });
    assert.deepEqual((await engine.generate([3], { maxNewTokens: 2, temperature: 0, ignoreEos: true, adapter: lease.adapter })).ids, [14, 25]);
    lease.release();
    await assert.rejects(CudaModelRunner.load(model, { ...opts, loraPool: pool }, standIn().native), /bound already/);
  });
});
