/**
 * The converted graph of a quantized GGUF decoder, as Qwen2.5-Coder-0.5B's Q4_K_M file mixes its types
 * (Q5_0 and Q8_0 projections, Q4_K and Q6_K down projections, a Q8_0 head, q/k/v biases), built from
 * random stored blocks:
 *
 * - the head is a MatMulNBits whose output is the logits (8-bit, as Q8_0 stores it), never a float copy;
 * - 8-bit products take no zero-point input (Q5_0 and Q6_K stored against the default 128), 4-bit
 *   ones do;
 * - q/k/v's biases are MatMulNBits' bias input, and a layer's Q5_0 and Q8_0 q/k/v are one product;
 * - gate and up are one product, split after;
 * - with ragguard's kernels the products are QMatMul8 and QMatMul4 on the same blocks (16 columns side
 *   by side), computing the same;
 * - and the graph computes the model: its logits against the same weights dequantized to float32
 *   (the dequant mode's graph), greedy ids equal, within the int8 activations' error, with a LoRA
 *   adapter on the fused gate and up too.
 */
import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { test } from 'node:test';
import * as ort from 'onnxruntime-node';
import { qmatmul4Layout, qmatmul8Layout } from '../src/backends/ort/qmatmul-layout.js';
import { toBlocks } from '../src/backends/ort/convert/gguf-weights.js';
import { buildGqaDecoder, gqaOpsets, type CpuKernels, type GqaGraph, type GqaSourceConfig, type WeightSource } from '../src/backends/ort/convert/gqa-builder.js';
import { loraSlots } from '../src/generate/lora.js';
import { dequantize, GGML, rowBytes } from '../src/runtime/gguf.js';
import { writeModel } from '../src/runtime/onnx-proto.js';
import { DirectSession, type HostTensor } from '../src/backends/ort/ort-direct.js';
import { seededRandom } from '../src/generate/sampler.js';
import { tempDir } from './helpers.js';

const H = 256;
const I = 512;
const V = 300;
const cfg: GqaSourceConfig = {
  model_type: 'qwen2', vocab_size: V, hidden_size: H, intermediate_size: I, num_hidden_layers: 2, num_attention_heads: 4,
  num_key_value_heads: 2, head_dim: 64, rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: 64,
};

/** An f16 near `x` (normal halves only), little-endian. */
function half(x: number): [number, number] {
  const u = new Uint32Array(new Float32Array([x]).buffer)[0]!;
  const e = ((u >> 23) & 0xff) - 127 + 15;
  const h = ((u >> 16) & 0x8000) | (e << 10) | ((u >> 13) & 0x3ff);
  return [h & 0xff, h >> 8];
}

/** Random stored blocks of `type` for `n` rows of `k`, with small f16 scales where the type keeps them. */
function stored(type: number, n: number, k: number, r: () => number): Uint8Array {
  const out = new Uint8Array(n * rowBytes(type, k));
  for (let i = 0; i < out.length; i++) out[i] = Math.floor(r() * 256);
  const layout: Record<number, { bytes: number; halves: number[] }> = {
    [GGML.Q5_0]: { bytes: 22, halves: [0] }, [GGML.Q8_0]: { bytes: 34, halves: [0] },
    [GGML.Q4_K]: { bytes: 144, halves: [0, 2] }, [GGML.Q6_K]: { bytes: 210, halves: [208] },
  };
  const { bytes, halves } = layout[type]!;
  for (let b = 0; b < out.length / bytes; b++) {
    for (const h of halves) out.set(half(0.004 + r() * 0.004), b * bytes + h);
  }
  return out;
}

/** A GGUF-like source: each module's stored type, blocks through toBlocks, floats dequantized. */
/** `mixedQkv`: layer 0's v in Q4_K beside q and k in Q5_0 (8 bits as stored): q/k/v of two block forms, as Q4_K_M has in some layers. */
function source(seed: number, mixedQkv = false): WeightSource {
  const r = seededRandom(seed);
  const tensors = new Map<string, { type: number; n: number; k: number; raw: Uint8Array }>();
  const floats = new Map<string, Float32Array>();
  const put = (name: string, type: number, n: number, k: number) => tensors.set(name, { type, n, k, raw: stored(type, n, k, r) });
  put('model.embed_tokens.weight', GGML.Q5_0, V, H);
  put('lm_head.weight', GGML.Q8_0, V, H);
  floats.set('model.norm.weight', Float32Array.from({ length: H }, () => 1 + (r() - 0.5) * 0.2));
  for (let l = 0; l < 2; l++) {
    const p = `model.layers.${l}`;
    put(`${p}.self_attn.q_proj.weight`, GGML.Q5_0, H, H);
    put(`${p}.self_attn.k_proj.weight`, GGML.Q5_0, 128, H);
    // Q8_0 in one layer, Q5_0 in the other: Q4_K_M's mix.
    put(`${p}.self_attn.v_proj.weight`, l === 0 ? (mixedQkv ? GGML.Q4_K : GGML.Q8_0) : GGML.Q5_0, 128, H);
    put(`${p}.self_attn.o_proj.weight`, GGML.Q5_0, H, H);
    put(`${p}.mlp.gate_proj.weight`, GGML.Q5_0, I, H);
    put(`${p}.mlp.up_proj.weight`, GGML.Q5_0, I, H);
    put(`${p}.mlp.down_proj.weight`, l === 0 ? GGML.Q4_K : GGML.Q6_K, H, I);
    for (const [m, n] of [['q', H], ['k', 128], ['v', 128]] as const) {
      floats.set(`${p}.self_attn.${m}_proj.bias`, Float32Array.from({ length: n }, () => (r() - 0.5) * 0.5));
    }
    floats.set(`${p}.input_layernorm.weight`, Float32Array.from({ length: H }, () => 1 + (r() - 0.5) * 0.2));
    floats.set(`${p}.post_attention_layernorm.weight`, Float32Array.from({ length: H }, () => 1 + (r() - 0.5) * 0.2));
  }
  return {
    floats: (name) => {
      const t = tensors.get(name);
      return t ? dequantize(t.type, t.raw, t.n * t.k) : floats.get(name);
    },
    blocks: (name) => {
      const t = tensors.get(name);
      return t && name !== 'model.embed_tokens.weight' ? toBlocks(t.type, t.raw, t.n, t.k) : undefined;
    },
    rows: (name) => tensors.get(name)?.n ?? floats.get(name)?.length,
  };
}

const byOutput = (g: GqaGraph, name: string) => g.nodes.find((n) => n.outputs.includes(name));
const initializer = (g: GqaGraph, name: string) => g.initializers.find((t) => t.name === name);

test('the head is an 8-bit MatMulNBits writing the logits; 8-bit products take no zero points, 4-bit ones do; every product quantizes x to int8', () => {
  const g = buildGqaDecoder(cfg, source(1), { weights: 'nbits', rotary: {} });
  const head = byOutput(g, 'logits')!;
  assert.equal(head.op, 'MatMulNBits');
  assert.deepEqual(head.attrs?.['bits'], { int: 8 });
  assert.deepEqual(head.attrs?.['N'], { int: V });
  assert.equal(g.initializers.some((t) => t.name === 'lm_head.weight'), false, 'no float copy of the head');
  const products = g.nodes.filter((n) => n.op === 'MatMulNBits');
  for (const n of products) {
    const bits = (n.attrs?.['bits'] as { int: number }).int;
    const zp = n.inputs[3];
    if (bits === 8) assert.ok(zp === undefined || zp === '', `${n.outputs[0]}: 8-bit with a zero-point input`);
    else assert.ok(zp && initializer(g, zp), `${n.outputs[0]}: 4-bit without zero points`);
    assert.deepEqual(n.attrs?.['accuracy_level'], { int: 4 });
  }
  // The layer with a Q4_K down projection has one 4-bit product; every other product is 8-bit.
  assert.equal(products.filter((n) => (n.attrs?.['bits'] as { int: number }).int === 4).length, 1);
});

test('q/k/v one product with its bias inside (Q5_0 beside Q8_0), gate and up one product split after', () => {
  const g = buildGqaDecoder(cfg, source(2), { weights: 'nbits', rotary: {} });
  for (let l = 0; l < 2; l++) {
    const p = `model.layers.${l}`;
    const qkv = byOutput(g, `${p}.qkv_base`)!;
    assert.equal(qkv.op, 'MatMulNBits', `layer ${l}: q/k/v are one product`);
    assert.deepEqual(qkv.attrs?.['N'], { int: H + 256 });
    assert.equal(qkv.inputs[5], `${p}.self_attn.qkv_proj.bias`);
    assert.equal(initializer(g, qkv.inputs[5]!)!.dims[0], H + 256);
    assert.equal(g.nodes.some((n) => n.op === 'Add' && n.outputs.includes(`${p}.qkv_base`)), false);
    const split = byOutput(g, `${p}.gate_base`)!;
    assert.equal(split.op, 'Split');
    assert.deepEqual(split.outputs, [`${p}.gate_base`, `${p}.up_base`]);
    const gateUp = byOutput(g, split.inputs[0]!)!;
    assert.equal(gateUp.op, 'MatMulNBits');
    assert.deepEqual(gateUp.attrs?.['N'], { int: 2 * I });
  }
});

/** Last-position logits of `ids` through graph `g` (an empty KV cache; LoRA slots given in `lora`, the others rank 0). */
async function logits(g: GqaGraph, ids: number[], lora: ReadonlyMap<string, ort.Tensor> = new Map()): Promise<Float32Array> {
  const model = writeModel({ name: 't', ...g, opsets: { '': 17, 'com.microsoft': 1 } });
  const s = await ort.InferenceSession.create(model);
  try {
    const feeds: Record<string, ort.Tensor> = {
      input_ids: new ort.Tensor('int64', BigInt64Array.from(ids, BigInt), [1, ids.length]),
      attention_mask: new ort.Tensor('int64', new BigInt64Array(ids.length).fill(1n), [1, ids.length]),
      lora_index: new ort.Tensor('int64', new BigInt64Array(1), [1]),
    };
    for (let l = 0; l < 2; l++) {
      for (const kv of ['key', 'value']) feeds[`past_key_values.${l}.${kv}`] = new ort.Tensor('float32', new Float32Array(2 * 16 * 64), [1, 2, 16, 64]);
    }
    for (const slot of loraSlots({ numLayers: 2, hiddenSize: H, numHeads: 4, numKvHeads: 2, headDim: 64, intermediateSize: I })) {
      feeds[slot.a] = lora.get(slot.a) ?? new ort.Tensor('float32', new Float32Array(0), [1, slot.inDim, 0]);
      feeds[slot.b] = lora.get(slot.b) ?? new ort.Tensor('float32', new Float32Array(0), [1, 0, slot.outDim]);
    }
    const out = await s.run(feeds);
    return Float32Array.from(out['logits']!.data as Float32Array);
  } finally {
    await s.release();
  }
}

test("each layer's LoRA gathers read a row index made from the layer's input, so they cannot run (and be held) before their layer", () => {
  // On graph inputs alone ONNX Runtime ran many layers' gathers of A and B early and held them: about 28 MiB
  // at once on Qwen2.5-Coder-1.5B that the memory model's one-projection term does not count.
  for (const ops of [undefined, 'ragguard'] as const) {
    const g = buildGqaDecoder(cfg, source(3), { weights: 'nbits', rotary: {}, ...(ops ? { ops } : {}) });
    const producer = new Map(g.nodes.flatMap((n) => n.outputs.map((o) => [o, n] as const)));
    const ancestors = (name: string, seen = new Set<string>()): Set<string> => {
      for (const i of producer.get(name)?.inputs ?? []) {
        if (i && !seen.has(i)) {
          seen.add(i);
          ancestors(i, seen);
        }
      }
      return seen;
    };
    const gathers = g.nodes.filter((n) => n.op === 'Gather' && /\.lora_[AB]$/.test(n.inputs[0]!));
    assert.equal(gathers.length, 2 * loraSlots({ numLayers: cfg.num_hidden_layers, hiddenSize: H, numHeads: cfg.num_attention_heads, numKvHeads: cfg.num_key_value_heads!, headDim: cfg.head_dim!, intermediateSize: I }).length);
    for (const n of gathers) {
      const l = Number(/^model\.layers\.(\d+)\./.exec(n.inputs[0]!)![1]);
      const input = l === 0 ? 'h0' : `model.layers.${l - 1}.h`;
      const from = ancestors(n.inputs[1]!);
      assert.ok(from.has(input), `${n.inputs[0]} (ops ${ops ?? 'default'}): its index depends on ${input}`);
      assert.ok(from.has('lora_index'), `${n.inputs[0]}: and on the rows' entries`);
    }
  }
});

test('the quantized graph computes the same model as its weights dequantized to float32, with and without LoRA', async () => {
  const src = source(3);
  const r = seededRandom(4);
  // An adapter on layer 0's gate and up (rank 2, each its own): the fused product's split feeds each its own path.
  const adapter = new Map<string, ort.Tensor>();
  for (const [m, scale] of [['gate', 0.6], ['up', 1.0]] as const) {
    adapter.set(`model.layers.0.mlp.${m}_proj.lora_A`, new ort.Tensor('float32', Float32Array.from({ length: H * 2 }, () => (r() - 0.5) * scale), [1, H, 2]));
    adapter.set(`model.layers.0.mlp.${m}_proj.lora_B`, new ort.Tensor('float32', Float32Array.from({ length: 2 * I }, () => (r() - 0.5) * scale), [1, 2, I]));
  }
  const prompts: [number[], ReadonlyMap<string, ort.Tensor>][] = [[[1, 17, 42, 99, 250], new Map()], [[7, 7, 200], new Map()], [[150, 3, 88, 12, 64, 5, 299], adapter], [[1, 17, 42, 99, 250], adapter]];
  for (const [ids, lora] of prompts) {
    const q = await logits(buildGqaDecoder(cfg, src, { weights: 'nbits', rotary: {} }), ids, lora);
    const f = await logits(buildGqaDecoder(cfg, src, { weights: 'dequant', rotary: {} }), ids, lora);
    const argmax = (x: Float32Array) => x.reduce((best, v, i) => (v > x[best]! ? i : best), 0);
    assert.equal(argmax(q), argmax(f), `greedy id of ${ids}`);
    const spread = Math.max(...f) - Math.min(...f);
    const worst = q.reduce((m, v, i) => Math.max(m, Math.abs(v - f[i]!)), 0);
    // int8 activations in the 8-bit products: a few hundredths of the logits' range; a wrong zero
    // point, a lost bias or gate and up swapped move them by the range itself.
    assert.ok(worst < 0.05 * spread, `${ids}: logits differ by ${worst} (range ${spread})`);
    if (lora.size) {
      // The adapter moves the logits by far more than the products' error: a path on the wrong split is seen.
      const base = await logits(buildGqaDecoder(cfg, src, { weights: 'dequant', rotary: {} }), ids);
      const moved = f.reduce((m, v, i) => Math.max(m, Math.abs(v - base[i]!)), 0);
      assert.ok(moved > 0.3 * spread, `${ids}: the adapter moves the logits by ${moved} only (range ${spread})`);
    }
  }
});

test("with ragguard's kernels every product is a QMatMul8 (8 bits) or QMatMul4 (4 bits) on the same blocks, and the graph computes what MatMulNBits' does", async () => {
  const src = source(5);
  const ort8 = buildGqaDecoder(cfg, src, { weights: 'nbits', rotary: {} });
  const ours = buildGqaDecoder(cfg, src, { weights: 'nbits', ops: 'ragguard', rotary: {} });
  const products = ort8.nodes.filter((n) => n.op === 'MatMulNBits');
  assert.ok(products.some((n) => (n.attrs?.['bits'] as { int: number }).int === 4) && products.some((n) => (n.attrs?.['bits'] as { int: number }).int === 8));
  assert.equal(ours.nodes.filter((n) => n.op === 'MatMulNBits').length, 0, 'no MatMulNBits left');
  let withMins = 0;
  let withLora = 0;
  for (const n of products) {
    const bits = (n.attrs?.['bits'] as { int: number }).int;
    const name = n.inputs[1]!.replace(/\.qweight$/, '');
    // Beside MatMulNBits a product with a min term writes `${out}_q` and one with a LoRA path `${out}_base`,
    // each term added by nodes after it; QMatMul4 has the min in its offsets, takes the LoRA term inside,
    // and writes `out` itself.
    const target = n.outputs[0]!.replace(/_q$/, '');
    // (the gate-and-up product takes the MLP's activation: activation 1, writing `act`, SwiGlu's terms after the LoRA term's places)
    const glu = target.endsWith('.gate_up');
    const m = (byOutput(ours, target) ?? byOutput(ours, target.replace(/_base$/, '')) ?? (glu ? byOutput(ours, target.replace(/gate_up$/, 'act')) : undefined))!;
    assert.equal(m.op, `QMatMul${bits}`);
    assert.equal(m.domain, 'ragguard');
    assert.deepEqual(m.attrs?.['activation'], glu ? { int: 1 } : undefined);
    // x, the blocks, the scales, (4 bits) the offsets; then the bias where MatMulNBits had one (its sixth
    // input), and x A and B where it had a LoRA path ('' where absent)
    const lora = target.endsWith('_base') ? [`${name}.lora_xa`, `${name}.lora_b_rows`] : [];
    const layer = name.replace(/\.mlp\.gate_up_proj$/, '');
    const terms = glu ? [`${layer}.mlp.gate_proj.lora_xa`, `${layer}.mlp.gate_proj.lora_b_rows`, `${layer}.mlp.up_proj.lora_xa`, `${layer}.mlp.up_proj.lora_b_rows`] : [];
    const tail = [n.inputs[5] ?? '', ...(lora.length ? lora : terms.length ? ['', ''] : []), ...terms];
    while (tail.at(-1) === '') tail.pop();
    assert.deepEqual(m.inputs, [...n.inputs.slice(0, 3), ...(bits === 4 ? [`${name}.offsets`] : []), ...tail]);
    if (n.outputs[0]!.endsWith('_q')) withMins++;
    if (lora.length) withLora++;
    for (const a of ['K', 'N', 'block_size']) assert.deepEqual(m.attrs?.[a], n.attrs?.[a]);
    // the same values, scales and zero points, 16 columns side by side (qmatmul-layout.ts)
    const [qOrt, dOrt] = [initializer(ort8, n.inputs[1]!)!, initializer(ort8, n.inputs[2]!)!];
    const blocks = { n: qOrt.dims[0]!, k: (n.attrs?.['K'] as { int: number }).int, blockSize: (n.attrs?.['block_size'] as { int: number }).int, data: qOrt.data, scales: new Float32Array(dOrt.data.slice().buffer) };
    // (the min, where the blocks have one: the min term's [blocks, n] initializer, back to [n, blocks])
    const minsT = initializer(ort8, `${name}.mins`);
    let mins: Float32Array | undefined;
    if (minsT) {
      const t = new Float32Array(minsT.data.slice().buffer);
      const nb = blocks.k / blocks.blockSize;
      mins = Float32Array.from({ length: blocks.n * nb }, (_, i) => t[(i % nb) * blocks.n + Math.floor(i / nb)]!);
    }
    const packed = bits === 8 ? qmatmul8Layout(blocks) : qmatmul4Layout({ ...blocks, zeroPoints: initializer(ort8, n.inputs[3]!)!.data, ...(mins ? { mins } : {}) });
    assert.deepEqual(initializer(ours, m.inputs[1]!)!.data, packed.q);
    assert.deepEqual(initializer(ours, m.inputs[2]!)!.data, new Uint8Array(packed.scales.buffer));
    if ('offsets' in packed) assert.deepEqual(initializer(ours, m.inputs[3]!)!.data, new Uint8Array((packed.offsets as Float32Array).buffer));
  }
  assert.ok(withMins > 0 && withLora > 0, 'products with a min term and with a LoRA path are among them');
  // no node left of the terms the products take
  assert.equal(ours.nodes.filter((n) => n.outputs[0]!.endsWith('.x_block_sums')).length, 0, 'no min-term nodes');
  assert.equal(ours.nodes.filter((n) => n.outputs[0]!.endsWith('.lora_xab')).length, 0, 'no LoRA second products');
  // the attention is ragguard's (attention.c), on the same inputs and attributes as com.microsoft's
  const attention = (g: GqaGraph) => g.nodes.filter((n) => n.op === 'GroupQueryAttention');
  assert.deepEqual(attention(ours).map((n) => n.domain), attention(ort8).map(() => 'ragguard'));
  assert.deepEqual(attention(ours).map((n) => [n.inputs, n.outputs, n.attrs]), attention(ort8).map((n) => [n.inputs, n.outputs, n.attrs]));
  assert.deepEqual(gqaOpsets('ragguard'), { '': 17, 'com.microsoft': 1, ragguard: 1 });
  assert.deepEqual(gqaOpsets('onnxruntime'), { '': 17, 'com.microsoft': 1 });

  const dir = await tempDir('gguf-graph-');
  const run = async (g: GqaGraph, ops: CpuKernels, ids: number[], lora: ReadonlyMap<string, { dims: number[]; data: Float32Array }> = new Map()) => {
    const file = path.join(dir, `${ops}.onnx`);
    await writeFile(file, writeModel({ name: 't', ...g, opsets: gqaOpsets(ops) }));
    const s = DirectSession.create(file)!;
    const feeds: Record<string, HostTensor> = {};
    const fill = (name: string, type: 'int64' | 'float32', dims: number[], v?: readonly number[]) => {
      const t = (feeds[name] = s.tensor(type, dims));
      if (type === 'int64') (t.data as BigInt64Array).set((v ?? new Array<number>(t.data.length).fill(0)).map(BigInt));
      else (t.data as Float32Array).fill(0);
    };
    try {
      fill('input_ids', 'int64', [1, ids.length], ids);
      fill('attention_mask', 'int64', [1, ids.length], ids.map(() => 1));
      fill('lora_index', 'int64', [1]);
      for (let l = 0; l < 2; l++) for (const kv of ['key', 'value']) fill(`past_key_values.${l}.${kv}`, 'float32', [1, 2, 16, 64]);
      for (const slot of loraSlots({ numLayers: 2, hiddenSize: H, numHeads: 4, numKvHeads: 2, headDim: 64, intermediateSize: I })) {
        for (const [name, rank0] of [[slot.a, [1, slot.inDim, 0]], [slot.b, [1, 0, slot.outDim]]] as const) {
          const given = lora.get(name);
          fill(name, 'float32', given?.dims ?? [...rank0]);
          if (given) (feeds[name]!.data as Float32Array).set(given.data);
        }
      }
      const out = await s.run(feeds, { logits: null });
      const l = Float32Array.from(out['logits']!.data as Float32Array);
      for (const t of Object.values(out)) t.dispose();
      return l;
    } finally {
      for (const t of Object.values(feeds)) t.dispose();
      s.dispose();
    }
  };
  // An adapter on layer 0's gate and up (rank 2, each its own): with ragguard's kernels their terms' second
  // products are taken inside the gate-and-up QMatMul's activation, which the graph has in place of the
  // split product's nodes.
  const r = seededRandom(6);
  const adapter = new Map<string, { dims: number[]; data: Float32Array }>();
  for (const [m, scale] of [['gate', 0.6], ['up', 1.0]] as const) {
    adapter.set(`model.layers.0.mlp.${m}_proj.lora_A`, { dims: [1, H, 2], data: Float32Array.from({ length: H * 2 }, () => (r() - 0.5) * scale) });
    adapter.set(`model.layers.0.mlp.${m}_proj.lora_B`, { dims: [1, 2, I], data: Float32Array.from({ length: 2 * I }, () => (r() - 0.5) * scale) });
  }
  assert.equal(ours.nodes.filter((n) => n.op.startsWith('QMatMul') && n.attrs?.['activation']).length, 2, 'a gate-and-up product with its activation a layer');
  assert.equal(ours.nodes.filter((n) => n.op === 'Split' || n.op === 'Sigmoid').length, 0, 'no Split or Sigmoid left');
  // And on the projections whose QMatMul takes the term inside: layer 0's o_proj and down_proj (Q4_K: the
  // min term and the LoRA term in one product), layer 1's q/k/v (the fused slot, with the bias).
  const projections = new Map<string, { dims: number[]; data: Float32Array }>();
  for (const [m, inDim, rank, outDim] of [['model.layers.0.self_attn.o_proj', H, 2, H], ['model.layers.0.mlp.down_proj', I, 2, H], ['model.layers.1.self_attn.qkv_proj', H, 3, H + 256]] as const) {
    projections.set(`${m}.lora_A`, { dims: [1, inDim, rank], data: Float32Array.from({ length: inDim * rank }, () => (r() - 0.5) * 0.6) });
    projections.set(`${m}.lora_B`, { dims: [1, rank, outDim], data: Float32Array.from({ length: rank * outDim }, () => (r() - 0.5) * 0.6) });
  }
  const cases: [number[], ReadonlyMap<string, { dims: number[]; data: Float32Array }>][] = [
    [[1, 17, 42, 99, 250], new Map()], [[150, 3, 88, 12, 64, 5, 299, 7, 7], new Map()], [[150, 3, 88, 12, 64, 5, 299], adapter],
    [[150, 3, 88, 12, 64, 5, 299], projections]];
  /** MatMulNBits' graph and ragguard's give the same logits for `ids` (with adapter `lora`, which must move them). */
  const agree = async (theirs: GqaGraph, mine: GqaGraph, ids: number[], lora: ReadonlyMap<string, { dims: number[]; data: Float32Array }>, what: string) => {
    const a = await run(theirs, 'onnxruntime', ids, lora);
    const b = await run(mine, 'ragguard', ids, lora);
    if (lora.size) {
      // the adapter moves the logits by far more than the products' error: a term lost or on the wrong half is seen
      const base = await run(theirs, 'onnxruntime', ids);
      const spread = Math.max(...base) - Math.min(...base);
      assert.ok(a.reduce((m, v, i) => Math.max(m, Math.abs(v - base[i]!)), 0) > 0.3 * spread, 'the adapter moves the logits');
    }
    const spread = Math.max(...a) - Math.min(...a);
    const worst = a.reduce((m, v, i) => Math.max(m, Math.abs(v - b[i]!)), 0);
    // The same int8 arithmetic, the float sums in another order: a last-bit difference that moves an
    // activation across an int8 rounding step in a later product moves the logits by ~0.002 of their
    // range (measured); a lost bias or a wrong block moves them by the range itself.
    assert.ok(worst < 0.01 * spread, `${what}: logits differ by ${worst} (range ${spread})`);
  };
  for (const [ids, lora] of cases) await agree(ort8, ours, ids, lora, `${ids}`);
  // q/k/v of two block forms (layer 0's v in Q4_K): with ragguard's kernels each part's QMatMul takes its own
  // bias and its columns of the slot's LoRA term, only the Concat after them; the same model, with an
  // adapter on that slot and without.
  const mixedSrc = source(5, true);
  const ortMixed = buildGqaDecoder(cfg, mixedSrc, { weights: 'nbits', rotary: {} });
  const oursMixed = buildGqaDecoder(cfg, mixedSrc, { weights: 'nbits', ops: 'ragguard', rotary: {} });
  const concat = byOutput(oursMixed, 'model.layers.0.qkv')!;
  assert.equal(concat.op, 'Concat');
  for (const [i, n] of [[0, H], [1, 128], [2, 128]] as const) {
    const part = byOutput(oursMixed, concat.inputs[i]!)!;
    assert.equal(part.op, i === 2 ? 'QMatMul4' : 'QMatMul8');
    assert.equal(initializer(oursMixed, part.inputs[i === 2 ? 4 : 3]!)!.dims[0], n, 'its own bias');
  }
  assert.equal(oursMixed.nodes.filter((n) => n.inputs.includes('model.layers.0.qkv_base') || n.outputs.includes('model.layers.0.qkv_base')).length, 0, 'no Add after the Concat');
  const slot = new Map<string, { dims: number[]; data: Float32Array }>();
  slot.set('model.layers.0.self_attn.qkv_proj.lora_A', { dims: [1, H, 3], data: Float32Array.from({ length: H * 3 }, () => (r() - 0.5) * 2) });
  slot.set('model.layers.0.self_attn.qkv_proj.lora_B', { dims: [1, 3, H + 256], data: Float32Array.from({ length: 3 * (H + 256) }, () => (r() - 0.5) * 4) });
  for (const lora of [new Map(), slot]) await agree(ortMixed, oursMixed, [150, 3, 88, 12, 64, 5, 299], lora, `q/k/v of two forms${lora.size ? ', an adapter on them' : ''}`);
});

test('embedding float16 (what gguf-decoder.ts asks for where float32 would exceed one ONNX file): a half-size table gathered and cast, the same greedy ids and logits within the halves\' rounding', async () => {
  const src = source(5);
  // dequant: float products, so that only the table's rounding differs (int8 activations would add their own steps).
  const full = buildGqaDecoder(cfg, src, { weights: 'dequant', rotary: {} });
  const halfTable = buildGqaDecoder(cfg, src, { weights: 'dequant', rotary: {}, embedding: 'float16' });
  const table = (g: GqaGraph) => initializer(g, 'model.embed_tokens.weight')!;
  assert.equal(table(halfTable).data.length * 2, table(full).data.length);
  assert.equal(byOutput(halfTable, 'h0')!.op, 'Cast');
  for (const ids of [[1, 17, 42, 99, 250], [150, 3, 88, 12, 64, 5, 299]]) {
    const a = await logits(full, ids);
    const b = await logits(halfTable, ids);
    const argmax = (x: Float32Array) => x.reduce((best, v, i) => (v > x[best]! ? i : best), 0);
    assert.equal(argmax(b), argmax(a), `greedy id of ${ids}`);
    const spread = Math.max(...a) - Math.min(...a);
    const worst = b.reduce((m, v, i) => Math.max(m, Math.abs(v - a[i]!)), 0);
    assert.ok(worst < 0.01 * spread, `${ids}: logits differ by ${worst} (range ${spread})`);
  }
});
