/**
 * The server with its decoder on the CUDA backend (RAGGUARD_DECODER_EP=cuda), on the CPU: the shipped
 * decoder written as a Hugging Face checkpoint (scripts/export-hf-checkpoint.ts) and opened by the CUDA
 * decoder over a stand-in for the native library (test/cuda-standin.ts). What is checked is the server's
 * side: the budget and /debug/memory take the native accountant's figures, the engine's steps reach the
 * runner, replies and streams work, and what this backend cannot do is refused by name. The device
 * itself is checked against torch on the GPU host (scripts/check-cuda.ts).
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { before, describe, test } from 'node:test';
import type { Express } from 'express';
import request from 'supertest';
import { cudaBackend } from '../src/backends/cuda/binding.js';
import { CudaDecoder } from '../src/backends/cuda/cuda-decoder.js';
import { CudaModelRunner, CudaUnavailableError } from '../src/backends/cuda/cuda-runner.js';
import { CheckpointError } from '../src/backends/cuda/hf-checkpoint.js';
import { loadConfig, type Config } from '../src/config/config.js';
import { cudaDecoderLimits, loadModels, RagService } from '../src/service/rag.js';
import { createApp } from '../src/server/app.js';
import { ROOT, smallCorpus, tempDir, testConfig } from './helpers.js';
import { standInCuda, type StandIn } from './cuda-standin.js';

const DOCS = ['task-scheduling-cron-atd', 'apt-cache', 'quotas'];
let checkpoint: string;
let cfg: Config;
let native: StandIn;
let service: RagService;
let app: Express;

before(async () => {
  checkpoint = path.join(await tempDir('ragguard-hf-'), 'decoder');
  execFileSync(process.execPath, ['--import', 'tsx', 'scripts/export-hf-checkpoint.ts', 'models/decoder', checkpoint], { cwd: ROOT, stdio: 'pipe' });
  cfg = testConfig({ RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, DOCS), RAGGUARD_DECODER: checkpoint, RAGGUARD_DECODER_EP: 'cuda' });
  // The encoders as the tests run them; the decoder opened over the stand-in library.
  const base = await loadModels({ ...cfg, decoderPath: 'models/decoder-gqa', providers: { ...cfg.providers, decoder: 'cpu' } });
  native = standInCuda(JSON.parse(await readFile(path.join(checkpoint, 'config.json'), 'utf8')) as Record<string, unknown>);
  const decoder = await CudaDecoder.open(checkpoint, cudaDecoderLimits(cfg), native);
  service = await RagService.start(cfg, { ...base, decoder, loads: { ...base.loads, decoder: decoder.loadBytes() } });
  app = createApp(service);
});

describe('selecting the CUDA backend', () => {
  test('RAGGUARD_EXECUTION_PROVIDER=cuda puts the decoder on it and leaves the encoders to ONNX Runtime\'s first provider that loads', () => {
    const c = loadConfig({ RAGGUARD_EXECUTION_PROVIDER: 'cuda' });
    assert.deepEqual(c.providers, { embedder: 'auto', reranker: 'auto', decoder: 'cuda' });
    const own = loadConfig({ RAGGUARD_EXECUTION_PROVIDER: 'cuda', RAGGUARD_EMBEDDER_EP: 'cpu' });
    assert.equal(own.providers.embedder, 'cpu');
  });

  test('without CUDA, start-up stops with the reason and how to run without it; the CPU path is untouched', async () => {
    if (cudaBackend() !== null) return; // a GPU machine with the library built: scripts/check-cuda.ts covers it
    await assert.rejects(loadModels(cfg), (e: Error) => e instanceof CudaUnavailableError && /unavailable: .+RAGGUARD_DECODER_EP=cpu/s.test(e.message));
  });

  test('an ONNX export given to the CUDA backend is refused by name, not run as something else; a GGUF file is read (test/cuda-gguf.test.ts), a missing one named', async () => {
    await assert.rejects(CudaDecoder.open(path.join(ROOT, 'models/decoder'), { blockSize: 16, maxBatchedTokens: 64, maxSeqs: 2 }, native), CheckpointError);
    await assert.rejects(CudaDecoder.open('/x/model.gguf', { blockSize: 16, maxBatchedTokens: 64, maxSeqs: 2 }, native), /\/x\/model\.gguf: no such GGUF file/);
  });
});

describe('RAGGUARD_CUDA_WEIGHTS=fp8 as the server configures it', () => {
  // The decoder as bootstrap opens it (cudaDecoderLimits), over a fresh stand-in: which FP8 product the
  // library is told before the weights are registered, and the bytes the accountant plans for them.
  const opened = async (env: Record<string, string>) => {
    const c = loadConfig({ RAGGUARD_DECODER: checkpoint, RAGGUARD_DECODER_EP: 'cuda', RAGGUARD_CUDA_WEIGHTS: 'fp8', ...env });
    const lib = standInCuda(JSON.parse(await readFile(path.join(checkpoint, 'config.json'), 'utf8')) as Record<string, unknown>);
    const decoder = await CudaDecoder.open(checkpoint, cudaDecoderLimits(c), lib);
    const runner = decoder.createRunner(16);
    try {
      return { events: [...lib.events], runPath: decoder.runtime().run_path, planned: decoder.staticBytes(16), quantBytes: lib.created!.quant_bytes, segments: decoder.checkpoint.quant?.segments ?? [] };
    } finally {
      runner.close();
    }
  };

  test('by default wide FP8 products go through cuBLASLt (weights packed with a scale a row); RAGGUARD_CUDA_FP8_GEMM=tiles keeps the tiles', async () => {
    assert.equal(loadConfig({}).cudaFp8Gemm, 'cublaslt');
    assert.throws(() => loadConfig({ RAGGUARD_CUDA_FP8_GEMM: 'fast' }), /RAGGUARD_CUDA_FP8_GEMM/);
    const lt = await opened({});
    const tiles = await opened({ RAGGUARD_CUDA_FP8_GEMM: 'tiles' });
    assert.ok(lt.events.includes('fp8-gemm:1'), `the library was told: ${lt.events.slice(0, 3).join(', ')}`);
    assert.ok(!tiles.events.some((e) => e.startsWith('fp8-gemm')), 'the tiles need no call');
    // /healthz says what runs: FP8 weights and which wide product.
    assert.match(lt.runPath, /^cuda \w+, FP8 weights \(wide products: cublaslt\)$/);
    assert.match(tiles.runPath, /FP8 weights \(wide products: tiles\)$/);
    // A float scale a row after each segment's planes: registered, and planned by the accountant.
    assert.equal(lt.segments.length, tiles.segments.length);
    lt.segments.forEach((s, i) => assert.equal(s.packedBytes, tiles.segments[i]!.packedBytes + Math.ceil((s.rows * 4) / 256) * 256, s.name));
    assert.ok(lt.quantBytes > tiles.quantBytes);
    assert.equal(lt.planned - tiles.planned, lt.quantBytes - tiles.quantBytes);
  });

  test('RAGGUARD_CUDA_QGEMV is for GGUF decoders: an FP8 or dense checkpoint opens with it set and the library is not told', async () => {
    for (const weights of ['fp8', 'model']) {
      const { events, runPath } = await opened({ RAGGUARD_CUDA_WEIGHTS: weights, RAGGUARD_CUDA_QGEMV: 'int8' });
      assert.ok(!events.some((e) => e.startsWith('qgemv-math')), `${weights}: ${events.join(', ')}`);
      assert.doesNotMatch(runPath, /GEMV/);
    }
  });
});

describe('serving on the CUDA decoder', () => {
  test('a generation whose first token is end of sequence settles with no text (it never hangs)', async () => {
    // The stand-in answers (last token + 1) mod vocab: after token 1 comes 2, the decoder's EOS.
    const g = await service.engine.generate([5, 1], { maxNewTokens: 4, temperature: 0 });
    assert.deepEqual(g.ids, []);
    assert.equal(g.text, '');
    assert.equal(g.finishReason, 'stop');
  });

  test('/healthz says where each model runs', async () => {
    const res = await request(app).get('/healthz').expect(200);
    assert.deepEqual(res.body.providers, { embedder: 'cpu', reranker: 'cpu', decoder: 'cuda' });
    assert.match(res.body.decoder.run_path, /^cuda float16/);
  });

  test('a query is answered through the runner: its steps reach the native library, every block comes back', async () => {
    const before = native.steps.length;
    const res = await request(app).post('/query').send({ query: 'How do I set disk quotas for a user?', max_new_tokens: 6, temperature: 0 }).expect(200);
    assert.equal(res.body.usage.completion_tokens, 6);
    assert.ok(res.body.citations.length >= 1);
    // One prefill (the prompt fits max_num_batched_tokens) and five decode steps.
    assert.equal(native.steps.length - before, 6);
    await service.engine.idle();
    assert.equal(service.blocks.stats().usedBlocks, 0);
  });

  test('the budget and /debug/memory take the native accountant\'s figures: the decoder and its KV pool exactly', async () => {
    const runner = service.engine.runner as CudaModelRunner;
    const m = runner.memory();
    const pool = service.engine.pool;
    assert.equal(pool.location, 'device');
    assert.equal(pool.bytes, m.kv_pool);
    assert.equal(pool.numBlocks, service.blocks.stats().totalBlocks);
    assert.equal(service.loads.decoder.bytes, m.total - m.kv_pool - m.lora + m.host_pinned);
    // The LoRA slots are counted once, as the adapter slots.
    assert.ok(m.lora > 0);
    assert.equal(service.adapterSlotBytes, m.lora);
    // What the budget leaves for model runs is what is left once every allocated byte is counted.
    assert.equal(service.workspaceBytes, service.budget.budgetBytes - service.weightBytes - service.adapterSlotBytes - m.kv_pool - service.store.indexBytes - service.allocatorWarmBytes);
    const res = await request(app).get('/debug/memory').expect(200);
    const decoder = (res.body.components as { name: string; bytes: number; how: string; detail: string }[]).find((c) => c.name === 'decoder')!;
    assert.equal(decoder.how, 'exact');
    assert.equal(decoder.bytes, service.loads.decoder.bytes);
    assert.match(decoder.detail, new RegExp(`weights ${m.weights}.*workspace ${m.workspace}`));
  });

  test('the guard predicts nothing on top for the decoder\'s runs: they only use what start-up allocated', () => {
    const p = service.guard.model.predict({ queryTokens: 8, topK: 0, rerankTopN: 4, pairTokens: 0, promptTokens: 700, maxNewTokens: 64 });
    assert.equal(p.stages.prefill, 0);
    assert.equal(p.stages.decode, 0);
    assert.ok(p.kvBlocks > 0, 'its KV blocks still come from the pool');
  });

  test('a stream gets its tokens as the steps produce them', async () => {
    const res = await request(app).post('/query').send({ query: 'Where does apt keep its package lists?', max_new_tokens: 4, stream: true }).expect(200);
    assert.match(res.text, /data: /);
    assert.match(res.text, /"finish_reason":"length"/);
  });

  test('penalties are served on this backend (the device sampler applies them)', async () => {
    const pen = await request(app).post('/v1/completions').send({ model: 'decoder', prompt: 'Hello', max_tokens: 4, frequency_penalty: 0.5, repetition_penalty: 1.2 });
    assert.equal(pen.status, 200, JSON.stringify(pen.body));
    assert.equal(pen.body.usage.completion_tokens, 4);
  });

  test('a request naming an adapter runs with it in the device slots, beside base requests, and it is unloaded after', async () => {
    const [lora, base] = await Promise.all([
      request(app).post('/query').send({ query: 'What is apt?', max_new_tokens: 4, adapter: 'demo-r8' }),
      request(app).post('/query').send({ query: 'What is apt?', max_new_tokens: 4 }),
    ]);
    assert.equal(lora.status, 200, JSON.stringify(lora.body));
    assert.equal(lora.body.adapter.name, 'demo-r8');
    assert.equal(base.status, 200);
    await service.engine.idle();
    assert.equal(service.adapters.stats().loaded.length, 0, 'unloaded after its last request');
  });
});
