/**
 * RAGGUARD_CUDA_WEIGHTS=fp8 on the CPU (the device's quantization and products are checked on the GPU host):
 * the plan of a float16/bfloat16 checkpoint's matrices as FP8 segments (one per fused weight, 32 E4M3 bytes
 * and a float16 scale per 32 weights), registered before the tensors load so that the native side quantizes
 * them as they arrive; the accountant's figures; and the refusals: a GGUF file, widths FP8 units cannot cut,
 * checkpoints already quantized.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { CudaModelRunner } from '../src/backends/cuda/cuda-runner.js';
import { withFp8 } from '../src/backends/cuda/fp8-weights.js';
import { FP8_E4M3 } from '../src/backends/cuda/gguf-blocks.js';
import { CheckpointError, parseConfig, WeightKind, weightElems, type Checkpoint } from '../src/backends/cuda/hf-checkpoint.js';
import { planDevice } from '../src/backends/cuda/step-pack.js';
import { standInCuda } from './cuda-standin.js';

const RAW = {
  model_type: 'qwen2', vocab_size: 256, hidden_size: 64, intermediate_size: 96, num_hidden_layers: 2, num_attention_heads: 2,
  num_key_value_heads: 1, max_position_embeddings: 128, tie_word_embeddings: false, torch_dtype: 'bfloat16',
};

function checkpoint(raw: Record<string, unknown> = RAW): Checkpoint {
  const config = parseConfig(raw as Parameters<typeof parseConfig>[0]);
  return { dir: '/x/ckpt', config, loads: [], fileBytes: 0, invFreq: new Float32Array(config.headDim / 2) };
}

describe('FP8 weights (RAGGUARD_CUDA_WEIGHTS=fp8)', () => {
  test('every fused matrix is one FP8 segment: 32 E4M3 bytes and a float16 scale per 32 weights, 256-aligned', () => {
    const ck = withFp8(checkpoint());
    const q = ck.quant!;
    assert.equal(q.mode, 'fp8');
    assert.equal(q.segments.length, 2 + 2 * 4);
    let end = 0;
    for (const s of q.segments) {
      assert.equal(s.deviceType, FP8_E4M3);
      assert.equal(s.row0, 0);
      assert.equal(s.offset % 256, 0);
      assert.ok(s.offset >= end);
      const units = (s.rows * s.cols) / 32;
      assert.equal(s.packedBytes, Math.ceil((units * 32) / 256) * 256 + Math.ceil((units * 2) / 256) * 256);
      assert.equal(s.rows * s.cols, weightElems(ck.config, s.kind), `segment ${s.name} covers its weight`);
      end = s.offset + s.packedBytes;
    }
    assert.equal(q.bytes, end);
  });

  test('the runner registers each segment (no host data) before the tensors load; the accountant counts FP8 bytes, about half of bfloat16', () => {
    const ck = checkpoint();
    const native = standInCuda(ck.config);
    const opts = { numBlocks: 16, blockSize: 16, maxBatchedTokens: 64, maxSeqs: 4, weights: 'fp8' as const };
    const runner = CudaModelRunner.create(native, ck, { decode: () => '' }, opts);
    try {
      assert.equal(runner.dtype, 'bfloat16');
      assert.equal(native.created!.quantized, 2);
      const fp8 = withFp8(ck);
      assert.equal(native.created!.quant_bytes, fp8.quant!.bytes);
      assert.deepEqual(native.uploads.map((u) => [u.kind, u.layer, u.type, u.bytes, u.data]),
        fp8.quant!.segments.map((s) => [s.kind, s.layer, FP8_E4M3, s.packedBytes, false]));
      const limits = CudaModelRunner.limitsFor(ck, opts);
      const dense = planDevice(ck.config, 'bfloat16', limits);
      const mine = planDevice(ck.config, 'bfloat16', limits, fp8.quant);
      assert.equal(runner.memory().weights, mine.weights);
      assert.ok(mine.weights < dense.weights * 0.6, `${mine.weights} FP8 against ${dense.weights} bfloat16 bytes`);
      assert.ok(weightElems(ck.config, WeightKind.embed) > 0);
    } finally {
      runner.close();
    }
  });

  test('fp8Gemm cublaslt: the library told before the segments are registered; each segment keeps a float scale a row after its planes, counted', () => {
    const ck = checkpoint();
    const native = standInCuda(ck.config);
    const opts = { numBlocks: 16, blockSize: 16, maxBatchedTokens: 64, maxSeqs: 4, weights: 'fp8' as const, fp8Gemm: 'cublaslt' as const };
    const runner = CudaModelRunner.create(native, ck, { decode: () => '' }, opts);
    try {
      assert.equal(native.events[0], 'fp8-gemm:1');
      const plain = withFp8(ck), rows = withFp8(ck, { rowScales: true });
      assert.equal(native.created!.quant_bytes, rows.quant!.bytes);
      rows.quant!.segments.forEach((s, i) => {
        const p = plain.quant!.segments[i]!;
        assert.equal(s.packedBytes, p.packedBytes + Math.ceil((s.rows * 4) / 256) * 256, `${s.name}: its planes and a float a row`);
      });
      assert.deepEqual(native.uploads.map((u) => u.bytes), rows.quant!.segments.map((s) => s.packedBytes));
      assert.equal(runner.fp8GemmNote(), '');
    } finally {
      runner.close();
    }
    assert.throws(() => CudaModelRunner.create(standInCuda(ck.config), ck, { decode: () => '' }, { ...opts, weights: undefined }), /for FP8 weights/);
  });

  test('refused by name: a GGUF decoder, widths not whole 32-weight blocks, a checkpoint already quantized', () => {
    const gguf = { ...checkpoint(), quant: { mode: 'gguf' as const, segments: [], bytes: 0, tileBytes: 0 } };
    assert.throws(() => withFp8(gguf), (e: Error) => e instanceof CheckpointError && /a GGUF file keeps its own block types/.test(e.message));
    assert.throws(() => withFp8(checkpoint({ ...RAW, intermediate_size: 100 })), /multiples of 32/);
    assert.throws(() => parseConfig({ ...RAW, quantization_config: { quant_method: 'compressed-tensors', format: 'float-quantized' } } as Parameters<typeof parseConfig>[0]),
      (e: Error) => e instanceof CheckpointError && /quantization_config \(compressed-tensors, float-quantized\)/.test(e.message));
  });
});
