/**
 * The genai converter on real exports' forms: weights found by the graph's structure, so a
 * constant-folded export (weights renamed `onnx::MatMul_NNN`, stored [in, out] as the product reads
 * them) converts into the same model as the unfolded one; what it cannot represent is refused naming
 * it; a dropped-in Optimum export is converted once into the cache and found there later.
 */
import assert from 'node:assert/strict';
import { readdir, readFile, utimes, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { test } from 'node:test';
import * as ort from 'onnxruntime-node';
import { DecoderModel } from '../src/backends/ort/decoder-model.js';
import { convertExport, exportDecoderDir } from '../src/backends/ort/convert/export-decoder.js';
import { exportWeights } from '../src/backends/ort/convert/export-weights.js';
import { generate } from '../src/backends/ort/generator.js';
import { readGraph } from '../src/runtime/onnx-proto.js';
import { addQkvBiases, editedExport, fold, intAttribute, nodeOf, SOURCE } from './export-fixture.js';
import { int64s } from '../src/runtime/onnx-proto.js';
import { ROOT, tempDir } from './helpers.js';

interface Vectors {
  decoder: { prompt_ids: number[]; greedy_ids: number[] }[];
  decoder_eos_token_id: number;
}

/** The export's logits for one prompt (no past), through onnxruntime-node. */
async function logits(dir: string, ids: number[]): Promise<Float32Array> {
  const s = await ort.InferenceSession.create(path.join(dir, 'onnx', 'model.onnx'));
  const cfg = JSON.parse(await readFile(path.join(dir, 'config.json'), 'utf8')) as { num_hidden_layers: number; num_key_value_heads: number; head_dim: number };
  const n = ids.length;
  const feeds: Record<string, ort.Tensor> = {
    input_ids: new ort.Tensor('int64', BigInt64Array.from(ids, BigInt), [1, n]),
    attention_mask: new ort.Tensor('int64', new BigInt64Array(n).fill(1n), [1, n]),
    position_ids: new ort.Tensor('int64', BigInt64Array.from(ids, (_x, i) => BigInt(i)), [1, n]),
  };
  for (let l = 0; l < cfg.num_hidden_layers; l++) {
    for (const kv of ['key', 'value']) feeds[`past_key_values.${l}.${kv}`] = new ort.Tensor('float32', new Float32Array(0), [1, cfg.num_key_value_heads, 0, cfg.head_dim]);
  }
  const out = await s.run(feeds, ['logits']);
  await s.release();
  return out['logits']!.data as Float32Array;
}

/** A genai graph's (converted without LoRA paths) logits for the last position of one prompt, through onnxruntime-node. */
async function genaiLogits(dir: string, ids: number[]): Promise<Float32Array> {
  const s = await ort.InferenceSession.create(path.join(dir, 'model.onnx'));
  const n = ids.length;
  const feeds: Record<string, ort.Tensor> = {
    input_ids: new ort.Tensor('int64', BigInt64Array.from(ids, BigInt), [1, n]),
    attention_mask: new ort.Tensor('int64', new BigInt64Array(n).fill(1n), [1, n]),
  };
  for (let l = 0; l < 4; l++) for (const kv of ['key', 'value']) feeds[`past_key_values.${l}.${kv}`] = new ort.Tensor('float32', new Float32Array(2 * 64 * 32), [1, 2, 64, 32]);
  const out = await s.run(feeds, ['logits']);
  await s.release();
  return out['logits']!.data as Float32Array;
}

function maxDiff(a: Float32Array, b: Float32Array): number {
  assert.equal(a.length, b.length);
  let worst = 0;
  for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i]! - b[i]!));
  return worst;
}

test('a constant-folded export (renamed weights, [in, out] and transposed) converts into the same model as the unfolded one', async () => {
  const folded = await editedExport(fold);
  // The fixture is an export of the same model under other names: ONNX Runtime gives the same logits.
  const graph = readGraph(await readFile(path.join(folded, 'onnx', 'model.onnx')));
  assert.ok(![...graph.initializers.keys()].some((n) => n.includes('proj')), 'no weight keeps its module name');
  assert.ok(graph.initializers.get('onnx::MatMul_1000')!.dims[0] === 256, 'a folded weight is stored [in, out]');
  const ids = [1, 17, 300, 42, 9];
  const [a, b] = [await logits(SOURCE, ids), await logits(folded, ids)];
  let worst = 0;
  for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i]! - b[i]!));
  assert.ok(worst < 1e-3, `the folded fixture's logits differ by ${worst}`);

  const cfg = JSON.parse(await readFile(path.join(folded, 'config.json'), 'utf8')) as Parameters<typeof exportWeights>[1];
  const w = exportWeights(graph, cfg);
  assert.equal(w.origin.get('model.layers.0.self_attn.q_proj.weight'), 'onnx::MatMul_1000');
  assert.match(w.origin.get('model.layers.1.self_attn.k_proj.weight')!, /^onnx::Cast_/);

  const [fromFolded, fromSource] = [await tempDir('ragguard-gqa-'), await tempDir('ragguard-gqa-')];
  await convertExport(folded, fromFolded);
  await convertExport(SOURCE, fromSource);
  // The same weights, laid out the same: the same graph, byte for byte.
  assert.ok(Buffer.compare(await readFile(path.join(fromFolded, 'model.onnx')), await readFile(path.join(fromSource, 'model.onnx'))) === 0);

  // And it generates what torch generated at build time (the reference vectors).
  const v = JSON.parse(await readFile(path.join(ROOT, 'models', 'testvectors.json'), 'utf8')) as Vectors;
  const decoder = await DecoderModel.load(fromFolded, 'cpu');
  assert.equal(decoder.layout, 'genai');
  for (const d of v.decoder.slice(0, 3)) {
    const stop = d.greedy_ids.at(-1) === v.decoder_eos_token_id;
    const g = await generate(decoder, d.prompt_ids, { maxNewTokens: d.greedy_ids.length, temperature: 0 });
    assert.deepEqual(g.ids, stop ? d.greedy_ids.slice(0, -1) : d.greedy_ids);
  }
});

test('what the converter cannot represent is refused by name, never converted into another model', async () => {
  const refused = async (dir: string, pattern: RegExp) => {
    await assert.rejects(convertExport(dir, await tempDir('ragguard-gqa-')), pattern);
  };
  // Another activation in one layer's MLP.
  await refused(await editedExport((g) => {
    nodeOf(g, 'Sigmoid', '/layers.1/mlp/').op = 'Tanh';
  }), /layer 1: the MLP's activation is Tanh, not SiLU/);
  // A constant the graph multiplies in that no weight of the converted model accounts for (as a q norm would be).
  await refused(await editedExport((g) => {
    const reshape = nodeOf(g, 'Reshape', '/layers.0/self_attn/Reshape_output_0');
    const q = reshape.inputs[0]!;
    g.initializers.push({ name: 'extra_scale', dataType: 1, dims: [256], data: new Uint8Array(new Float32Array(256).fill(1).buffer) });
    g.nodes.splice(g.nodes.indexOf(reshape), 0, { op: 'Mul', inputs: [q, 'extra_scale'], outputs: ['q_scaled'], rest: [] });
    reshape.inputs[0] = 'q_scaled';
  }), /constant extra_scale \[256\] \(read by Mul q_scaled\) is part of no weight/);
  // Names that say otherwise than the structure: k and v swapped by name only.
  await refused(await editedExport((g) => {
    const k = 'm.model.layers.2.self_attn.k_proj.weight_fp16';
    const v = 'm.model.layers.2.self_attn.v_proj.weight_fp16';
    const swap = (x: string) => (x === k ? v : x === v ? k : x);
    for (const n of g.nodes) n.inputs = n.inputs.map(swap);
    for (const t of g.initializers) t.name = swap(t.name);
  }), /uses m\.model\.layers\.2\.self_attn\.v_proj\.weight_fp16 as model\.layers\.2\.self_attn\.k_proj\.weight, but its name says/);
  // Config facts the graph cannot show.
  await refused(await editedExport(() => {}, { config: (c) => (c['model_type'] = 'gemma') }), /model_type 'gemma' is not converted/);
  await refused(await editedExport(() => {}, { config: (c) => (c['sliding_window'] = 64, c['use_sliding_window'] = true) }), /sliding_window 64 attention is not converted/);
  // Rotary frequencies the graph computes with that config.json does not say: another theta, or a scaling
  // the export does not have (the issue's rope_scaling converted without a word into another model).
  await refused(await editedExport(() => {}, { config: (c) => (c['rope_theta'] = 20000) }),
    /rotary frequencies \(\/Constant_17_output_0\) are not config\.json's \(rope_theta 20000, no rope scaling\): frequency 1 is 0\.56234\d* in the graph, 0\.53849\d* from the config/);
  await refused(await editedExport(() => {}, { config: (c) => (c['rope_scaling'] = { rope_type: 'linear', factor: 4 }) }), /rotary frequencies .* \(rope_theta 10000 and its rope scaling\)/);
  // A layer count the graph does not have.
  await refused(await editedExport(() => {}, { config: (c) => (c['num_hidden_layers'] = 3) }), /found 9 RMSNorm weights of 256 values, expected 7/);
});

test('a dropped-in Optimum export is converted once into the cache, keyed by its content; later starts find it', async () => {
  const folded = await editedExport(fold);
  const cache = await tempDir('ragguard-convert-cache-');
  const logs: string[] = [];
  const opts = { cacheDir: cache, mode: 'auto' as const, provider: 'cpu', log: (m: string) => logs.push(m) };
  const dir = await exportDecoderDir(folded, opts);
  assert.ok(dir.startsWith(cache) && dir !== folded);
  assert.match(logs.at(-1)!, /Optimum export converted to the genai layout: .* \(content sha256 [0-9a-f]{16}, hashed in \d+\.\d s\)/);
  assert.equal(await exportDecoderDir(folded, opts), dir);
  // The digest is remembered with the files' sizes and times, not computed again while they hold.
  assert.match(logs.at(-1)!, /already converted to the genai layout: .* \(content sha256 [0-9a-f]{16}, files unchanged since hashed\)/);
  // A genai directory is used as it is; 'off' and another provider serve the export as exported.
  assert.equal(await exportDecoderDir(dir, opts), dir);
  assert.equal(await exportDecoderDir(folded, { ...opts, mode: 'off' }), folded);
  assert.equal(await exportDecoderDir(folded, { ...opts, provider: 'webgpu' }), folded);
  assert.match(logs.at(-1)!, /served as exported on the webgpu provider/);
  // One the converter refuses: served as exported under 'auto' (its own graph is still the model), the
  // log naming why; start-up stops under 'genai'. Nothing is left in the cache.
  const gelu = await editedExport((g) => {
    nodeOf(g, 'Sigmoid', '/layers.0/mlp/').op = 'Tanh';
  });
  assert.equal(await exportDecoderDir(gelu, opts), gelu);
  assert.match(logs.at(-1)!, /not converted to the genai layout \(.*layer 0: the MLP's activation is Tanh, not SiLU.*\); served as exported/);
  await assert.rejects(exportDecoderDir(gelu, { ...opts, mode: 'genai' }), /activation is Tanh/);
  assert.deepEqual((await readdir(cache)).filter((d) => !d.startsWith(path.basename(dir)) && d !== '.digests'), []);
});

test('q, k and v biases (Qwen2) go to their own projections: the converted graph gives the export\'s logits', async () => {
  const biased = await editedExport((g) => {
    addQkvBiases(g);
    fold(g);
  });
  const ids = [1, 17, 300, 42, 9, 1200, 77];
  const exported = (await logits(biased, ids)).subarray(4096 * (ids.length - 1));
  const out = await tempDir('ragguard-gqa-');
  await convertExport(biased, out, { lora: false });
  const converted = await genaiLogits(out, ids);
  // Within what two attention implementations differ by; biases given to the wrong projection move logits by far more.
  assert.ok(maxDiff(exported, converted) < 1e-3, `logits differ by ${maxDiff(exported, converted)}`);
  const plain = await tempDir('ragguard-gqa-');
  await convertExport(SOURCE, plain, { lora: false });
  assert.ok(maxDiff(exported, await genaiLogits(plain, ids)) > 1e-2, 'the biases matter to the logits');
});

test('weights in an external data file are read, and are part of the cache key', async () => {
  const ext = await editedExport(fold, { externalData: 'model.onnx.data' });
  const [a, b] = [await tempDir('ragguard-gqa-'), await tempDir('ragguard-gqa-')];
  await convertExport(ext, a);
  await convertExport(SOURCE, b);
  assert.ok(Buffer.compare(await readFile(path.join(a, 'model.onnx')), await readFile(path.join(b, 'model.onnx'))) === 0);
  const cache = await tempDir('ragguard-convert-cache-');
  const opts = { cacheDir: cache, mode: 'auto' as const, provider: 'cpu' };
  const first = await exportDecoderDir(ext, opts);
  // Another weight value in the data file (the graph file unchanged) is another model: converted anew, the old one gone.
  const data = await readFile(path.join(ext, 'onnx', 'model.onnx.data'));
  data[data.length - 2] = data[data.length - 2]! ^ 0x40;
  await writeFile(path.join(ext, 'onnx', 'model.onnx.data'), data);
  // Its time moves on as a rewrite's does (whatever the file system's time resolution): the remembered digest no longer holds.
  const later = new Date(Date.now() + 5000);
  await utimes(path.join(ext, 'onnx', 'model.onnx.data'), later, later);
  const second = await exportDecoderDir(ext, opts);
  assert.notEqual(second, first);
  assert.deepEqual((await readdir(cache)).filter((d) => d !== '.digests'), [path.basename(second)]);
});

test('a Gemm with transB reads its weight as [out, in]', async () => {
  const g = readGraph(await readFile(path.join(await editedExport((e) => {
    // The head as Gemm(x, E, transB=1) on the embedding E [vocab, hidden], its Transpose gone.
    const head = e.nodes.find((n) => n.outputs[0] === 'logits')!;
    const tr = e.nodes.find((n) => n.outputs[0] === head.inputs[1])!;
    head.op = 'Gemm';
    head.inputs[1] = tr.inputs[0]!;
    head.rest.push(intAttribute('transB', 1));
    e.nodes.splice(e.nodes.indexOf(tr), 1);
  }), 'onnx', 'model.onnx')));
  const cfg = JSON.parse(await readFile(path.join(SOURCE, 'config.json'), 'utf8')) as Parameters<typeof exportWeights>[1];
  const w = exportWeights(g, cfg);
  assert.deepEqual(w.floats('lm_head.weight'), w.floats('model.embed_tokens.weight'));
  assert.equal(w.rows!('lm_head.weight'), 4096);
});

test('the head behind a Slice of the last positions (transformers\' logits_to_keep) is found', async () => {
  const sliced = await editedExport((g) => {
    fold(g);
    const head = g.nodes.find((n) => n.outputs[0] === 'logits')!;
    g.initializers.push(int64s('keep_start', [-1n]), int64s('keep_end', [2n ** 62n]), int64s('keep_axis', [1n]));
    g.nodes.splice(g.nodes.indexOf(head), 0, { op: 'Slice', inputs: [head.inputs[0]!, 'keep_start', 'keep_end', 'keep_axis'], outputs: ['kept'], rest: [] });
    head.inputs[0] = 'kept';
  });
  const [a, b] = [await tempDir('ragguard-gqa-'), await tempDir('ragguard-gqa-')];
  await convertExport(sliced, a);
  await convertExport(SOURCE, b);
  assert.ok(Buffer.compare(await readFile(path.join(a, 'model.onnx')), await readFile(path.join(b, 'model.onnx'))) === 0);
});

test('RMSNorm as one op (SimplifiedLayerNormalization, as ONNX Runtime\'s optimizer fuses it) is read as the decomposed one', async () => {
  const fused = await editedExport((g) => {
    fold(g);
    // Layer 1's post-attention norm: the Mul by its scale becomes the fused op on the norm's input.
    const scale = nodeOf(g, 'Mul', '/layers.1/post_attention_layernorm/Mul_1_output_0');
    const x = nodeOf(g, 'Cast', '/layers.1/post_attention_layernorm/Cast_output_0').outputs[0]!;
    const gamma = scale.inputs[0]!; // the scale (behind its Cast), then the normalized input
    scale.op = 'SimplifiedLayerNormalization';
    scale.inputs = [x, gamma];
  });
  const [a, b] = [await tempDir('ragguard-gqa-'), await tempDir('ragguard-gqa-')];
  await convertExport(fused, a);
  await convertExport(SOURCE, b);
  assert.ok(Buffer.compare(await readFile(path.join(a, 'model.onnx')), await readFile(path.join(b, 'model.onnx'))) === 0);
});

test('weights past what one ONNX file holds are written as external data, which the server loads', async () => {
  const out = await tempDir('ragguard-gqa-');
  // The threshold forced down to 0 bytes: every large initializer goes into model.onnx.data (as past 2 GiB).
  await convertExport(SOURCE, out, { externalDataOver: 0 });
  const graph = await readFile(path.join(out, 'model.onnx'));
  const data = await readFile(path.join(out, 'model.onnx.data'));
  assert.ok(graph.length < 2 ** 20 && data.length > 19 * 2 ** 20, `graph ${graph.length} bytes, data ${data.length}`);
  const v = JSON.parse(await readFile(path.join(ROOT, 'models', 'testvectors.json'), 'utf8')) as Vectors;
  const decoder = await DecoderModel.load(out, 'cpu');
  assert.equal(decoder.runPath.path, 'direct');
  const d = v.decoder[0]!;
  const stop = d.greedy_ids.at(-1) === v.decoder_eos_token_id;
  const g = await generate(decoder, d.prompt_ids, { maxNewTokens: d.greedy_ids.length, temperature: 0 });
  assert.deepEqual(g.ids, stop ? d.greedy_ids.slice(0, -1) : d.greedy_ids);
});
