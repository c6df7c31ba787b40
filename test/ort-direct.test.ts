/**
 * ONNX Runtime's C API through koffi (backends/ort/ort-direct.ts), on the genai decoder setup builds:
 * the same numbers as onnxruntime-node, the KV buffer written in place, clear errors, and the
 * decoder's two run paths giving the same generations.
 */
import assert from 'node:assert/strict';
import path from 'node:path';
import { before, test } from 'node:test';
import * as ort from 'onnxruntime-node';
import { DecoderModel } from '../src/backends/ort/decoder-model.js';
import { generate } from '../src/backends/ort/generator.js';
import { loraSlots } from '../src/generate/lora.js';
import { writeFile } from 'node:fs/promises';
import { ONNX_FLOAT, writeModel } from '../src/runtime/onnx-proto.js';
import { DirectSession, directUnavailable, type HostTensor } from '../src/backends/ort/ort-direct.js';
import { RunInterrupted } from '../src/runtime/errors.js';
import { ROOT, tempDir } from './helpers.js';

const DIR = path.join(ROOT, 'models', 'decoder-gqa');
const FILE = path.join(DIR, 'model.onnx');
const L = 4, H = 2, D = 32, CAP = 64;
const names = Array.from({ length: 2 * L }, (_, i) => `${i >> 1}.${i & 1 ? 'value' : 'key'}`);
const ids = Array.from({ length: 40 }, (_, i) => 5 + ((i * 37) % 3000));
let direct: DirectSession;
// The graph's LoRA inputs (gqa-builder.ts), fed at rank 0 here: the base model.
const lora = loraSlots({ numLayers: L, hiddenSize: 256, numHeads: 8, numKvHeads: H, headDim: D, intermediateSize: 768 })
  .flatMap((s) => [{ name: s.a, dims: [1, s.inDim, 0] }, { name: s.b, dims: [1, 0, s.outDim] }]);

before(() => {
  assert.equal(directUnavailable(), '', 'the C API binds on this machine');
  direct = DirectSession.create(FILE)!;
});

test('a direct session reads its inputs\' names, element types and ranks (what the decoder loads by)', () => {
  assert.deepEqual(direct.inputs.slice(0, 3), [
    { name: 'input_ids', type: 'int64', rank: 2 }, { name: 'attention_mask', type: 'int64', rank: 2 }, { name: 'past_key_values.0.key', type: 'float32', rank: 4 },
  ]);
  assert.equal(direct.inputs.length, 2 + 2 * L + 1 + 2 * 5 * L, 'ids, mask, KV, the rows\' adapter entries, and A and B for 5 projections a layer');
  assert.deepEqual(direct.inputs.slice(2 + 2 * L, 5 + 2 * L).map((i) => i.name), ['lora_index', lora[0]!.name, lora[1]!.name]);
});

function feedsFor(s: DirectSession, kv: HostTensor[]): { feeds: Record<string, HostTensor>; fetches: Record<string, HostTensor | null>; inputs: HostTensor[] } {
  const inputIds = s.tensor('int64', [1, ids.length]);
  (inputIds.data as BigInt64Array).set(ids.map(BigInt));
  const mask = s.tensor('int64', [1, ids.length]);
  (mask.data as BigInt64Array).fill(1n);
  const feeds: Record<string, HostTensor> = { input_ids: inputIds, attention_mask: mask };
  const zeros = lora.map((l) => (feeds[l.name] = s.tensor('float32', l.dims)));
  const index = (feeds['lora_index'] = s.tensor('int64', [1]));
  (index.data as BigInt64Array).fill(0n);
  const fetches: Record<string, HostTensor | null> = { logits: null };
  names.forEach((n, i) => {
    feeds[`past_key_values.${n}`] = kv[i]!;
    fetches[`present.${n}`] = kv[i]!;
  });
  return { feeds, fetches, inputs: [inputIds, mask, index, ...zeros] };
}

test('a direct run gives onnxruntime-node\'s logits and writes the KV into the buffer it was given', async () => {
  const kv = names.map(() => direct.tensor('float32', [1, H, CAP, D]));
  for (const t of kv) (t.data as Float32Array).fill(0);
  const { feeds, fetches, inputs } = feedsFor(direct, kv);
  const out = await direct.run(feeds, fetches);
  assert.equal(out['present.0.key'], kv[0], 'the present output is the buffer itself');
  assert.deepEqual(out['logits']!.dims, [1, 1, 4096]);

  const node = await ort.InferenceSession.create(FILE);
  const nf: Record<string, ort.Tensor> = {
    input_ids: new ort.Tensor('int64', BigInt64Array.from(ids.map(BigInt)), [1, ids.length]),
    attention_mask: new ort.Tensor('int64', new BigInt64Array(ids.length).fill(1n), [1, ids.length]),
  };
  for (const n of names) nf[`past_key_values.${n}`] = new ort.Tensor('float32', new Float32Array(H * CAP * D), [1, H, CAP, D]);
  for (const l of lora) nf[l.name] = new ort.Tensor('float32', new Float32Array(0), l.dims);
  nf['lora_index'] = new ort.Tensor('int64', new BigInt64Array(1), [1]);
  const ref = await node.run(nf);
  assert.deepEqual(Array.from(out['logits']!.data as Float32Array), Array.from(ref['logits']!.data as Float32Array));
  assert.deepEqual(Array.from(kv[5]!.data as Float32Array), Array.from(ref['present.2.value']!.data as Float32Array));
  assert.ok((kv[0]!.data as Float32Array).subarray(0, ids.length * D).some((x) => x !== 0), 'keys were written');
  out['logits']!.dispose();
  for (const t of [...kv, ...inputs]) t.dispose();
  await node.release();
});

test('a tensor made in a larger one\'s memory (tensorOver) runs as a new one would, writes into that memory, and releases it with itself', async () => {
  const fresh = names.map(() => direct.tensor('float32', [1, H, CAP, D]));
  const bases = names.map(() => direct.tensor('float32', [2, H, CAP, D])); // twice as large
  for (const t of [...fresh, ...bases]) (t.data as Float32Array).fill(0);
  const over = bases.map((b) => direct.tensorOver(b, 'float32', [1, H, CAP, D]));
  assert.equal(over[0]!.data.buffer, bases[0]!.data.buffer, 'the base\'s own view: no new ArrayBuffer');
  assert.equal(over[0]!.data.length, H * CAP * D);
  const a = feedsFor(direct, fresh);
  const b = feedsFor(direct, over);
  const ra = await direct.run(a.feeds, a.fetches);
  const rb = await direct.run(b.feeds, b.fetches);
  assert.equal(rb['present.0.key'], over[0], 'the present output is the tensor made in the base');
  assert.deepEqual(Array.from(rb['logits']!.data as Float32Array), Array.from(ra['logits']!.data as Float32Array));
  assert.deepEqual(Array.from((bases[3]!.data as Float32Array).subarray(0, H * CAP * D)), Array.from(fresh[3]!.data as Float32Array),
    'the KV was written into the base\'s memory');
  assert.throws(() => direct.tensorOver(bases[0]!, 'float32', [3, H, CAP, D]), /over/, 'larger than the base');
  for (const t of over) t.dispose();
  assert.ok(bases.every((t) => t.disposed), 'disposing the tensor made in a base released the base');
  ra['logits']!.dispose();
  rb['logits']!.dispose();
  for (const t of [...fresh, ...a.inputs, ...b.inputs]) t.dispose();
});

test('a failing run rejects with ONNX Runtime\'s message and the session goes on; a released tensor cannot be used', async () => {
  const kv = names.map(() => direct.tensor('float32', [1, H + 1, CAP, D])); // wrong kv_heads
  const { feeds, fetches, inputs } = feedsFor(direct, kv);
  await assert.rejects(direct.run(feeds, fetches), /onnxruntime: .*past_key/i);
  for (const t of kv) t.dispose();
  assert.throws(() => kv[0]!.handle, /used after dispose/);
  kv[0]!.dispose(); // twice is harmless
  const good = names.map(() => direct.tensor('float32', [1, H, CAP, D]));
  const ok = feedsFor(direct, good);
  const out = await direct.run(ok.feeds, ok.fetches);
  assert.equal(out['logits']!.dims[2], 4096);
  out['logits']!.dispose();
  for (const t of [...good, ...inputs, ...ok.inputs]) t.dispose();
});

test('the genai decoder runs direct on the CPU, and generates the same through onnxruntime-node', async () => {
  const viaDirect = await DecoderModel.load(DIR, 'cpu');
  const viaNode = await DecoderModel.load(DIR, 'cpu', { direct: false });
  assert.deepEqual(viaDirect.runPath, { path: 'direct' });
  assert.deepEqual(viaNode.runPath, { path: 'onnxruntime-node', reason: 'disabled' });
  const optimum = await DecoderModel.load(path.join(ROOT, 'models', 'decoder'), 'cpu');
  assert.deepEqual(optimum.runPath, { path: 'onnxruntime-node', reason: 'optimum layout' });
  const prompt = [1, ...viaDirect.tokenizer.encode('Question: Where are logs kept?\nAnswer:')];
  const opts = { maxNewTokens: 80, temperature: 0, ignoreEos: true };
  const a = await generate(viaDirect, prompt, opts);
  const b = await generate(viaNode, prompt, opts);
  assert.deepEqual(a.ids, b.ids);
  assert.equal(a.ids.length, 80);
});

test('a paced past (allocPastPaced) waits on the pace before each layer\'s tensor, and takes a spare tensor that fits', async () => {
  const model = await DecoderModel.load(DIR, 'cpu');
  const { numLayers, numKvHeads, headDim } = model.shape;
  let paced = 0;
  const past = await model.allocPastPaced(2, 16, undefined, () => {
    paced++;
    return new Promise<void>((r) => setImmediate(r));
  });
  assert.equal(paced, 2 * numLayers, 'a pace before every tensor');
  assert.equal(past.length, 2 * numLayers);
  assert.deepEqual(past[0]!.dims, [2, numKvHeads, 16, headDim]);
  // A spare of the right size is taken (and leaves the list).
  const made = model.allocPast(2, 16);
  const spare = [made[0]!];
  const withSpare = await model.allocPastPaced(2, 16, spare, () => undefined);
  assert.equal(spare.length, 0, 'the spare was taken');
  assert.equal((withSpare[0]!.data as Float32Array).buffer, (made[0]!.data as Float32Array).buffer, 'made in the spare\'s memory');
  for (const t of made.slice(1)) t.dispose();
  for (const t of [...past, ...withSpare]) t.dispose();
});

test('an abort while a run is on its worker thread stops it between nodes (RunInterrupted, the abort\'s reason); the session runs on', async () => {
  // A chain of 2000 [n, n] x [n, n] products: at n = 512 some 540 GFLOP, seconds on any CPU, where the
  // flag, set in the same synchronous stretch that started the run, stops it within a node.
  const chain = 2000;
  const file = path.join(await tempDir('ragguard-chain-'), 'chain.onnx');
  await writeFile(file, writeModel({
    name: 'chain',
    nodes: Array.from({ length: chain }, (_, i) => ({ op: 'MatMul', inputs: [i === 0 ? 'x' : `y${i - 1}`, 'x'], outputs: [i === chain - 1 ? 'y' : `y${i}`] })),
    initializers: [],
    inputs: [{ name: 'x', elemType: ONNX_FLOAT, dims: ['n', 'n'] }],
    outputs: [{ name: 'y', elemType: ONNX_FLOAT, dims: ['n', 'n'] }],
    opsets: { '': 17 },
  }));
  const s = DirectSession.create(file)!;
  const big = s.tensor('float32', [512, 512]);
  (big.data as Float32Array).fill(1 / 512);
  const ac = new AbortController();
  const run = s.run({ x: big }, { y: null }, ac.signal);
  ac.abort(new Error('client left'));
  await assert.rejects(run, (e: unknown) => e instanceof RunInterrupted && (e.reason as Error).message === 'client left');
  // Already aborted: refused before anything runs.
  await assert.rejects(s.run({ x: big }, { y: null }, ac.signal), /client left/);
  // The session (and a signal that never fires) goes on: [[1/2, 1/2], [1/2, 1/2]] is its own square.
  const small = s.tensor('float32', [2, 2]);
  (small.data as Float32Array).fill(0.5);
  const out = await s.run({ x: small }, { y: null }, new AbortController().signal);
  assert.deepEqual(Array.from(out['y']!.data as Float32Array), [0.5, 0.5, 0.5, 0.5]);
  for (const t of [out['y']!, big, small]) t.dispose();
  s.dispose();
});
