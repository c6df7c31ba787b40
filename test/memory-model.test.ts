import assert from 'node:assert/strict';
import { test } from 'node:test';
import { MemoryModel, type RequestShape } from '../src/guards/memory-model.js';
import { decide, type Capacity } from '../src/guards/policy.js';

// The shipped models' dimensions (models/*/config.json).
const encoder = { numLayers: 2, hiddenSize: 128, numHeads: 4, intermediateSize: 512 };
const decoder = { numLayers: 4, hiddenSize: 256, numHeads: 8, numKvHeads: 2, headDim: 32, intermediateSize: 768, vocabSize: 4096 };
const model = new MemoryModel(encoder, decoder, 16);
const shape: RequestShape = { queryTokens: 12, topK: 20, rerankTopN: 3, pairTokens: 200, promptTokens: 500, maxNewTokens: 64 };
const MB = 1 << 20;

test('KV bytes per token and per request follow 2 x layers x kv_heads x head_dim x 4', () => {
  assert.equal(model.kvBytesPerToken, 2 * 4 * 2 * 32 * 4);
  const p = model.predict(shape);
  assert.equal(p.kvBlocks, Math.ceil(564 / 16));
  assert.equal(p.kvBytes, 36 * 16 * 2048);
});

test('decoder workspace is the sum of its buffers', () => {
  const expected = 99 * 2048 + 100 * 2048 + 2 * 8 * 100 * 32 * 4 + 2 * 8 * 1 * 100 * 4 + (4 * 256 + 3 * 768) * 4 + 4096 * 4 + (2 + 100) * 8;
  assert.equal(model.decoderWorkspace(1, 1, 99), expected);
  assert.ok(model.decoderWorkspace(1, 1, 2000) > model.decoderWorkspace(1, 1, 1000), 'grows with context');
  assert.equal(model.decoderWorkspace(4, 1, 100), 4 * model.decoderWorkspace(1, 1, 100), 'linear in rows');
});

test('genai layout: the past buffer at its capacity (and its copy unless written in place), the fed tokens\' activations, one position\'s logits', () => {
  const genai = new MemoryModel(encoder, { ...decoder, kvLayout: 'genai', maxPositions: 4096 }, 16);
  const inPlace = new MemoryModel(encoder, { ...decoder, kvLayout: 'genai', maxPositions: 4096, kvInPlace: true }, 16);
  // 100 tokens in a buffer of 128 positions (the 64-position step above 100 + 16)
  const rest = 100 * 8 + (8 + 2 * 2) * 32 * 4 + (4 * 256 + 3 * 768) * 4 + 2 * 8 + 4096 * 4;
  assert.equal(genai.decoderWorkspace(1, 1, 99), 2 * 128 * 2048 + rest);
  assert.equal(inPlace.decoderWorkspace(1, 1, 99), 128 * 2048 + rest);
  assert.equal(genai.decoderWorkspace(1, 1, 100) - genai.decoderWorkspace(1, 1, 99), 8, 'one buffer step holds several lengths: only the mask grows');
  assert.ok(genai.decoderWorkspace(1, 1, 120) > genai.decoderWorkspace(1, 1, 99), 'a longer context takes the next buffer step');
  // No [new, context] scores: a prompt twice as long takes about twice the bytes, not four times.
  const ratio = inPlace.decoderWorkspace(1, 1000, 0) / inPlace.decoderWorkspace(1, 500, 0);
  assert.ok(ratio > 1.8 && ratio < 2.2, `ratio ${ratio}`);
});

test('as run, the rerank stage is its largest run: a short last batch is not sized as a full one', () => {
  const asked = model.predict({ ...shape, topK: 20, pairTokens: 200, rerankBatch: 16 }).stages.rerank;
  // 16 pairs padded to 120 tokens, then the longest pair (200 tokens) in a batch of 4
  const ran = model.predict({ ...shape, topK: 20, pairTokens: 200, rerankBatch: 16, rerankRuns: [[16, 120], [4, 200]] }).stages.rerank;
  assert.equal(ran, Math.max(model.stageBytes('rerank', [16, 120, 0]), model.stageBytes('rerank', [4, 200, 0])));
  assert.ok(ran < asked, 'below the worst case of 16 pairs of 200 tokens');
  assert.equal(model.predict({ ...shape, rerankRuns: [[16, 200]], pairTokens: 200 }).stages.rerank, model.stageBytes('rerank', [16, 200, 0]));
});

test('the peak stage is the largest: rerank batches cap at the batch size; long prompts make prefill the peak', () => {
  assert.equal(model.predict({ ...shape, topK: 16 }).stages.rerank, model.predict({ ...shape, topK: 500 }).stages.rerank);
  assert.ok(model.predict({ ...shape, topK: 4 }).stages.rerank < model.predict({ ...shape, topK: 16 }).stages.rerank);
  assert.equal(model.predict({ ...shape, promptTokens: 3000 }).peakStage, 'prefill');
  assert.equal(model.predict({ ...shape, promptTokens: 64, pairTokens: 512 }).peakStage, 'rerank');
});

const roomy: Capacity = { workspaceFree: 1024 * MB, workspaceTotal: 1024 * MB, kvFreeBlocks: 10000, kvTotalBlocks: 10000 };
const floors = { minPromptTokens: 64, minNewTokens: 16 };
const order = ['rerank', 'context', 'new_tokens'] as const;

test('admit when it fits what is free, unchanged', () => {
  const d = decide(model, shape, roomy, order, floors);
  assert.ok(d.action === 'admit');
  assert.deepEqual(d.reshaped, []);
});

test('queue when it fits the capacity but not what is free now', () => {
  const need = model.predict(shape).workspaceBytes;
  assert.equal(decide(model, shape, { ...roomy, workspaceFree: need - 1 }, order, floors).action, 'queue');
  assert.equal(decide(model, shape, { ...roomy, kvFreeBlocks: 10 }, order, floors).action, 'queue');
});

test('a request that can never fit is reshaped in the configured order until it does', () => {
  const big: RequestShape = { ...shape, topK: 100, pairTokens: 512, promptTokens: 200 };
  const full = model.predict(big);
  assert.equal(full.peakStage, 'rerank');
  const total = model.predict({ ...big, topK: 4 }).workspaceBytes; // room for 4 pairs per reranker run
  const d = decide(model, big, { ...roomy, workspaceFree: total, workspaceTotal: total }, order, floors);
  assert.ok(d.action === 'admit');
  assert.deepEqual(d.reshaped, [{ field: 'top_k', from: 100, to: 3 }], 'halved 100 -> 50 -> 25 -> 12 -> 6 -> 3 (the floor: rerank_top_n)');
  assert.ok(d.prediction.workspaceBytes <= total);

  // context first: the prompt is cut instead when the order says so
  const longPrompt: RequestShape = { ...shape, promptTokens: 4000 };
  const cap = model.predict({ ...longPrompt, promptTokens: 1000 }).workspaceBytes;
  const c = decide(model, longPrompt, { ...roomy, workspaceFree: cap, workspaceTotal: cap }, ['context', 'new_tokens'], floors);
  assert.ok(c.action !== 'reject');
  assert.deepEqual(c.reshaped, [{ field: 'prompt_tokens', from: 4000, to: 1000 }]);
});

test('batch first: smaller reranker batches fit a rerank-bound request without dropping candidates', () => {
  const big: RequestShape = { ...shape, topK: 100, pairTokens: 512, promptTokens: 200 };
  const room = model.predict({ ...big, rerankBatch: 4 }).workspaceBytes;
  const d = decide(model, big, { ...roomy, workspaceFree: room, workspaceTotal: room }, ['batch', 'rerank', 'context'], floors);
  assert.ok(d.action === 'admit');
  assert.deepEqual(d.reshaped, [{ field: 'rerank_batch', from: 16, to: 4 }], 'halved 16 -> 8 -> 4; top_k untouched');
  assert.equal(d.shape.topK, 100);
  // one pair a run is the floor of this step; past it the next step goes on
  const tight = model.predict({ ...big, rerankBatch: 1, topK: 6 }).workspaceBytes;
  const e = decide(model, big, { ...roomy, workspaceFree: tight, workspaceTotal: tight }, ['batch', 'rerank'], floors);
  assert.ok(e.action !== 'reject' && e.shape.rerankBatch === 1);
});

test('a KV-bound request gives up new tokens when the order puts them first', () => {
  const d = decide(model, { ...shape, maxNewTokens: 1000 }, { ...roomy, kvFreeBlocks: 50, kvTotalBlocks: 50 }, ['new_tokens', 'context'], floors);
  assert.ok(d.action !== 'reject');
  assert.deepEqual(d.reshaped, [{ field: 'max_new_tokens', from: 1000, to: 250 }]);
  assert.ok(d.prediction.kvBlocks <= 50);
});

test('reject when even every floor does not fit, saying what was needed', () => {
  const d = decide(model, shape, { ...roomy, workspaceFree: 1000, workspaceTotal: 1000 }, order, floors);
  assert.equal(d.action, 'reject');
  assert.ok(d.action === 'reject' && /workspace bytes/.test(d.reason));
  assert.equal(d.shape.topK, shape.rerankTopN, 'floors were reached before giving up');
  assert.equal(d.shape.promptTokens, 64);
  assert.equal(d.shape.maxNewTokens, 16);
});

test('where adapters can run, every request counts its row of the gathered slots and its low-rank activations; a LoRA graph one projection output', () => {
  const genai = { ...decoder, kvLayout: 'genai' as const, maxPositions: 4096, kvInPlace: true, lora: true };
  const plain = new MemoryModel(encoder, genai, 16);
  const slots = new MemoryModel(encoder, { ...genai, loraMaxRank: 16 }, 16);
  // The widest projection's A and B rows: qkv, (256 in + 384 out) x 3 x 16; activations [tokens, 48].
  const row = (256 + 384) * 48 * 4;
  assert.equal(slots.loraRows(1, 500), row + 500 * 48 * 4);
  const a = slots.predict(shape);
  const b = plain.predict(shape);
  assert.equal(a.stages.prefill - b.stages.prefill, row + 500 * 48 * 4);
  assert.equal(a.stages.decode - b.stages.decode, row + 48 * 4);
  assert.equal(a.stages.rerank, b.stages.rerank);
  assert.equal(plain.loraRows(4, 10), 0, 'no slots, nothing');
  const noLora = new MemoryModel(encoder, { ...genai, lora: false }, 16);
  assert.equal(plain.decoderWorkspace(2, 10, 100) - noLora.decoderWorkspace(2, 10, 100), 2 * 10 * 768 * 4, 'the LoRA path\'s output: the widest projection, MLP\'s');
});

test('genai decode also holds the buffer it replaces (a widened or re-gathered batch), outside the fit', () => {
  const genai = new MemoryModel(encoder, { ...decoder, kvLayout: 'genai', maxPositions: 4096, kvInPlace: true }, 16);
  genai.calibrate({ ...genai.calibration, decode: { scale: 0.5, offsetBytes: 0 } });
  // 500 + 64 tokens: capacity 640 positions of 2048 bytes.
  assert.equal(genai.replacedBuffer(1, 564), 640 * 2048);
  assert.equal(genai.predict(shape).stages.decode, genai.stageBytes('decode', [1, 1, 563]) + 640 * 2048);
  assert.equal(model.replacedBuffer(1, 564), 0, 'optimum: past and present are already both counted');
});
