/**
 * GGUF decoders on the CUDA backend, on the CPU (the device itself is checked by scripts/check-cuda.ts on
 * the GPU host): the plan of a GGUF file (shape from its metadata, norms and biases as dense loads, every
 * matrix a quantized segment in its own type, q|k|v and gate|up fused from segments, llama's q/k rows
 * marked to be put back), the runner uploading every segment packed to its planned size through the
 * stand-in library, the accountant's figures (the quantized bytes, not the dense ones), the server's
 * decoder accepting RAGGUARD_DECODER=<file.gguf> with the file's tokenizer and chat template, and the
 * refusals by name.
 */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { CudaDecoder } from '../src/backends/cuda/cuda-decoder.js';
import { loadConfig } from '../src/config/config.js';
import { cudaDecoderLimits } from '../src/service/bootstrap.js';
import { CudaModelRunner } from '../src/backends/cuda/cuda-runner.js';
import { planeOffsets } from '../src/backends/cuda/gguf-blocks.js';
import { planGguf, QUANT_TILE_BYTES } from '../src/backends/cuda/gguf-checkpoint.js';
import { CheckpointError, WeightKind, weightElems, type Checkpoint } from '../src/backends/cuda/hf-checkpoint.js';
import { planDevice } from '../src/backends/cuda/step-pack.js';
import { BlockManager } from '../src/generate/block-manager.js';
import { Engine } from '../src/generate/engine.js';
import { GGML, GGUF_TYPE, GgufFile, writeGguf, type GgufValue, type GgufValueType } from '../src/runtime/gguf.js';
import { standInCuda, TINY, writeTinyCheckpoint } from './cuda-standin.js';

const QWEN = 'models/pretrained/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf';
const SMOL = 'models/pretrained/SmolLM2-135M-Instruct.Q4_1.gguf';

function plan(file: string): Checkpoint {
  const f = GgufFile.open(file);
  try {
    return planGguf(f);
  } finally {
    f.close();
  }
}

/** Every quantized matrix's segments cover its output rows exactly once, in the area without overlap. */
function checkSegments(ck: Checkpoint): void {
  const q = ck.quant!;
  const c = ck.config;
  const H = c.hiddenSize, qw = c.numHeads * c.headDim, kv = c.numKvHeads * c.headDim, I = c.intermediateSize;
  const rowsOf: Record<number, number> = { [WeightKind.embed]: c.vocabSize, [WeightKind.lmHead]: c.vocabSize, [WeightKind.qkv]: qw + 2 * kv, [WeightKind.o]: H, [WeightKind.gateUp]: 2 * I, [WeightKind.down]: H };
  const byMatrix = new Map<string, number[]>();
  let end = 0;
  for (const s of [...q.segments].sort((a, b) => a.offset - b.offset)) {
    assert.equal(s.offset % 256, 0);
    assert.ok(s.offset >= end, `${s.name} overlaps the segment before it`);
    assert.equal(s.packedBytes, planeOffsets(s.deviceType, s.rows, s.cols).bytes);
    end = s.offset + s.packedBytes;
    const key = `${s.kind}/${s.layer}`;
    const rows = byMatrix.get(key) ?? new Array<number>(rowsOf[s.kind]!).fill(0);
    for (let r = s.row0; r < s.row0 + s.rows; r++) rows[r]!++;
    byMatrix.set(key, rows);
    assert.equal(s.cols, s.kind === WeightKind.o ? qw : s.kind === WeightKind.down ? I : H, `${s.name}: its width`);
  }
  assert.ok(end <= q.bytes);
  for (const [key, rows] of byMatrix) assert.ok(rows.every((n) => n === 1), `matrix ${key}: every row once`);
  assert.equal(byMatrix.size, c.numLayers * 4 + 1 + (c.tieEmbeddings ? 0 : 1));
}

describe('GGUF decoders on the CUDA backend', () => {
  test('Qwen2.5-Coder-0.5B Q4_K_M: shape from the metadata, norms and biases dense, every matrix quantized in its own type', (t) => {
    if (!existsSync(QWEN)) return t.skip(`${QWEN} is not fetched (npm run setup)`);
    const ck = plan(QWEN);
    const c = ck.config;
    assert.equal(c.architecture, 'qwen2');
    assert.deepEqual([c.numLayers, c.hiddenSize, c.numHeads, c.numKvHeads, c.headDim, c.intermediateSize, c.vocabSize], [24, 896, 14, 2, 64, 4864, 151936]);
    assert.equal(c.qkvBias, true);
    assert.equal(c.tieEmbeddings, false); // the file has output.weight (Q8_0)
    assert.deepEqual(c.eosIds, [151645]); // <|im_end|>
    assert.equal(c.bosId, 151643);
    // Norms (2 a layer + the final) and q/k/v biases (3 a layer), float32 in the file.
    assert.equal(ck.loads.length, 24 * 5 + 1);
    assert.ok(ck.loads.every((l) => l.dtype === 'F32'));
    const segs = ck.quant!.segments;
    assert.equal(segs.length, 24 * 7 + 2);
    const types = new Set(segs.map((s) => s.ggmlType));
    for (const ty of [GGML.Q5_0, GGML.Q8_0, GGML.Q4_K, GGML.Q6_K]) assert.ok(types.has(ty), `a ${ty} segment`);
    assert.ok(segs.every((s) => s.unpermuteHeadDim === undefined), 'qwen2 is converted unpermuted');
    checkSegments(ck);
    // The device holds about the file's bytes, not float16's.
    const dense = weightElems(c, WeightKind.embed) * 2 * 2 + 24 * (weightElems(c, WeightKind.qkv) + weightElems(c, WeightKind.o) + weightElems(c, WeightKind.gateUp) + weightElems(c, WeightKind.down)) * 2;
    assert.ok(ck.quant!.bytes < ck.fileBytes * 1.05 && ck.quant!.bytes < dense / 2.5, `${ck.quant!.bytes} quantized bytes, file ${ck.fileBytes}, float16 ${dense}`);
    assert.equal(ck.quant!.tileBytes, QUANT_TILE_BYTES);
  });

  test('SmolLM2-135M Q4_1 (llama): q and k rows marked to be put back in rotate-half order, v and the rest not', (t) => {
    if (!existsSync(SMOL)) return t.skip(`${SMOL} is not fetched (npm run setup)`);
    const ck = plan(SMOL);
    assert.equal(ck.config.architecture, 'llama');
    assert.equal(ck.config.tieEmbeddings, true);
    for (const s of ck.quant!.segments) {
      const qk = /attn_[qk]\.weight$/.test(s.name);
      assert.equal(s.unpermuteHeadDim, qk ? ck.config.headDim : undefined, s.name);
    }
    checkSegments(ck);
  });

  test('the runner uploads every segment packed to its planned size; the accountant counts the quantized bytes', async (t) => {
    if (!existsSync(QWEN)) return t.skip(`${QWEN} is not fetched (npm run setup)`);
    const ck = plan(QWEN);
    const native = standInCuda(ck.config);
    const opts = { numBlocks: 64, blockSize: 16, maxBatchedTokens: 256, maxSeqs: 8 };
    const runner = await CudaModelRunner.load(QWEN, opts, native);
    try {
      assert.equal(native.created!.quantized, 1);
      assert.equal(native.created!.quant_bytes, ck.quant!.bytes);
      assert.equal(native.uploads.length, ck.quant!.segments.length);
      for (const [i, u] of native.uploads.entries()) {
        const s = ck.quant!.segments[i]!;
        assert.deepEqual([u.kind, u.layer, u.row0, u.rows, u.cols, u.offset, u.bytes], [s.kind, s.layer, s.row0, s.rows, s.cols, s.offset, s.packedBytes]);
      }
      const p = planDevice(ck.config, 'float16', CudaModelRunner.limitsFor(ck, opts), ck.quant);
      const dense = planDevice(ck.config, 'float16', CudaModelRunner.limitsFor(ck, opts));
      assert.equal(runner.memory().weights, p.weights);
      assert.ok(p.weights < dense.weights / 2.5);
      assert.equal(p.workspace - dense.workspace, ck.quant!.tileBytes);
      // The engine runs the file through the stand-in's steps.
      const bm = new BlockManager({ numBlocks: 64, blockSize: 16, watermark: 0.01, enablePrefixCaching: true });
      const engine = new Engine(runner, bm, { numBlocks: 64, blockSize: 16, maxNumSeqs: 8, maxNumBatchedTokens: 256 });
      const g = await engine.generate([10, 11, 12], { maxNewTokens: 3, temperature: 0, ignoreEos: true });
      assert.deepEqual(g.ids, [13, 14, 15].map((x) => x % ck.config.vocabSize));
    } finally {
      runner.close();
    }
  });

  test('quantized products: the tensor-core kernel by default, dequantized tiles when asked; GEMV rows set before the graphs are captured', async (t) => {
    if (!existsSync(QWEN)) return t.skip(`${QWEN} is not fetched (npm run setup)`);
    const ck = plan(QWEN);
    const opts = { numBlocks: 64, blockSize: 16, maxBatchedTokens: 256, maxSeqs: 8 };
    const plain = standInCuda(ck.config);
    (await CudaModelRunner.load(QWEN, opts, plain)).close();
    assert.equal(plain.created!.quant_gemm, 0);
    assert.deepEqual(plain.events, ['graphs']);
    const asked = standInCuda(ck.config);
    (await CudaModelRunner.load(QWEN, { ...opts, quantGemm: 'dequant', gemvRows: 2 }, asked)).close();
    assert.equal(asked.created!.quant_gemm, 1);
    // Graphs keep the product each batch size was captured with: the rows must be set first.
    assert.deepEqual(asked.events, ['gemv:2', 'graphs']);
  });

  test('the GEMV\'s products (half pairs, int8): asked of a GGUF decoder, set before the graphs; float (nothing set) by default; refused for a dense checkpoint', async (t) => {
    if (!existsSync(QWEN)) return t.skip(`${QWEN} is not fetched (npm run setup)`);
    const ck = plan(QWEN);
    const opts = { numBlocks: 64, blockSize: 16, maxBatchedTokens: 256, maxSeqs: 8 };
    const half = standInCuda(ck.config);
    (await CudaModelRunner.load(QWEN, { ...opts, qgemvMath: 'half2' }, half)).close();
    assert.deepEqual(half.events, ['qgemv-math:1', 'graphs']);
    const int8 = standInCuda(ck.config);
    (await CudaModelRunner.load(QWEN, { ...opts, qgemvMath: 'int8' }, int8)).close();
    assert.deepEqual(int8.events, ['qgemv-math:2', 'graphs']);
    const plain = standInCuda(ck.config);
    (await CudaModelRunner.load(QWEN, { ...opts, qgemvMath: 'float' }, plain)).close();
    assert.deepEqual(plain.events, ['graphs']);
    const dir = await mkdtemp(path.join(tmpdir(), 'rg-qgemv-math-'));
    try {
      await writeTinyCheckpoint(dir);
      const dense = standInCuda(TINY);
      await assert.rejects(CudaModelRunner.load(dir, { ...opts, qgemvMath: 'half2' }, dense), /for a GGUF decoder/);
      await assert.rejects(CudaModelRunner.load(dir, { ...opts, qgemvMath: 'int8' }, dense), /for a GGUF decoder/);
      assert.equal(dense.live, 0);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  test('RAGGUARD_CUDA_QGEMV as the server configures it: the library told for a GGUF decoder (dense and FP8 checkpoints: test/cuda-server.test.ts)', async (t) => {
    if (!existsSync(QWEN)) return t.skip(`${QWEN} is not fetched (npm run setup)`);
    assert.throws(() => loadConfig({ RAGGUARD_CUDA_QGEMV: 'int4' }), /RAGGUARD_CUDA_QGEMV/);
    const events = async (model: string, config: Record<string, unknown>, qgemv?: string) => {
      const c = loadConfig({ RAGGUARD_DECODER: model, RAGGUARD_DECODER_EP: 'cuda', ...(qgemv ? { RAGGUARD_CUDA_QGEMV: qgemv } : {}) });
      const lib = standInCuda(config);
      const decoder = await CudaDecoder.open(model, cudaDecoderLimits(c), lib);
      decoder.createRunner(16).close();
      // /healthz's run path names the GEMV's products as they were asked.
      assert.match(decoder.runtime().run_path, new RegExp(`, GGUF blocks \\(GEMV ${c.cudaQgemv}, wide products ${c.cudaQgemm}\\)$`));
      return lib.events.filter((e) => e.startsWith('qgemv-math'));
    };
    const cfg = plan(QWEN).config as unknown as Record<string, unknown>;
    assert.deepEqual(await events(QWEN, cfg, 'int8'), ['qgemv-math:2']);
    assert.deepEqual(await events(QWEN, cfg, 'half2'), ['qgemv-math:1']);
    assert.deepEqual(await events(QWEN, cfg, 'float'), []);
    const byDefault = loadConfig({}).cudaQgemv;
    assert.deepEqual(await events(QWEN, cfg), byDefault === 'float' ? [] : [`qgemv-math:${byDefault === 'int8' ? 2 : 1}`]);
  });

  test('RAGGUARD_CUDA_QGEMM: the wide products of a GGUF decoder as asked (int8 tensor cores or the 16-bit tiles), named in the run path', async (t) => {
    if (!existsSync(QWEN)) return t.skip(`${QWEN} is not fetched (npm run setup)`);
    assert.throws(() => loadConfig({ RAGGUARD_CUDA_QGEMM: 'dequant' }), /RAGGUARD_CUDA_QGEMM/);
    const cfg = plan(QWEN).config as unknown as Record<string, unknown>;
    const created = async (qgemm?: string) => {
      const c = loadConfig({ RAGGUARD_DECODER: QWEN, RAGGUARD_DECODER_EP: 'cuda', ...(qgemm ? { RAGGUARD_CUDA_QGEMM: qgemm } : {}) });
      const lib = standInCuda(cfg);
      const decoder = await CudaDecoder.open(QWEN, cudaDecoderLimits(c), lib);
      decoder.createRunner(16).close();
      assert.match(decoder.runtime().run_path, new RegExp(`wide products ${c.cudaQgemm}\\)$`));
      return lib.created!.quant_gemm;
    };
    assert.equal(await created('int8'), 2);
    assert.equal(await created('mma'), 0);
    assert.equal(await created(), loadConfig({}).cudaQgemm === 'int8' ? 2 : 0);
  });

  test('RAGGUARD_DECODER=<file.gguf> on cuda: the decoder opens with the file\'s tokenizer and chat template, its budget figures from the quantized plan', async (t) => {
    if (!existsSync(QWEN)) return t.skip(`${QWEN} is not fetched (npm run setup)`);
    const ck = plan(QWEN);
    const d = await CudaDecoder.open(QWEN, { blockSize: 16, maxBatchedTokens: 256, maxSeqs: 8 }, standInCuda(ck.config));
    try {
      assert.equal(d.dtype, 'float16');
      assert.equal(d.shape.numLayers, 24);
      assert.match(String(d.tokenizer.config.chat_template), /im_start/);
      const ids = d.tokenizer.encode('<|im_start|>user\nhello<|im_end|>');
      assert.equal(ids[0], 151644); // <|im_start|> whole, as a control token
      assert.ok(d.staticBytes() > ck.quant!.bytes && d.staticBytes() < ck.quant!.bytes + 200 * 2 ** 20);
      const runner = d.createRunner(32);
      assert.equal(CudaDecoder.loadBytes(runner).deviceBytes, runner.memory().total - runner.memory().kv_pool);
    } finally {
      d.close();
    }
  });

  describe('refusals by name', () => {
    let dir = '';
    before(async () => { dir = await mkdtemp(path.join(tmpdir(), 'ragguard-cuda-gguf-')); });
    after(async () => { await rm(dir, { recursive: true, force: true }); });
    const U32 = { type: GGUF_TYPE.U32 };
    const meta = (arch: string): [string, GgufValueType, GgufValue][] => [
      ['general.architecture', { type: GGUF_TYPE.STRING }, arch],
      [`${arch}.block_count`, U32, 1], [`${arch}.context_length`, U32, 64], [`${arch}.embedding_length`, U32, 256],
      [`${arch}.feed_forward_length`, U32, 256], [`${arch}.attention.head_count`, U32, 4], [`${arch}.attention.head_count_kv`, U32, 2],
      [`${arch}.attention.layer_norm_rms_epsilon`, { type: GGUF_TYPE.F32 }, 1e-5],
    ];
    const file = async (name: string, arch: string, type: number, bytes: number) => {
      const p = path.join(dir, name);
      await writeFile(p, writeGguf(meta(arch), [{ name: 'token_embd.weight', dims: [256, 32], type, data: new Uint8Array(bytes) }]));
      return p;
    };

    test('another architecture', async () => {
      const p = await file('gemma.gguf', 'gemma', GGML.F32, 256 * 32 * 4);
      await assert.rejects(CudaDecoder.open(p, { blockSize: 16, maxBatchedTokens: 64, maxSeqs: 2 }, standInCuda({ model_type: 'qwen2', vocab_size: 32, hidden_size: 256, intermediate_size: 256, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2 })),
        (e: Error) => e instanceof CheckpointError && /architecture 'gemma' is not supported by the CUDA backend/.test(e.message));
    });

    test('a block type the device does not keep (Q5_K)', () => {
      const p = path.join(dir, 'q5k.gguf');
      return writeFile(p, writeGguf(meta('qwen2'), [{ name: 'token_embd.weight', dims: [256, 32], type: 13, data: new Uint8Array(176 * 32) }])).then(() => {
        assert.throws(() => plan(p), (e: Error) => e instanceof CheckpointError && /Q5_K is not supported by the CUDA backend/.test(e.message));
      });
    });

    test('a file that lacks the layers its metadata promises', async () => {
      const p = await file('short.gguf', 'llama', GGML.Q8_0, 34 * 8 * 32);
      assert.throws(() => plan(p), (e: Error) => e instanceof CheckpointError && /lacks \d+ tensors, e\.g\. output_norm\.weight|lacks \d+ tensors/.test(e.message));
    });
  });
});
