/**
 * The ONNX Runtime path reproduces the reference implementation (torch, at build time) on the
 * shipped models: same token ids, embeddings within 1e-4, reranker logits within 1e-4, and the same
 * greedy continuation token for token.
 */
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { before, test } from 'node:test';
import { DecoderModel } from '../src/backends/ort/decoder-model.js';
import { generate } from '../src/backends/ort/generator.js';
import { Reranker } from '../src/retrieval/reranker.js';
import { Embedder } from '../src/retrieval/embedder.js';
import { ROOT } from './helpers.js';

interface Vectors {
  embedder: { text: string; input_ids: number[]; embedding: number[] }[];
  reranker: { query: string; passage: string; input_ids: number[]; token_type_ids: number[]; logit: number }[];
  decoder: { prompt_ids: number[]; greedy_ids: number[]; text: string }[];
  decoder_eos_token_id: number;
  tokenizers: {
    embedder: { text: string; ids: number[] }[];
    embedder_pairs: { a: string; b: string; ids: number[]; type_ids: number[] }[];
    decoder: { text: string; ids: number[]; decoded: string }[];
  };
}

const models = path.join(ROOT, 'models');
let v: Vectors;
let embedder: Embedder;
let reranker: Reranker;
let decoder: DecoderModel;

before(async () => {
  v = JSON.parse(await readFile(path.join(models, 'testvectors.json'), 'utf8')) as Vectors;
  [embedder, reranker, decoder] = await Promise.all([
    Embedder.load(path.join(models, 'embedder'), 'cpu'),
    Reranker.load(path.join(models, 'reranker'), 'cpu', {}, 512),
    DecoderModel.load(path.join(models, 'decoder'), 'cpu'),
  ]);
});

test('tokenizers match the reference tokenizers library', () => {
  for (const t of v.tokenizers.embedder) assert.deepEqual(embedder.tokenizer.encode(t.text, true), t.ids, t.text);
  for (const t of v.tokenizers.embedder_pairs) {
    const e = reranker.tokenizer.encodePair(t.a, t.b);
    assert.deepEqual(e.ids, t.ids);
    assert.deepEqual(e.typeIds, t.type_ids);
  }
  for (const t of v.tokenizers.decoder) {
    assert.deepEqual(decoder.tokenizer.encode(t.text), t.ids, t.text);
    assert.equal(decoder.tokenizer.decode(t.ids), t.decoded);
  }
});

test('embeddings match the reference within 1e-4', async () => {
  const got = await embedder.embed(v.embedder.map((e) => e.text));
  const d = embedder.dimension;
  v.embedder.forEach((e, i) => {
    assert.deepEqual(embedder.inputIds(e.text), e.input_ids);
    const row = got.subarray(i * d, (i + 1) * d);
    const err = Math.max(...e.embedding.map((x, k) => Math.abs(x - row[k]!)));
    assert.ok(err < 1e-4, `embedding ${i}: max abs error ${err}`);
  });
});

test('reranker logits match the reference within 1e-4', async () => {
  for (const r of v.reranker) {
    assert.deepEqual(reranker.pairInput(r.query, r.passage).ids, r.input_ids);
    const { scores: [s] } = await reranker.score(r.query, [r.passage]);
    assert.ok(Math.abs(s! - r.logit) < 1e-4, `logit ${s} vs ${r.logit}`);
  }
});

test('greedy decoding on the KV cache reproduces the reference ids exactly', async () => {
  assert.ok(decoder.eosIds.has(v.decoder_eos_token_id));
  for (const d of v.decoder) {
    const stop = d.greedy_ids.at(-1) === v.decoder_eos_token_id;
    const expected = stop ? d.greedy_ids.slice(0, -1) : d.greedy_ids;
    const g = await generate(decoder, d.prompt_ids, { maxNewTokens: d.greedy_ids.length, temperature: 0 });
    assert.deepEqual(g.ids, expected);
    assert.equal(g.finishReason, stop ? 'stop' : 'length');
  }
});
