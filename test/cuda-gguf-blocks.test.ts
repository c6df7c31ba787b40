/**
 * The CUDA backend's device layout of GGUF blocks (gguf-blocks.ts), on the CPU: every type re-laid out
 * into planes and dequantized by the CPU reference of the device's kernel gives gguf.ts's dequantization
 * bit for bit, on random blocks of every type and on the tensors of the two GGUF files setup fetches; the
 * planes' offsets and sizes; llama's row un-permutation.
 */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { describe, test } from 'node:test';
import { dequantUnits, DEVICE_QUANT_TYPES, llamaUnpermutation, packMatrix, permuteRowBytes, planeOffsets, QuantLayoutError, unitLayout } from '../src/backends/cuda/gguf-blocks.js';
import { dequantize, GGML, GgufFile, ggmlTypeName, rowBytes } from '../src/runtime/gguf.js';
import { floatToHalf } from '../src/runtime/float16.js';

/** Random blocks of `type` for a [rows, cols] matrix, with finite half scales (as a quantizer writes them). */
function randomBlocks(type: number, rows: number, cols: number, seed: number): Uint8Array {
  let s = seed >>> 0;
  const rnd = () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) >>> 24);
  const n = rowBytes(type, cols) * rows;
  const b = new Uint8Array(n);
  for (let i = 0; i < n; i++) b[i] = rnd();
  const half = (at: number, scale: number) => {
    const h = floatToHalf(((rnd() - 128) / 128) * scale);
    b[at] = h & 255;
    b[at + 1] = h >> 8;
  };
  const blocks = (bytes: number) => n / bytes;
  switch (type) {
    case GGML.F32: {
      const dv = new DataView(b.buffer);
      for (let i = 0; i < rows * cols; i++) dv.setFloat32(4 * i, (rnd() - 128) / 37, true);
      break;
    }
    case GGML.F16: for (let i = 0; i < rows * cols; i++) half(2 * i, 3); break;
    case GGML.BF16: for (let i = 0; i < rows * cols; i++) b[2 * i + 1] = 0x3f + (rnd() & 1) * 0x80; break;
    case GGML.Q8_0: for (let k = 0; k < blocks(34); k++) half(34 * k, 0.01); break;
    case GGML.Q4_0: for (let k = 0; k < blocks(18); k++) half(18 * k, 0.02); break;
    case GGML.Q4_1: for (let k = 0; k < blocks(20); k++) { half(20 * k, 0.02); half(20 * k + 2, 0.1); } break;
    case GGML.Q5_0: for (let k = 0; k < blocks(22); k++) half(22 * k, 0.01); break;
    case GGML.Q4_K: for (let k = 0; k < blocks(144); k++) { half(144 * k, 0.002); half(144 * k + 2, 0.003); } break;
    case GGML.Q6_K: for (let k = 0; k < blocks(210); k++) half(210 * k + 208, 0.001); break;
  }
  return b;
}

function sameBits(a: Float32Array, b: Float32Array, what: string): void {
  assert.equal(a.length, b.length, what);
  const ua = new Uint32Array(a.buffer, a.byteOffset, a.length), ub = new Uint32Array(b.buffer, b.byteOffset, b.length);
  for (let i = 0; i < a.length; i++) {
    // -0 and +0 are the same weight (a product of 0 and a negative scale).
    if (ua[i] !== ub[i] && !(a[i] === 0 && b[i] === 0)) assert.fail(`${what}: element ${i}: ${a[i]} (device reference) against ${b[i]} (gguf.ts)`);
  }
}

describe('GGUF blocks on the device', () => {
  for (const type of [...DEVICE_QUANT_TYPES, GGML.F32]) {
    test(`${ggmlTypeName(type)}: planes dequantize as gguf.ts dequantizes the blocks`, () => {
      const rows = 6, cols = 512;
      const raw = randomBlocks(type, rows, cols, 7 + type);
      const { type: dt, bytes } = packMatrix(type, raw, rows, cols);
      assert.equal(bytes.length, planeOffsets(dt, rows, cols).bytes);
      const ref = dequantize(type, raw, rows * cols);
      const mine = dequantUnits(dt, bytes, rows, cols);
      if (type === GGML.F32) {
        // Stored as halves: within half's rounding.
        for (let i = 0; i < ref.length; i++) assert.ok(Math.abs(mine[i]! - ref[i]!) <= Math.abs(ref[i]!) * 2 ** -11 + 2 ** -24, `element ${i}`);
      } else {
        sameBits(mine, ref, ggmlTypeName(type));
      }
    });
  }

  test('plane offsets are 256-byte aligned and a unit costs GGUF\'s bytes (Q4_K: its 12 scale bytes a super-block become 16)', () => {
    const rows = 3, cols = 1024;
    for (const t of DEVICE_QUANT_TYPES) {
      const o = planeOffsets(t, rows, cols);
      for (const x of [o.s, o.h, o.bytes]) assert.equal(x % 256, 0);
      const l = unitLayout(t);
      const perWeight = (l.q + l.s + l.h / 8) / 32;
      const gguf = rowBytes(t, cols) / cols;
      assert.ok(perWeight >= gguf && perWeight <= gguf + 0.5 / 32 + 1e-9, `${ggmlTypeName(t)}: ${perWeight} bytes a weight against GGUF's ${gguf}`);
    }
    assert.throws(() => packMatrix(GGML.Q4_K, new Uint8Array(144), 1, 128), QuantLayoutError);
    assert.throws(() => packMatrix(13 /* Q5_K */, new Uint8Array(176), 1, 256), /Q5_K is not supported by the CUDA backend/);
  });

  test('llama.cpp\'s q/k permutation (its converter\'s (n_head, 2, d/2) -> (n_head, d/2, 2)) is undone exactly', () => {
    const heads = 3, d = 8, rows = heads * d, rowLen = 5;
    const original = Uint8Array.from({ length: rows * rowLen }, (_, i) => (i * 7 + 3) & 255);
    // As convert_hf_to_gguf.py writes them: stored row h d + 2 i + j holds original row h d + j d/2 + i.
    const stored = new Uint8Array(original.length);
    for (let h = 0; h < heads; h++) for (let j = 0; j < 2; j++) for (let i = 0; i < d / 2; i++) {
      stored.set(original.subarray((h * d + j * (d / 2) + i) * rowLen, (h * d + j * (d / 2) + i + 1) * rowLen), (h * d + 2 * i + j) * rowLen);
    }
    assert.notDeepEqual([...stored], [...original]);
    assert.deepEqual([...permuteRowBytes(stored, rowLen, llamaUnpermutation(rows, d))], [...original]);
  });

  test('llama\'s q/k rows go back to rotate-half order, whole rows moved', () => {
    // Head of 4: stored rows (0, 2 | 1, 3) pair adjacently; transformers' row r comes from perm[r].
    assert.deepEqual([...llamaUnpermutation(8, 4)], [0, 2, 1, 3, 4, 6, 5, 7]);
    const raw = Uint8Array.from({ length: 8 * 3 }, (_, i) => Math.floor(i / 3));
    assert.deepEqual([...permuteRowBytes(raw, 3, llamaUnpermutation(8, 4))].filter((_, i) => i % 3 === 0), [0, 2, 1, 3, 4, 6, 5, 7]);
  });

  const files = ['models/pretrained/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf', 'models/pretrained/SmolLM2-135M-Instruct.Q4_1.gguf'];
  for (const p of files) {
    test(`${p}: every matrix type of the file, re-laid out, dequantizes as gguf.ts does`, (t) => {
      if (!existsSync(p)) return t.skip(`${p} is not fetched (npm run setup)`);
      const f = GgufFile.open(p);
      try {
        const seen = new Set<number>();
        for (const info of f.tensors.values()) {
          if (info.dims.length !== 2 || seen.has(info.type)) continue;
          seen.add(info.type);
          const cols = info.dims[0]!, rows = Math.min(info.dims[1]!, 48);
          const raw = f.raw(info).subarray(0, rowBytes(info.type, cols) * rows);
          const { type, bytes } = packMatrix(info.type, raw, rows, cols, info.name);
          sameBits(dequantUnits(type, bytes, rows, cols), dequantize(info.type, raw, rows * cols), info.name);
        }
        assert.ok(seen.size >= 2);
      } finally {
        f.close();
      }
    });
  }
});
