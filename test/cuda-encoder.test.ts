/**
 * The CUDA encoder (RAGGUARD_EMBEDDER_EP / RAGGUARD_RERANKER_EP=cuda) on the CPU: the model directories'
 * ONNX graphs mapped onto BERT's parameters (every one found, of the right shape), the device plan, and
 * the embedder and reranker running over a stand-in of the native library (test/cuda-encoder-standin.ts:
 * encoder.cu's forward pass in float32 from the uploaded tensors) against ONNX Runtime on the same models.
 * The device itself is checked on the GPU host (scripts/check-cuda-encoders.ts against references made
 * here on the CPU path).
 */
import assert from 'node:assert/strict';
import { copyFile, mkdir, readFile, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { before, describe, test } from 'node:test';
import { CudaUnavailableError } from '../src/backends/cuda/cuda-runner.js';
import { encoderNative, encoderUnavailable } from '../src/backends/cuda/encoder-binding.js';
import { encoderShapeProblem, EncoderTensor, planEncoder, type EncoderShape } from '../src/backends/cuda/encoder-plan.js';
import { CudaEncoder, splitRuns } from '../src/backends/cuda/encoder-runner.js';
import {
  bertDimensions, canonicalName, EncoderCheckpointError, encoderTensors, graphParameters, readEncoderGraph, rerankHead, tensorSpecs, type BertConfig,
} from '../src/backends/cuda/encoder-weights.js';
import { loadConfig } from '../src/config/config.js';
import { MemoryModel } from '../src/guards/memory-model.js';
import { Embedder } from '../src/retrieval/embedder.js';
import { Reranker } from '../src/retrieval/reranker.js';
import { cosine } from '../src/retrieval/similarity.js';
import { encoderLoadBytes, loadModels, RagService } from '../src/service/rag.js';
import { memorySnapshot } from '../src/server/debug-memory.js';
import { Admission } from '../src/guards/admission.js';
import { ROOT, smallCorpus, tempDir, testConfig } from './helpers.js';
import { standInEncoder, type EncoderStandIn } from './cuda-encoder-standin.js';

const EMBEDDER = path.join(ROOT, 'models', 'embedder');
const RERANKER = path.join(ROOT, 'models', 'reranker');
const MINILM = path.join(ROOT, 'models', 'pretrained', 'all-minilm-l6-v2');
const minilm = existsSync(path.join(MINILM, 'onnx', 'model.onnx'));

const TEXTS = [
  'How do I cancel a job queued with at?',
  'Run atrm with the task number; atq lists the pending jobs.',
  "The sticky bit on /tmp lets only a file's owner delete it.",
  'APT pinning\nPackages from one release can be given priority over another, so that an upgrade takes them from the release asked for.',
  'a',
];


/** Row-wise worst cosine of two [n, d] matrices. */
function worstCosine(a: Float32Array, b: Float32Array, d: number): number {
  let worst = 1;
  for (let i = 0; i < a.length / d; i++) worst = Math.min(worst, cosine(a.subarray(i * d, (i + 1) * d), b.subarray(i * d, (i + 1) * d)));
  return worst;
}

/** A copy of a model directory with config.json (and 1_Pooling/config.json) edited. */
async function editedCopy(dir: string, config: (c: Record<string, unknown>) => void, pooling?: Record<string, boolean>): Promise<string> {
  const out = path.join(await tempDir('ragguard-enc-'), path.basename(dir));
  await mkdir(path.join(out, 'onnx'), { recursive: true });
  for (const f of ['tokenizer.json', 'tokenizer_config.json', 'onnx/model.onnx']) await copyFile(path.join(dir, f), path.join(out, f));
  const c = JSON.parse(await readFile(path.join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
  config(c);
  await writeFile(path.join(out, 'config.json'), JSON.stringify(c));
  if (pooling) {
    await mkdir(path.join(out, '1_Pooling'));
    await writeFile(path.join(out, '1_Pooling', 'config.json'), JSON.stringify(pooling));
  }
  return out;
}

describe('weights from the ONNX graphs', () => {
  test('parameter names lose their module prefix; activations and stored copies carry none', () => {
    assert.equal(canonicalName('bert.encoder.layer.3.output.dense.weight'), 'encoder.layer.3.output.dense.weight');
    assert.equal(canonicalName('inner.embeddings.word_embeddings.weight'), 'embeddings.word_embeddings.weight');
    assert.equal(canonicalName('m.embeddings.LayerNorm.bias'), 'embeddings.LayerNorm.bias');
    assert.equal(canonicalName('classifier.weight'), 'classifier.weight');
    assert.equal(canonicalName('scale'), 'scale');
    assert.equal(canonicalName('m.embeddings.word_embeddings.weight_fp16'), undefined);
    assert.equal(canonicalName('/bert/encoder/layer.0/attention/self/query/MatMul_output_0'), undefined);
    assert.equal(canonicalName('val_49'), undefined);
  });

  const cases: [string, string, boolean][] = [['the test embedder', EMBEDDER, true], ['the test reranker', RERANKER, true], ['all-MiniLM-L6-v2 (int8 weights)', MINILM, minilm]];
  for (const [what, dir, present] of cases) {
    test(`${what}: every BERT parameter is found, of the right shape`, { skip: !present && 'models/pretrained missing: run scripts/fetch-pretrained.sh' }, async () => {
      const cfg = JSON.parse(await readFile(path.join(dir, 'config.json'), 'utf8')) as BertConfig;
      const p = graphParameters(readEncoderGraph(path.join(dir, 'onnx', 'model.onnx')));
      const reranker = dir === RERANKER;
      const head = reranker ? rerankHead(p, dir) : { head: 'embedding' as const, numLabels: 0 };
      const shape: EncoderShape = { ...bertDimensions(cfg, dir), ...head, pooling: 'mean', normalize: !reranker };
      const tensors = encoderTensors(p, shape, dir);
      assert.equal(tensors.length, 5 + 16 * cfg.num_hidden_layers + (reranker ? 5 : 0));
      assert.equal(tensors.length, tensorSpecs(shape).length);
      for (const { spec, values } of tensors) {
        assert.equal(values.length, spec.dims.reduce((a, b) => a * b, 1), spec.name);
        assert.ok(values.every(Number.isFinite), `${spec.name} is finite`);
      }
      // Distinct tensors, not one constant found for several names.
      const q = tensors.find((t) => t.spec.name === 'encoder.layer.0.attention.self.query.weight')!.values;
      const k = tensors.find((t) => t.spec.name === 'encoder.layer.0.attention.self.key.weight')!.values;
      assert.notDeepEqual(q.slice(0, 16), k.slice(0, 16));
      assert.equal(p.lnEps !== undefined && Math.abs(p.lnEps - 1e-12) < 1e-15, true);
      if (reranker) assert.deepEqual(head, { head: 'pair', numLabels: 1 });
    });
  }

  test('an embedder graph is not a cross-encoder; a model that is not BERT is refused by name', async () => {
    const p = graphParameters(readEncoderGraph(path.join(EMBEDDER, 'onnx', 'model.onnx')));
    assert.throws(() => rerankHead(p, 'x'), EncoderCheckpointError);
    const cfg = JSON.parse(await readFile(path.join(EMBEDDER, 'config.json'), 'utf8')) as BertConfig;
    assert.throws(() => bertDimensions({ ...cfg, model_type: 'xlm-roberta' }, 'd'), /model_type 'xlm-roberta'.+BERT/);
    assert.throws(() => bertDimensions({ ...cfg, hidden_act: 'relu' }, 'd'), /hidden_act 'relu'/);
    assert.equal(bertDimensions({ ...cfg, hidden_act: 'gelu_new' }, 'd').act, 'gelu_tanh');
  });
});

describe('the device plan', () => {
  const shape: EncoderShape = {
    numLayers: 2, hidden: 128, numHeads: 4, intermediate: 512, vocab: 4096, maxPositions: 512, typeVocab: 2, numLabels: 0,
    head: 'embedding', pooling: 'mean', normalize: true, act: 'gelu', lnEps: 1e-12,
  };

  test('weights in float16 and float32 regions at 256-byte boundaries; activations for the largest run', () => {
    const p = planEncoder(shape, { maxRows: 8, maxTokens: 1024, cublasWorkspaceBytes: 1 << 20 });
    const a = (n: number) => Math.ceil(n / 256) * 256;
    const global = a(2 * 4096 * 128) + a(2 * 512 * 128) + a(2 * 2 * 128) + 2 * a(4 * 128);
    const layer = a(2 * 3 * 128 * 128) + a(4 * 3 * 128) + a(2 * 128 * 128) + 3 * a(4 * 128) + a(2 * 512 * 128) + a(4 * 512) + a(2 * 128 * 512) + 3 * a(4 * 128);
    assert.equal(p.weights, global + 2 * layer);
    const inputs = a(4 * (2 * 1024 + 8)), out = a(4 * 8 * 128);
    // ids, types, lens; x, qkv, ctx, tmp, the feed-forward's activations; the output.
    assert.equal(p.activations, inputs + a(2 * 1024 * 128) + a(2 * 1024 * 3 * 128) + a(2 * 1024 * 128) + a(2 * 1024 * 128) + a(2 * 1024 * 512) + out);
    assert.equal(p.hostPinned, inputs + out);
    assert.equal(p.total, p.weights + p.activations + (1 << 20));
    const cls = planEncoder({ ...shape, head: 'pair', numLabels: 1 }, { maxRows: 8, maxTokens: 1024, cublasWorkspaceBytes: 0 });
    assert.equal(cls.weights - p.weights, a(2 * 128 * 128) + a(4 * 128) + a(2 * 128) + a(4) + a(4));
  });

  test('shapes the kernels cannot take are named', () => {
    assert.equal(encoderShapeProblem(shape), undefined);
    assert.match(encoderShapeProblem({ ...shape, numHeads: 8 })!, /head dimension 16/);
    assert.match(encoderShapeProblem({ ...shape, hidden: 2048, numHeads: 32 })!, /above 1024/);
    assert.match(encoderShapeProblem({ ...shape, head: 'pair', numLabels: 2 })!, /one logit/);
  });

  test('runs: length-sorted, at most maxRows sequences and maxTokens rows x padded width, every row once', () => {
    const lengths = [5, 300, 7, 2, 300, 9, 120, 3];
    const runs = splitRuns(lengths, 3, 610);
    assert.deepEqual(runs.flat().sort((a, b) => a - b), lengths.map((_, i) => i));
    for (const r of runs) {
      assert.ok(r.length <= 3);
      const width = Math.max(...r.map((i) => lengths[i]!));
      assert.equal(width, lengths[r[r.length - 1]!], 'the longest last');
      assert.ok(r.length * width <= 610, `${r} x ${width}`);
    }
    assert.deepEqual(runs, [[3, 7, 0], [2, 5, 6], [1, 4]]);
  });
});

describe('the embedder and reranker over the stand-in library', () => {
  let native: EncoderStandIn;
  let cpuEmbedder: Embedder;
  let cpuReranker: Reranker;

  before(async () => {
    native = standInEncoder();
    cpuEmbedder = await Embedder.load(EMBEDDER, 'cpu');
    cpuReranker = await Reranker.load(RERANKER, 'cpu');
  });

  test('without the library, RAGGUARD_EMBEDDER_EP=cuda stops naming why and what to do', async () => {
    if (encoderNative() !== null) return; // a machine with the library and a GPU: nothing to refuse
    await assert.rejects(Embedder.load(EMBEDDER, 'cuda'), (e: Error) =>
      e instanceof CudaUnavailableError && e.message.includes(encoderUnavailable()) && /RAGGUARD_EMBEDDER_EP=cuda.+RAGGUARD_EMBEDDER_EP=cpu or auto/s.test(e.message));
    await assert.rejects(Reranker.load(RERANKER, 'cuda'), /RAGGUARD_RERANKER_EP=cuda: the CUDA encoder is unavailable/);
  });

  test('embeddings match ONNX Runtime\'s, batched in runs the limits allow, in the caller\'s order', async () => {
    const e = await Embedder.load(EMBEDDER, 'cuda', { cuda: { native, maxRows: 2, maxTokens: 512 } });
    assert.equal(e.provider, 'cuda');
    assert.deepEqual(e.output, { name: 'sentence_embedding', pooled: true });
    assert.equal(e.dimension, 128);
    assert.equal(e.batchSize, 2);
    const before = native.runs.length;
    const got = await e.embed(TEXTS);
    const want = await cpuEmbedder.embed(TEXTS);
    assert.ok(worstCosine(got, want, 128) > 0.99999, `worst cosine ${worstCosine(got, want, 128)}`);
    const runs = native.runs.slice(before);
    assert.equal(runs.reduce((s, [r]) => s + r, 0), TEXTS.length);
    for (const [rows, width] of runs) assert.ok(rows <= 2 && rows * width <= 512);
    // The texts are distinct vectors: a mapping that lost the input would make them equal.
    assert.ok(cosine(got.subarray(0, 128), got.subarray(4 * 128, 5 * 128)) < 0.95);
  });

  test('the pooling 1_Pooling/config.json asks for is the one the device computes (cls here)', async () => {
    const dir = await editedCopy(EMBEDDER, () => {}, { pooling_mode_cls_token: true, pooling_mode_mean_tokens: false });
    const cpu = await Embedder.load(dir, 'cpu');
    const gpu = await Embedder.load(dir, 'cuda', { cuda: { native } });
    assert.equal(gpu.pooling, 'cls');
    const got = await gpu.embed(TEXTS), want = await cpu.embed(TEXTS);
    assert.ok(worstCosine(got, want, 128) > 0.99999);
    // And it is not the mean: the test would pass for any pooling otherwise.
    assert.ok(worstCosine(got, await cpuEmbedder.embed(TEXTS), 128) < 0.999);
  });

  test('rerank scores (the pair scorer\'s head) match ONNX Runtime\'s', async () => {
    const r = await Reranker.load(RERANKER, 'cuda', { cuda: { native, maxRows: 3, maxTokens: 600 } });
    assert.equal(r.provider, 'cuda');
    const got = await r.score(TEXTS[0]!, TEXTS.slice(1));
    const want = await cpuReranker.score(TEXTS[0]!, TEXTS.slice(1));
    assert.equal(got.scores.length, 4);
    got.scores.forEach((s, i) => assert.ok(Math.abs(s - want.scores[i]!) < 1e-3 * Math.max(1, Math.abs(want.scores[i]!)), `${s} vs ${want.scores[i]}`));
    assert.ok(Math.max(...want.scores) - Math.min(...want.scores) > 0.5, 'scores that differ');
    // A BertForSequenceClassification head (no scale): the pooler and the classifier alone.
    const p = graphParameters(readEncoderGraph(path.join(RERANKER, 'onnx', 'model.onnx')));
    p.params.delete('scale');
    assert.deepEqual(rerankHead(p, RERANKER), { head: 'classifier', numLabels: 1 });
  });

  test('tokenizer threads give the main thread\'s inputs: the same embeddings and scores', async () => {
    const texts = [...TEXTS, ...TEXTS.map((t) => t.toUpperCase())];
    const pooled = await Embedder.load(EMBEDDER, 'cuda', { cuda: { native }, tokenizerThreads: 2 });
    const plain = await Embedder.load(EMBEDDER, 'cuda', { cuda: { native } });
    assert.deepEqual(await pooled.embed(texts), await plain.embed(texts));
    const r = await Reranker.load(RERANKER, 'cuda', { cuda: { native }, tokenizerThreads: 2 });
    const rp = await Reranker.load(RERANKER, 'cuda', { cuda: { native } });
    const pairs = texts.map((t, i) => [texts[(i + 3) % texts.length]!, t] as const);
    assert.deepEqual(await r.scorePairs(pairs), await rp.scorePairs(pairs));
    for (const m of [pooled, plain, r, rp]) await m.release();
    await assert.rejects(pooled.embed(texts), /closed|released/);
  });

  test('all-MiniLM-L6-v2\'s int8 graph runs as ONNX Runtime runs it', { skip: !minilm && 'models/pretrained missing' }, async () => {
    const cpu = await Embedder.load(MINILM, 'cpu');
    const gpu = await Embedder.load(MINILM, 'cuda', { cuda: { native } });
    const texts = TEXTS.slice(0, 2);
    const got = await gpu.embed(texts), want = await cpu.embed(texts);
    assert.ok(worstCosine(got, want, 384) > 0.9999, `worst cosine ${worstCosine(got, want, 384)}`);
  });

  test('refused by name: a model that is not BERT, limits that cannot hold one input', async () => {
    const roberta = await editedCopy(EMBEDDER, (c) => (c['model_type'] = 'roberta'));
    await assert.rejects(Embedder.load(roberta, 'cuda', { cuda: { native } }), /model_type 'roberta'/);
    await assert.rejects(CudaEncoder.load(EMBEDDER, { role: 'embedder', maxSequence: 512, maxTokens: 256, native }), /RAGGUARD_CUDA_ENCODER_TOKENS 256 cannot hold one embedder input of 512 tokens/);
    const live = native.live;
    const wrongPlan: EncoderStandIn = { ...native, plan: (c) => native.plan(c).map((v, i) => (i === 1 ? v + 256 : v)) };
    await assert.rejects(CudaEncoder.load(EMBEDDER, { role: 'embedder', maxSequence: 512, native: wrongPlan }), /plan mismatch/);
    assert.equal(native.live, live, 'nothing allocated on a mismatch');
  });

  test('uploads: every tensor once, q/k/v of each layer apart (the device fuses them)', async () => {
    const s = standInEncoder();
    await CudaEncoder.load(RERANKER, { role: 'reranker', maxSequence: 256, native: s });
    const kinds = s.uploads.map((u) => `${EncoderTensor[u.kind]}:${u.layer}`);
    assert.equal(new Set(kinds).size, kinds.length);
    assert.equal(kinds.length, 5 + 2 * 16 + 5);
    assert.ok(kinds.includes('QueryWeight:1') && kinds.includes('ValueBias:0') && kinds.includes('Scale:0'));
    assert.equal(s.uploads.find((u) => u.kind === EncoderTensor.InterWeight)!.count, 512 * 128);
  });
});

describe('configuration', () => {
  test('RAGGUARD_EMBEDDER_EP=cuda selects the CUDA encoder; its runs and tokenizer threads are validated', () => {
    const c = loadConfig({ RAGGUARD_EMBEDDER_EP: 'cuda', RAGGUARD_RERANKER_EP: 'cuda', RAGGUARD_CUDA_ENCODER_ROWS: '64', RAGGUARD_TOKENIZER_THREADS: '3' });
    assert.deepEqual([c.providers.embedder, c.providers.reranker, c.providers.decoder], ['cuda', 'cuda', 'cpu']);
    assert.deepEqual([c.cudaEncoderRows, c.cudaEncoderTokens, c.tokenizerThreads], [64, 16384, 3]);
    assert.equal(loadConfig({}).tokenizerThreads, 'auto');
    assert.throws(() => loadConfig({ RAGGUARD_CUDA_ENCODER_TOKENS: '256', RAGGUARD_TOKENIZER_THREADS: 'many' }),
      (e: Error) => /RAGGUARD_CUDA_ENCODER_TOKENS: expected an integer in \[512/.test(e.message) && /RAGGUARD_TOKENIZER_THREADS/.test(e.message));
  });
});

describe('accounting', () => {
  test('the CUDA encoder\'s stages predict no workspace; its device bytes are the plan\'s', async () => {
    const dims = { numLayers: 2, hiddenSize: 128, numHeads: 4, intermediateSize: 512 };
    const decoder = { numLayers: 2, hiddenSize: 64, numHeads: 4, numKvHeads: 2, headDim: 16, intermediateSize: 128, vocabSize: 100 };
    const shape = { queryTokens: 20, topK: 20, rerankTopN: 5, pairTokens: 256, promptTokens: 200, maxNewTokens: 16 };
    const onCpu = new MemoryModel(dims, decoder, 16, 16).predict(shape);
    const onGpu = new MemoryModel(dims, decoder, 16, 16, { embed: true, rerank: true }).predict(shape);
    assert.ok(onCpu.stages.embed > 0 && onCpu.stages.rerank > 0);
    assert.equal(onGpu.stages.embed, 0);
    assert.equal(onGpu.stages.rerank, 0);
    assert.equal(onGpu.stages.prefill, onCpu.stages.prefill);
  });

  test('/debug/memory lists the encoders with the native accountant\'s figures; the budget counts them', async () => {
    const native = standInEncoder();
    const cfg = testConfig({ RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, ['apt-cache']) });
    const base = await loadModels({ ...cfg, providers: { ...cfg.providers, embedder: 'cpu', reranker: 'cpu' } });
    const limits = { native, maxRows: 16, maxTokens: 2048 };
    const embedder = await Embedder.load(EMBEDDER, 'cuda', { cuda: limits });
    const reranker = await Reranker.load(RERANKER, 'cuda', { cuda: limits });
    const host = { bytes: 1000, hostBytes: 1000, deviceBytes: 0 };
    const loads = { ...base.loads, embedder: encoderLoadBytes(embedder, host), reranker: encoderLoadBytes(reranker, host) };
    const plan = (embedder.device as CudaEncoder).plan;
    assert.equal(embedder.device!.deviceBytes, plan.total);
    assert.equal(loads.embedder.deviceBytes, plan.total);
    assert.equal(loads.embedder.bytes, 1000 + plan.total);
    const service = await RagService.start({ ...cfg, profileRun: false }, { ...base, embedder, reranker, loads });
    try {
      assert.ok(service.weightBytes >= loads.embedder.bytes + loads.reranker.bytes);
      const m = memorySnapshot(service, new Admission({ concurrency: 4, maxQueue: 4, timeoutMs: 1000 }), { source: 'none', reason: 'test', at: Date.now() });
      const e = m.components.find((c) => c.name === 'embedder')!;
      assert.equal(e.bytes, loads.embedder.bytes);
      assert.match(e.detail!, new RegExp(`CUDA encoder \\(float16, embedding head\\): weights ${plan.weights}, activations ${plan.activations} \\(runs of 16 sequences, 2048 tokens\\)`));
      assert.match(m.components.find((c) => c.name === 'reranker')!.detail!, /CUDA encoder \(float16, pair head\)/);
      // A query through the service runs both on the device stand-in.
      const before = native.runs.length;
      const q = await service.query({ query: 'How do I see the candidate version of a package?', topK: 4, rerankTopN: 2, maxNewTokens: 2, temperature: 0 });
      assert.ok(q.citations.length > 0);
      assert.ok(native.runs.length >= before + 2, 'the query was embedded and its candidates reranked by the CUDA encoder');
      assert.equal(service.guard.model.predict(service.requestShape({ query: 'x', topK: 4, rerankTopN: 2, maxNewTokens: 2, temperature: 0 })).stages.rerank, 0);
    } finally {
      await service.close();
    }
  });
});
