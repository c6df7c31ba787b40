/**
 * LoRA adapters end to end on the CPU: PEFT files read and mapped onto the graph's fused projections,
 * the decoder with an adapter computing what the base model with merged weights (W + scale B A, as
 * PEFT's merge_and_unload makes it) computes, alone and in batches that mix adapters and the base
 * model, and the registry loading once, sharing, and unloading to the byte.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { copyFile, cp, mkdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { before, describe, test } from 'node:test';
import { AdapterBusyError, AdapterInvalidError, AdapterNotFoundError, AdapterRegistry } from '../src/generate/adapters.js';
import { BlockManager } from '../src/generate/block-manager.js';
import { DecoderModel } from '../src/backends/ort/decoder-model.js';
import { type DecoderAdapter } from '../src/generate/lora-pool.js';
import { Engine } from '../src/generate/engine.js';
import { buildGqaDecoder, type GqaSourceConfig } from '../src/backends/ort/convert/gqa-builder.js';
import { loraSlots, planAdapter, slotTensors, writeEntry, type PeftConfig } from '../src/generate/lora.js';
import { halfsToFloats } from '../src/runtime/float16.js';
import { ONNX_FLOAT, readInitializers, writeModel, type Initializer } from '../src/runtime/onnx-proto.js';
import { countingAllocator, installCountingAllocator } from '../src/backends/ort/ort-allocator.js';
import { headerOf, parseHeader, SafetensorsError, tensorValues, writeSafetensors } from '../src/runtime/safetensors.js';
import { ROOT, tempDir } from './helpers.js';
import { ortEngine } from '../src/backends/ort/ort-runner.js';

const ADAPTERS = path.join(ROOT, 'models', 'adapters');
const SHAPE = { numLayers: 4, hiddenSize: 256, numHeads: 8, numKvHeads: 2, headDim: 32, intermediateSize: 768 };
const LIMITS = { maxLoras: 4, maxRank: 16, waitMs: 2000 };

describe('PEFT files onto the graph', () => {
  test('safetensors: a written file reads back; F16 and BF16 widen; a bad header is refused', () => {
    const file = writeSafetensors(new Map([['a', { shape: [2, 3], values: Float32Array.of(1, 2, 3, 4, 5, -6.5) }]]));
    const h = headerOf(file);
    assert.equal(h.dataStart % 8, 0, 'data aligned');
    assert.deepEqual(h.tensors.get('a'), { dtype: 'F32', shape: [2, 3], offsets: [0, 24] });
    assert.deepEqual(Array.from(tensorValues(file, h, ['a']).get('a')!), [1, 2, 3, 4, 5, -6.5]);
    // 1.5 as float16 is 0x3e00, as bfloat16 0x3fc0.
    const halves = new Uint8Array(new Uint16Array([0x3e00, 0x3fc0]).buffer);
    const head = JSON.stringify({ h: { dtype: 'F16', shape: [1], data_offsets: [0, 2] }, b: { dtype: 'BF16', shape: [1], data_offsets: [2, 4] } });
    const bytes = new Uint8Array(8 + head.length + 4);
    new DataView(bytes.buffer).setBigUint64(0, BigInt(head.length), true);
    bytes.set(Buffer.from(head), 8);
    bytes.set(halves, 8 + head.length);
    const v = tensorValues(bytes, headerOf(bytes), ['h', 'b']);
    assert.deepEqual([v.get('h')![0], v.get('b')![0]], [1.5, 1.5]);
    assert.throws(() => parseHeader('{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', 8), SafetensorsError, 'size mismatch');
    assert.throws(() => parseHeader('{"x":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}}', 8), /dtype I8/);
  });

  const tensor = (shape: number[]) => ({ shape });
  const key = (l: number, m: string, ab: 'A' | 'B') => `base_model.model.model.layers.${l}.${m}.lora_${ab}.weight`;

  test('q, k and v fuse into the qkv slot: A concatenated along the rank, B block-diagonal, scaled', () => {
    const cfg: PeftConfig = { peft_type: 'LORA', r: 2, lora_alpha: 4, alpha_pattern: { v_proj: 8 } };
    const shapes = new Map([
      [key(1, 'self_attn.q_proj', 'A'), tensor([2, 256])], [key(1, 'self_attn.q_proj', 'B'), tensor([256, 2])],
      [key(1, 'self_attn.v_proj', 'A'), tensor([1, 256])], [key(1, 'self_attn.v_proj', 'B'), tensor([64, 1])],
    ]);
    const plan = planAdapter(cfg, shapes, SHAPE);
    assert.equal(plan.slots.length, 1);
    const [slot] = plan.slots;
    assert.equal(slot!.slot.a, 'model.layers.1.self_attn.qkv_proj.lora_A');
    assert.deepEqual(slot!.modules.map((m) => [m.module, m.rank, m.scale]), [['self_attn.q_proj', 2, 2], ['self_attn.v_proj', 1, 8]]);
    assert.equal(plan.maxRank, 3);
    assert.equal(plan.elements, 3 * (256 + 256 + 64 + 64));
    const values = new Map<string, Float32Array>();
    for (const [k, t] of shapes) values.set(k, Float32Array.from({ length: t.shape[0]! * t.shape[1]! }, (_, i) => i + 1));
    const [st] = slotTensors(plan, values);
    const out = 384;
    // A [256, 3]: columns 0-1 are q's rows, column 2 v's.
    assert.equal(st!.a[0 * 3 + 0], 1); // q A[0, 0]
    assert.equal(st!.a[5 * 3 + 1], 256 + 6); // q A[1, 5]
    assert.equal(st!.a[7 * 3 + 2], 8); // v A[0, 7]
    // B [3, 384]: rank 0-1 x q's columns (0-255), rank 2 x v's (320-383), k's columns zero; scales folded in.
    assert.equal(st!.b[0 * out + 3], 2 * (3 * 2 + 1)); // q B[3, 0] x 2
    assert.equal(st!.b[2 * out + 320 + 5], 8 * 6); // v B[5, 0] x 8
    assert.ok(st!.b.subarray(0, 3 * out).every((x, i) => (i % out) < 256 || (i % out) >= 320 || x === 0), "k's columns are zero");
    assert.ok(st!.b.subarray(2 * out, 2 * out + 320).every((x) => x === 0), "v's rank row is zero outside v's columns");
  });

  test('rsLoRA scales by alpha / sqrt(r); adapters that do not fit the decoder are refused with why', () => {
    const pair = new Map([[key(0, 'mlp.up_proj', 'A'), tensor([4, 256])], [key(0, 'mlp.up_proj', 'B'), tensor([768, 4])]]);
    assert.equal(planAdapter({ r: 4, lora_alpha: 8, use_rslora: true }, pair, SHAPE).slots[0]!.modules[0]!.scale, 4);
    const refuse = (cfg: PeftConfig, shapes: Map<string, { shape: number[] }>, why: RegExp) => assert.throws(() => planAdapter(cfg, shapes, SHAPE), (e: Error) => e instanceof AdapterInvalidError && why.test(e.message));
    refuse({ use_dora: true }, pair, /DoRA/);
    refuse({ alora_invocation_tokens: [5, 6] }, pair, /alora_invocation_tokens/);
    refuse({ lora_bias: true }, pair, /lora_bias/);
    assert.throws(() => planAdapter({}, pair, SHAPE, 2), /rank 4 exceeds the slots' 2 \(RAGGUARD_MAX_LORA_RANK\)/);
    refuse({ peft_type: 'IA3' }, pair, /only LORA/);
    refuse({}, new Map([[key(0, 'mlp.up_proj', 'A'), tensor([4, 512])], [key(0, 'mlp.up_proj', 'B'), tensor([768, 4])]]), /another base model/);
    refuse({}, new Map([[key(9, 'mlp.up_proj', 'A'), tensor([4, 256])], [key(9, 'mlp.up_proj', 'B'), tensor([768, 4])]]), /no such projection/);
    refuse({}, new Map([[key(0, 'mlp.up_proj', 'A'), tensor([4, 256])]]), /pairs/);
    refuse({}, new Map([['base_model.model.lm_head.weight', tensor([4, 256])]]), /not a LoRA A\/B weight/);
  });

  test('an entry of a slot holds its rank zero-padded to the capacity; an entry without data is zeros', () => {
    // A: [entries 3, in 2, capacity 2]; entry 1 gets a rank-1 [2, 1], entry 2 a rank-2 [2, 2], then zeros.
    const a = new Float32Array(12).fill(9);
    writeEntry(a, 1, 'A', 2, 2, Float32Array.of(1, 2), 1);
    writeEntry(a, 2, 'A', 2, 2, Float32Array.of(3, 4, 5, 6), 2);
    assert.deepEqual(Array.from(a), [9, 9, 9, 9, 1, 0, 2, 0, 3, 4, 5, 6]);
    writeEntry(a, 2, 'A', 2, 2);
    assert.deepEqual(Array.from(a.subarray(8)), [0, 0, 0, 0], 'cleared: a freed entry reused by an adapter that leaves the slot alone');
    // B: [entries 2, capacity 2, out 2]
    const b = new Float32Array(8).fill(9);
    writeEntry(b, 0, 'B', 2, 2, Float32Array.of(1, 2), 1);
    assert.deepEqual(Array.from(b), [1, 2, 0, 0, 9, 9, 9, 9]);
  });
});

/**
 * The shipped decoder with an adapter merged into its weights, W + scale B A per module, computed here
 * from the PEFT files directly (not through lora.ts), built without LoRA inputs.
 */
async function mergedDecoder(adapter: string): Promise<DecoderModel> {
  const src = path.join(ROOT, 'models', 'decoder');
  const cfg = JSON.parse(await readFile(path.join(src, 'config.json'), 'utf8')) as GqaSourceConfig;
  const weights = readInitializers(await readFile(path.join(src, 'onnx', 'model.onnx')));
  const peft = JSON.parse(await readFile(path.join(ADAPTERS, adapter, 'adapter_config.json'), 'utf8')) as Required<Pick<PeftConfig, 'lora_alpha' | 'use_rslora' | 'alpha_pattern'>> & { r: number };
  const file = await readFile(path.join(ADAPTERS, adapter, 'adapter_model.safetensors'));
  const header = headerOf(file);
  const values = tensorValues(file, header, [...header.tensors.keys()]);
  for (const [name, aValues] of values) {
    const m = /layers\.(\d+)\.(\w+\.(\w+))\.lora_A\.weight$/.exec(name);
    if (!m) continue;
    const bValues = values.get(name.replace('lora_A', 'lora_B'))!;
    const [r, inDim] = header.tensors.get(name)!.shape as [number, number];
    const outDim = bValues.length / r;
    const alpha = peft.alpha_pattern[m[3]!] ?? peft.lora_alpha;
    const scale = alpha / (peft.use_rslora ? Math.sqrt(r) : r);
    const baseName = [...weights.keys()].find((k) => k.includes(`layers.${m[1]}.${m[2]}.weight`))!;
    const base = weights.get(baseName)!;
    const raw = new Uint8Array(base.data).buffer;
    const w = base.dataType === ONNX_FLOAT ? new Float32Array(raw) : halfsToFloats(new Uint16Array(raw));
    for (let o = 0; o < outDim; o++) {
      for (let i = 0; i < inDim; i++) {
        let d = 0;
        for (let k = 0; k < r; k++) d += bValues[o * r + k]! * aValues[k * inDim + i]!;
        w[o * inDim + i]! += scale * d;
      }
    }
    weights.delete(baseName);
    const merged: Initializer = { name: baseName.replace(/_fp16$/, ''), dataType: ONNX_FLOAT, dims: base.dims, data: new Uint8Array(w.buffer) };
    weights.set(merged.name, merged);
  }
  const g = buildGqaDecoder(cfg, weights, { lora: false });
  const dir = await tempDir('ragguard-merged-');
  await writeFile(path.join(dir, 'model.onnx'), writeModel({ name: 'merged', ...g, opsets: { '': 17, 'com.microsoft': 1 } }));
  await writeFile(path.join(dir, 'genai_config.json'), JSON.stringify(g.genaiConfig));
  for (const f of ['config.json', 'generation_config.json', 'tokenizer.json', 'tokenizer_config.json']) await copyFile(path.join(src, f), path.join(dir, f));
  return DecoderModel.load(dir, 'cpu');
}

test('PEFT\'s own files give torch\'s logits and greedy ids (scripts/gpu/build_adapters.py made them with PEFT 0.21 on the GPU host)', () => {
  // scripts/check-adapters.ts: the reference prompt through the server's decoder, base and each adapter.
  const out = execFileSync(process.execPath, ['--import', 'tsx', path.join(ROOT, 'scripts', 'check-adapters.ts'), path.join(ROOT, 'test', 'fixtures', 'peft')], { cwd: ROOT, encoding: 'utf8' });
  const r = JSON.parse(out.trim().split('\n').at(-1)!) as Record<string, { max_abs_logit_diff: number; greedy_same: boolean }>;
  for (const name of ['base', 'demo-r8', 'demo-qv-r4']) {
    assert.ok(r[name]!.max_abs_logit_diff < 1e-3, `${name}: ${r[name]!.max_abs_logit_diff}`);
    assert.equal(r[name]!.greedy_same, true, name);
  }
});

describe('the decoder with adapters', () => {
  let model: DecoderModel;
  let registry: AdapterRegistry;
  let prompts: number[][];

  before(async () => {
    installCountingAllocator(); // before any session, as loadModels does
    model = await DecoderModel.load(path.join(ROOT, 'models', 'decoder-gqa'), 'cpu');
    registry = new AdapterRegistry(ADAPTERS, model, LIMITS);
    const tok = model.tokenizer;
    prompts = ['How do I list installed packages?', 'What does the sticky bit do?', 'Where are logs kept?', 'How do I add a user?']
      .map((q, i) => [1, ...tok.encode(`Context:\n[1] note ${i}: ${'some words '.repeat(2 + 3 * i)}\n\nQuestion: ${q}\nAnswer:`)]);
  });

  function engine(m: DecoderModel): Engine {
    const blocks = new BlockManager({ numBlocks: 256, blockSize: 16, watermark: 0.01, enablePrefixCaching: true });
    return ortEngine(m, blocks, { numBlocks: 256, blockSize: 16, maxNumSeqs: 8, maxNumBatchedTokens: 4096 });
  }

  const greedy = (e: Engine, p: number[], adapter?: DecoderAdapter) => e.generate(p, { maxNewTokens: 24, temperature: 0, ignoreEos: true, adapter }).then((g) => g.ids);

  test('the graph has a LoRA pair per projection; without an adapter it is the base model (rank-0 feeds)', () => {
    assert.deepEqual(model.loraSlots?.map((s) => s.a), loraSlots(SHAPE).map((s) => s.a));
    assert.equal(model.loraSlots!.length, 5 * 4);
  });

  test('an adapter computes what its merged weights compute: logits and greedy ids, each shipped adapter', async () => {
    for (const name of ['demo-r8', 'demo-qv-r4']) {
      const merged = await mergedDecoder(name);
      const lease = await registry.acquire(name);
      const width = model.pastWidth([0], prompts[0]!.length);
      const run = (m: DecoderModel, adapter?: DecoderAdapter) =>
        m.forward({ tokens: [prompts[0]!], lengths: [0], past: m.allocPast(1, width), width, adapters: adapter && [adapter] }).then((o) => {
          const logits = Float32Array.from(o.lastLogits);
          for (const t of o.present) t.dispose();
          return logits;
        });
      const viaLora = await run(model, lease.adapter);
      const viaMerged = await run(merged);
      const base = await run(model);
      const maxDiff = Math.max(...viaLora.map((x, i) => Math.abs(x - viaMerged[i]!)));
      const moved = Math.max(...viaLora.map((x, i) => Math.abs(x - base[i]!)));
      assert.ok(maxDiff < 2e-3, `${name}: |lora - merged| = ${maxDiff}`);
      assert.ok(moved > 0.5, `${name}: the adapter changes the logits (by ${moved})`);
      assert.deepEqual(await greedy(engine(model), prompts[1]!, lease.adapter), await greedy(engine(merged), prompts[1]!), name);
      lease.release();
    }
  });

  test('one batch mixing two adapters and the base model gives each row what it gives alone, and leaves nothing', async () => {
    const r8 = await registry.acquire('demo-r8');
    const qv = await registry.acquire('demo-qv-r4');
    const rows = [undefined, r8.adapter, qv.adapter, r8.adapter, undefined];
    const alone: number[][] = [];
    for (const [i, a] of rows.entries()) alone.push(await greedy(engine(model), prompts[i % prompts.length]!, a));
    assert.notDeepEqual(alone[1], alone[0], 'the adapter changes the answer');
    assert.notDeepEqual(alone[2], alone[1], 'the two adapters differ');
    const e = engine(model);
    const together = await Promise.all(rows.map((a, i) => greedy(e, prompts[i % prompts.length]!, a)));
    assert.deepEqual(together, alone);
    assert.ok(e.stats.decodeRows > e.stats.steps, 'rows decoded together');
    // Once the engine idles, its per-row stacks and KV buffers are freed: ONNX Runtime's live bytes are
    // back where they were before the batch.
    await e.idle();
    const live = countingAllocator()!.live();
    const again = engine(model);
    assert.deepEqual(await Promise.all(rows.map((a, i) => greedy(again, prompts[i % prompts.length]!, a))), alone);
    await again.idle();
    assert.equal(countingAllocator()!.live(), live, 'a mixed batch leaves nothing behind');
    r8.release();
    qv.release();
  });

  test('through onnxruntime-node (the path GPU providers take) an adapter gives the direct path\'s outputs', async () => {
    const viaNode = await DecoderModel.load(path.join(ROOT, 'models', 'decoder-gqa'), 'cpu', { direct: false });
    assert.equal(viaNode.runPath.path, 'onnxruntime-node');
    const nodeRegistry = new AdapterRegistry(ADAPTERS, viaNode, LIMITS);
    const [a, b] = [await registry.acquire('demo-r8'), await nodeRegistry.acquire('demo-r8')];
    const [qa, qb] = [await registry.acquire('demo-qv-r4'), await nodeRegistry.acquire('demo-qv-r4')];
    const mixed = async (m: DecoderModel, r8: DecoderAdapter, qv: DecoderAdapter) => {
      const e = engine(m);
      return Promise.all([undefined, r8, qv].map((ad, i) => greedy(e, prompts[i]!, ad)));
    };
    assert.deepEqual(await mixed(viaNode, b.adapter, qb.adapter), await mixed(model, a.adapter, qa.adapter));
    for (const l of [a, b, qa, qb]) l.release();
  });

  test('the registry loads into a preallocated slot once for concurrent requests, and frees it after the last', async () => {
    const counter = countingAllocator()!;
    assert.ok(counter, 'the counting allocator is installed');
    const slots = registry.stats().slots;
    assert.deepEqual([slots.max_loras, slots.max_rank, slots.free], [4, 16, 4]);
    // Every entry of every projection, float32: 5 entries (4 + the zero one) x rank capacity x (in + out).
    const perLayer = 48 * (256 + 384) + 16 * ((256 + 256) + 2 * (256 + 768) + (768 + 256));
    assert.equal(slots.bytes, 5 * 4 * 4 * perLayer);
    const before = counter.live();
    const [a, b] = await Promise.all([registry.acquire('demo-r8'), registry.acquire('demo-r8')]);
    assert.equal(a.adapter, b.adapter, 'one copy shared');
    const s = registry.stats();
    assert.deepEqual(s.loaded.map((l) => [l.name, l.refs]), [['demo-r8', 2]]);
    assert.match(s.loaded[0]!.key, /^demo-r8@[0-9a-f]{16}$/);
    assert.equal(s.slots.free, 3);
    assert.equal(counter.live(), before, 'loading writes into the slots: ONNX Runtime allocates nothing');
    a.release();
    a.release(); // a lease releases once
    assert.equal(registry.stats().loaded.length, 1, 'still held by b');
    b.release();
    assert.deepEqual(registry.stats().loaded, []);
    assert.equal(registry.stats().slots.free, 4);
    assert.equal(counter.live(), before);
    const { loads, unloads } = registry.stats();
    assert.equal(loads, unloads);
  });

  test('with every slot held, a request for another adapter waits for a release, in order, and past the deadline is refused', async () => {
    const dir = await tempDir('ragguard-adapters-');
    for (const n of ['a1', 'a2', 'a3', 'a4', 'a5', 'a6']) await cp(path.join(ADAPTERS, 'demo-qv-r4'), path.join(dir, n), { recursive: true });
    // The order is checked with a deadline no run can reach (10 min), so a loaded machine cannot time a
    // waiter out; the deadline itself, on a second registry, with nothing ever released.
    const r = new AdapterRegistry(dir, model, { ...LIMITS, waitMs: 600_000 });
    const held = await Promise.all(['a1', 'a2', 'a3', 'a4'].map((n) => r.acquire(n)));
    assert.equal(r.stats().slots.free, 0);
    let got5 = false;
    let got6 = false;
    // The queue is in order of arrival at it, after each request has read its adapter's files: a5 is let
    // in line before a6 asks, so that the order checked is the queue's, not the file reads' (a6's read
    // finishing first put it ahead, and the test then waited on a5 forever: the hang seen about 1 run in 5).
    const fifth = r.acquire('a5').then((l) => ((got5 = true), l));
    while (r.stats().waiting < 1) await new Promise((res) => setImmediate(res));
    const sixth = r.acquire('a6').then((l) => ((got6 = true), l));
    while (r.stats().waiting < 2) await new Promise((res) => setImmediate(res));
    assert.deepEqual([got5, got6], [false, false], 'both wait');
    held[0]!.release();
    const l5 = await fifth;
    assert.equal(l5.info.name, 'a5', 'the first in line gets the freed slot');
    assert.equal(got6, false, 'the second still waits');
    assert.equal(r.stats().waiting, 1);
    held[1]!.release();
    const l6 = await sixth;
    assert.equal(l6.info.name, 'a6', 'the next release goes to the next in line');
    const again = await r.acquire('a3'); // loaded: shared, no slot needed
    assert.equal(again.adapter, held[2]!.adapter);
    for (const l of [...held, l5, l6, again]) l.release();
    assert.equal(r.stats().slots.free, 4);
    assert.deepEqual([r.stats().loaded.length, r.stats().waiting], [0, 0]);

    const short = new AdapterRegistry(dir, model, { ...LIMITS, waitMs: 50 });
    const full = await Promise.all(['a1', 'a2', 'a3', 'a4'].map((n) => short.acquire(n)));
    await assert.rejects(short.acquire('a5'), (e: Error) => e instanceof AdapterBusyError && /RAGGUARD_MAX_LORAS/.test(e.message));
    assert.equal(short.stats().waiting, 0, 'the refused waiter left the queue');
    for (const l of full) l.release();
    assert.equal(short.stats().slots.free, 4);
  });

  test('registries on one decoder share its slots: an entry one frees goes to a request waiting on another', async () => {
    const dir = await tempDir('ragguard-adapters-');
    for (const n of ['b1', 'b2', 'b3', 'b4', 'b5']) await cp(path.join(ADAPTERS, 'demo-qv-r4'), path.join(dir, n), { recursive: true });
    const first = new AdapterRegistry(dir, model, { ...LIMITS, waitMs: 600_000 });
    const second = new AdapterRegistry(dir, model, { ...LIMITS, waitMs: 120_000 });
    const held = await Promise.all(['b1', 'b2', 'b3', 'b4'].map((n) => first.acquire(n)));
    const waiting = second.acquire('b5');
    while (second.stats().waiting < 1) await new Promise((res) => setImmediate(res));
    held[0]!.release(); // freed through the first registry: the second's waiter must get it, not its deadline
    const lease = await waiting;
    assert.equal(lease.info.name, 'b5');
    for (const l of [...held.slice(1), lease]) l.release();
    assert.equal(first.stats().slots.free, 4);
  });

  test('inspect knows an adapter\'s bytes before it loads; unknown, malformed and misfit adapters are refused', async () => {
    const info = await registry.inspect('demo-r8');
    // r 8 on every projection of 4 layers, float32; q, k and v fused: rank 24 over [256 in, 384 out].
    const perLayer = 24 * (256 + 384) + 8 * ((256 + 256) + 2 * (256 + 768) + (768 + 256));
    assert.equal(info.bytes, 4 * 4 * perLayer);

    assert.equal(info.maxRank, 24, 'q, k and v fused');
    await assert.rejects(registry.acquire('no-such-adapter'), AdapterNotFoundError);
    await assert.rejects(registry.acquire('../decoder'), AdapterNotFoundError);
    const dir = await tempDir('ragguard-adapters-');
    await mkdir(path.join(dir, 'wide'));
    await writeFile(path.join(dir, 'wide', 'adapter_config.json'), JSON.stringify({ peft_type: 'LORA', r: 2, lora_alpha: 2 }));
    await writeFile(path.join(dir, 'wide', 'adapter_model.safetensors'), writeSafetensors(new Map([
      ['base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight', { shape: [2, 512], values: new Float32Array(1024) }],
      ['base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight', { shape: [512, 2], values: new Float32Array(1024) }],
    ])));
    await mkdir(path.join(dir, 'junk'));
    await writeFile(path.join(dir, 'junk', 'adapter_config.json'), '{}');
    await writeFile(path.join(dir, 'junk', 'adapter_model.safetensors'), 'not safetensors');
    const other = new AdapterRegistry(dir, model, LIMITS);
    await assert.rejects(other.acquire('wide'), (e: Error) => e instanceof AdapterInvalidError && /another base model/.test(e.message));
    await assert.rejects(other.acquire('junk'), AdapterInvalidError);
    assert.deepEqual(other.stats().loaded, []);
    assert.match(new AdapterRegistry('', model, LIMITS).unavailable, /RAGGUARD_ADAPTER_DIR/);
  });
});
