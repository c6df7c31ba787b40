/**
 * The embedder reads every documented output form (sentence_embedding, last_hidden_state,
 * token_embeddings, a lone output by rank) and refuses, at load, a model whose output is not finite.
 * The graphs are written here: a token-embedding table (Gather) with or without a ReduceMean.
 */
import assert from 'node:assert/strict';
import { copyFile, mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { test } from 'node:test';
import { Embedder, poolingOf, selectOutput } from '../src/retrieval/embedder.js';
import { ONNX_FLOAT, ONNX_INT64, writeModel, type NodeSpec, type ValueSpec } from '../src/runtime/onnx-proto.js';
import { ROOT, tempDir } from './helpers.js';

const VOCAB = 4096; // models/embedder's tokenizer, reused
const D = 8;

/** A deterministic table whose rows differ; `fill` overrides every value (NaN, Infinity). */
function table(fill?: number): Float32Array {
  const t = new Float32Array(VOCAB * D);
  for (let i = 0; i < t.length; i++) t[i] = fill ?? Math.sin(i * 0.37) + 0.1 * ((i % 7) - 3);
  return t;
}

type Form = 'last_hidden_state' | 'token_embeddings' | 'sentence_embedding' | 'both' | 'lone2' | 'lone3' | 'odd';

async function modelDir(form: Form, fill?: number): Promise<string> {
  const dir = await tempDir('ragguard-emb-');
  await mkdir(path.join(dir, 'onnx'));
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) await copyFile(path.join(ROOT, 'models', 'embedder', f), path.join(dir, f));
  await writeFile(path.join(dir, 'config.json'), JSON.stringify({ hidden_size: D, max_position_embeddings: 64, pad_token_id: 0 }));
  const tokens: ValueSpec = { name: 'tokens', elemType: ONNX_FLOAT, dims: ['batch', 'sequence', D] };
  const pooled: ValueSpec = { name: 'pooled', elemType: ONNX_FLOAT, dims: ['batch', D] };
  const nodes: NodeSpec[] = [
    { op: 'Gather', inputs: ['table', 'input_ids'], outputs: ['tokens'] },
    { op: 'ReduceMean', inputs: ['tokens'], outputs: ['pooled'], attrs: { axes: { ints: [1] }, keepdims: { int: 0 } } },
  ];
  const rename = (v: ValueSpec, name: string): ValueSpec => ({ ...v, name });
  const alias = (from: string, to: string): NodeSpec => ({ op: 'Identity', inputs: [from], outputs: [to] });
  const outputs: ValueSpec[] = [];
  const add = (v: ValueSpec, name: string) => {
    nodes.push(alias(v.name, name));
    outputs.push(rename(v, name));
  };
  if (form === 'last_hidden_state' || form === 'token_embeddings') add(tokens, form);
  if (form === 'sentence_embedding') add(pooled, 'sentence_embedding');
  if (form === 'both') {
    add(tokens, 'token_embeddings');
    add(pooled, 'sentence_embedding');
  }
  if (form === 'lone2') add(pooled, 'embeddings');
  if (form === 'lone3') add(tokens, 'hidden');
  if (form === 'odd') {
    add(tokens, 'a');
    add(pooled, 'b');
  }
  const t = table(fill);
  const model = writeModel({
    name: 'toy_encoder',
    nodes,
    initializers: [{ name: 'table', dataType: ONNX_FLOAT, dims: [VOCAB, D], data: new Uint8Array(t.buffer) }],
    inputs: ['input_ids', 'attention_mask'].map((name) => ({ name, elemType: ONNX_INT64, dims: ['batch', 'sequence'] })),
    outputs,
    opsets: { '': 17 },
  });
  await writeFile(path.join(dir, 'onnx', 'model.onnx'), model);
  return dir;
}

const TEXT = 'How do I cancel an at job?';

test('every output form gives the same mean-pooled unit vector', async () => {
  const want = await Embedder.load(await modelDir('last_hidden_state'), 'cpu');
  assert.deepEqual(want.output, { name: 'last_hidden_state', pooled: false });
  assert.equal(want.dimension, D);
  const ref = await want.embed([TEXT]);
  let norm = 0;
  for (const x of ref) norm += x * x;
  assert.ok(Math.abs(norm - 1) < 1e-5, `unit length, got ${norm}`);
  const cases: [Form, string, boolean][] = [
    ['token_embeddings', 'token_embeddings', false],
    ['sentence_embedding', 'sentence_embedding', true],
    ['both', 'sentence_embedding', true],
    ['lone2', 'embeddings', true],
    ['lone3', 'hidden', false],
  ];
  for (const [form, name, pooled] of cases) {
    const e = await Embedder.load(await modelDir(form), 'cpu');
    assert.deepEqual(e.output, { name, pooled }, form);
    const v = await e.embed([TEXT]);
    assert.equal(v.length, D);
    for (let k = 0; k < D; k++) assert.ok(Math.abs(v[k]! - ref[k]!) < 1e-5, `${form}[${k}]: ${v[k]} vs ${ref[k]}`);
  }
});

test('a pooled output in a padded batch is read row by row', async () => {
  const e = await Embedder.load(await modelDir('sentence_embedding'), 'cpu');
  const texts = ['short', 'a much longer text than the first one, so that the batch is padded'];
  const batch = await e.embed(texts);
  for (let i = 0; i < texts.length; i++) {
    const alone = await e.embed([texts[i]!]);
    // The toy graph's ReduceMean also averages padding for the shorter row: only the longest matches exactly.
    if (i === 1) for (let k = 0; k < D; k++) assert.ok(Math.abs(batch[i * D + k]! - alone[k]!) < 1e-5);
    assert.ok(batch.subarray(i * D, (i + 1) * D).every(Number.isFinite));
  }
});

test('NaN or infinite output is refused at load, loudly', async () => {
  await assert.rejects(Embedder.load(await modelDir('sentence_embedding', NaN), 'cpu'), /sentence_embedding' holds NaN .*not finite/);
  await assert.rejects(Embedder.load(await modelDir('last_hidden_state', Infinity), 'cpu'), /last_hidden_state' holds Infinity/);
});

test('outputs that are no embedding form are refused, naming them', async () => {
  await assert.rejects(Embedder.load(await modelDir('odd'), 'cpu'), /no embedding output among \[a, b\]/);
  assert.throws(() => selectOutput(['x'], () => 4, 'm'), /no embedding output among \[x\]/);
  assert.throws(() => selectOutput(['x'], () => undefined, 'm'), /no embedding output/);
});

test('pooling modes from 1_Pooling/config.json; concatenations refused', () => {
  assert.equal(poolingOf(undefined, 'm'), 'mean');
  assert.equal(poolingOf({ pooling_mode_cls_token: true, pooling_mode_mean_tokens: false }, 'm'), 'cls');
  assert.equal(poolingOf({ pooling_mode_max_tokens: true }, 'm'), 'max');
  assert.equal(poolingOf({ pooling_mode_lasttoken: true }, 'm'), 'lasttoken');
  assert.throws(() => poolingOf({ pooling_mode_cls_token: true, pooling_mode_mean_tokens: true }, 'm'), /cls \+ mean|mean \+ cls/);
  assert.throws(() => poolingOf({}, 'm'), /no pooling mode/);
});
