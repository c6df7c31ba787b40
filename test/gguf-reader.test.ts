/**
 * GGUF's reader and blocks: every metadata type, alignment and tensor infos read back as written,
 * dequantization of each block type, and the MatMulNBits blocks the converter writes for each type
 * (against ONNX Runtime's own MatMulNBits, float and int8 products). The decoders built from GGUF files are
 * gguf.test.ts's.
 */
import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, test } from 'node:test';
import * as ort from 'onnxruntime-node';
import { toBlocks } from '../src/backends/ort/convert/gguf-weights.js';
import type { BlockWeight } from '../src/backends/ort/convert/gqa-builder.js';
import { dequantize, GGML, GGUF_TYPE, GgufFile, writeGguf, type GgufValue, type GgufValueType } from '../src/runtime/gguf.js';
import { int64s, ONNX_FLOAT, ONNX_UINT8, writeModel, type Initializer, type NodeSpec } from '../src/runtime/onnx-proto.js';
import { seededRandom } from '../src/generate/sampler.js';
import { tempDir } from './helpers.js';

/** A seeded generator (the sampler's mulberry32): the same bytes every run. */
const rng = seededRandom;

function half(x: number): [number, number] {
  // Halves in [2^-14, 2): exact encodings for the scales the tests use.
  const f = new Float32Array([x]);
  const u = new Uint32Array(f.buffer)[0]!;
  const e = ((u >> 23) & 0xff) - 127 + 15;
  const h = ((u >> 16) & 0x8000) | (e << 10) | ((u >> 13) & 0x3ff);
  return [h & 0xff, h >> 8];
}

/** Random stored blocks of a type, with small sane f16 scales. */
function randomBlocks(type: number, elems: number, r: () => number): Uint8Array {
  const spec: Record<number, { per: number; bytes: number; halves: number[] }> = {
    [GGML.Q4_0]: { per: 32, bytes: 18, halves: [0] },
    [GGML.Q4_1]: { per: 32, bytes: 20, halves: [0, 2] },
    [GGML.Q5_0]: { per: 32, bytes: 22, halves: [0] },
    [GGML.Q8_0]: { per: 32, bytes: 34, halves: [0] },
    [GGML.Q4_K]: { per: 256, bytes: 144, halves: [0, 2] },
    [GGML.Q6_K]: { per: 256, bytes: 210, halves: [208] },
  };
  const s = spec[type]!;
  const out = new Uint8Array((elems / s.per) * s.bytes);
  for (let i = 0; i < out.length; i++) out[i] = Math.floor(r() * 256);
  for (let b = 0; b < elems / s.per; b++) {
    for (const h of s.halves) {
      const [lo, hi] = half((r() - 0.5) * 0.02 + (h === 2 && type === GGML.Q4_1 ? -0.05 : 0.01));
      out[b * s.bytes + h] = lo;
      out[b * s.bytes + h + 1] = hi;
    }
  }
  return out;
}

const QUANT_TYPES = [['Q4_0', GGML.Q4_0], ['Q4_1', GGML.Q4_1], ['Q5_0', GGML.Q5_0], ['Q8_0', GGML.Q8_0], ['Q4_K', GGML.Q4_K], ['Q6_K', GGML.Q6_K]] as const;

describe('GGUF reader', () => {
  test('reads back every metadata type, the alignment and the tensors', async () => {
    const meta: [string, GgufValueType, GgufValue][] = [
      ['general.alignment', { type: GGUF_TYPE.U32 }, 64],
      ['u8', { type: GGUF_TYPE.U8 }, 200], ['i8', { type: GGUF_TYPE.I8 }, -100], ['u16', { type: GGUF_TYPE.U16 }, 60000],
      ['i16', { type: GGUF_TYPE.I16 }, -30000], ['i32', { type: GGUF_TYPE.I32 }, -(2 ** 31)], ['f32', { type: GGUF_TYPE.F32 }, 0.5],
      ['bool', { type: GGUF_TYPE.BOOL }, true], ['str', { type: GGUF_TYPE.STRING }, 'naïve 🙂'],
      ['u64', { type: GGUF_TYPE.U64 }, 2n ** 63n], ['i64', { type: GGUF_TYPE.I64 }, -5], ['f64', { type: GGUF_TYPE.F64 }, Math.PI],
      ['strs', { type: GGUF_TYPE.ARRAY, elemType: GGUF_TYPE.STRING }, ['a', '', 'Ġb']],
      ['ints', { type: GGUF_TYPE.ARRAY, elemType: GGUF_TYPE.I32 }, [1, -2, 3]],
    ];
    const a = new Float32Array([1, 2, 3]);
    const b = Uint8Array.from([0x00, 0x3c, 0x00, 0xc0]); // f16 1, -2
    const dir = await tempDir('ragguard-gguf-');
    const file = path.join(dir, 'x.gguf');
    await writeFile(file, writeGguf(meta, [
      { name: 'a', dims: [3], type: GGML.F32, data: new Uint8Array(a.buffer) },
      { name: 'b', dims: [2, 1], type: GGML.F16, data: b },
    ]));
    const f = GgufFile.open(file);
    try {
      assert.equal(f.version, 3);
      assert.equal(f.alignment, 64);
      for (const [k, , v] of meta) assert.deepEqual(f.get(k), v, k);
      assert.equal(f.metadataTypes.get('strs')?.elemType, GGUF_TYPE.STRING);
      assert.equal(f.dataOffset % 64, 0);
      assert.equal(f.need('b').offset % 64, 0);
      assert.deepEqual([...f.floats(f.need('a'))], [1, 2, 3]);
      assert.deepEqual([...f.floats(f.need('b'))], [1, -2]);
      assert.deepEqual(f.need('b').dims, [2, 1]);
    } finally {
      f.close();
    }
    await writeFile(path.join(dir, 'bad.gguf'), Buffer.from('GGML\x03\x00\x00\x00'));
    assert.throws(() => GgufFile.open(path.join(dir, 'bad.gguf')), /not a GGUF file/);
  });

  test('dequantizes Q4_0 with element j in the low nibble and j + 16 in the high one of byte j', () => {
    const block = new Uint8Array(18);
    [block[0], block[1]] = half(0.5);
    for (let j = 0; j < 16; j++) block[2 + j] = (j & 0x0f) | ((15 - j) << 4);
    const v = dequantize(GGML.Q4_0, block, 32);
    for (let j = 0; j < 16; j++) {
      assert.equal(v[j], (j - 8) * 0.5);
      assert.equal(v[j + 16], (15 - j - 8) * 0.5);
    }
    assert.equal(dequantize(GGML.BF16, Uint8Array.from([0x80, 0x3f]), 1)[0], 1);
    // Q5_0: the nibbles as Q4_0's, the 5th bit of element j bit j of the little-endian u32 qh.
    const q5 = new Uint8Array(22);
    [q5[0], q5[1]] = half(0.25);
    const qh = 0x8000_0001 | (1 << 16); // elements 0, 16 and 31
    for (let i = 0; i < 4; i++) q5[2 + i] = (qh >>> (8 * i)) & 0xff;
    for (let j = 0; j < 16; j++) q5[6 + j] = (j & 0x0f) | ((15 - j) << 4);
    const v5 = dequantize(GGML.Q5_0, q5, 32);
    for (let j = 0; j < 16; j++) {
      assert.equal(v5[j], ((j | (j === 0 ? 16 : 0)) - 16) * 0.25, `Q5_0 [${j}]`);
      assert.equal(v5[j + 16], (((15 - j) | (j === 0 || j === 15 ? 16 : 0)) - 16) * 0.25, `Q5_0 [${j + 16}]`);
    }
    assert.throws(() => dequantize(13, new Uint8Array(176), 256, 'w'), /Q5_K is not supported/);
  });

  for (const [name, type] of QUANT_TYPES) {
    test(`${name}: MatMulNBits blocks are the dequantized weights, and ONNX Runtime's product is the float one`, async () => {
      const r = rng(type + 1);
      const n = 8;
      const k = 512;
      const raw = randomBlocks(type, n * k, r);
      const w = dequantize(type, raw, n * k);
      const b = toBlocks(type, raw, n, k)!;
      // The blocks' own reading, (q - zp) * scale + min, element by element.
      const nb = k / b.blockSize;
      for (let row = 0; row < n; row++) {
        for (let i = 0; i < k; i++) {
          const blk = row * nb + Math.floor(i / b.blockSize);
          const pos = i % b.blockSize;
          const q = b.bits === 8 ? b.data[blk * b.blockSize + pos]! : (b.data[blk * 16 + (pos >> 1)]! >> ((pos & 1) * 4)) & 0x0f;
          const v = (q - zeroPoint(b, row, Math.floor(i / b.blockSize))) * b.scales[blk]! + (b.mins?.[blk] ?? 0);
          assert.ok(Math.abs(v - w[row * k + i]!) <= 1e-6 * Math.max(1, Math.abs(v)), `${name} [${row}, ${i}]: ${v} vs ${w[row * k + i]}`);
        }
      }
      const x = Float32Array.from({ length: 3 * k }, () => r() * 2 - 1);
      const y = await runNbits(b, x, 3);
      for (let m = 0; m < 3; m++) {
        for (let o = 0; o < n; o++) {
          let s = 0;
          for (let i = 0; i < k; i++) s += x[m * k + i]! * w[o * k + i]!;
          assert.ok(Math.abs(y[m * n + o]! - s) < 1e-3 * Math.max(1, Math.abs(s)), `${name} y[${m}, ${o}] ${y[m * n + o]} vs ${s}`);
        }
      }
    });
  }
  for (const [name, type] of [['Q4_1', GGML.Q4_1], ['Q4_K', GGML.Q4_K]] as const) {
    test(`${name}: zero points at each block's own zero, so that x quantized to int8 (accuracy level 4) errs as little as the weights allow`, async () => {
      const r = rng(type + 7);
      const n = 16;
      const k = 1024;
      const raw = randomBlocks(type, n * k, r);
      if (type === GGML.Q4_1) {
        // Trained weights lie about zero: each block's zero near the middle of its 16 steps.
        for (let blk = 0; blk < (n * k) / 32; blk++) {
          const d = 0.005 + 0.01 * r();
          [raw[blk * 20], raw[blk * 20 + 1]] = half(d);
          [raw[blk * 20 + 2], raw[blk * 20 + 3]] = half(-d * (6 + 3 * r()));
        }
      }
      const w = dequantize(type, raw, n * k);
      const b = toBlocks(type, raw, n, k)!;
      const nb = k / b.blockSize;
      // The same weights with the zero points at 0, the whole offset in the min term (as ggml stores them).
      const uncentred: BlockWeight = {
        ...b, zeroPoints: new Uint8Array(b.zeroPoints!.length),
        mins: b.mins!.map((mn, i) => mn - zeroPoint(b, Math.floor(i / nb), i % nb) * b.scales[i]!),
      };
      for (let row = 0; row < n; row++) {
        for (let j = 0; j < nb; j++) {
          const i = row * nb + j;
          const z = zeroPoint(b, row, j);
          // Each block's rest of the min within half a step, unless its zero lies outside 0..15.
          if (z > 0 && z < 15) assert.ok(Math.abs(b.mins![i]!) <= b.scales[i]! / 2 + 1e-7, `${name} block ${i}: rest ${b.mins![i]} of step ${b.scales[i]}`);
        }
      }
      // Activations with a few outliers, as a down projection's input has.
      const m = 4;
      const x = Float32Array.from({ length: m * k }, (_v, i) => (r() * 2 - 1) * (i % 97 === 0 ? 40 : 1));
      const exact = new Float64Array(m * n);
      for (let a = 0; a < m; a++) for (let o = 0; o < n; o++) for (let i = 0; i < k; i++) exact[a * n + o]! += x[a * k + i]! * w[o * k + i]!;
      const rms = (y: Float32Array) => Math.sqrt(y.reduce((acc, v, i) => acc + (v - exact[i]!) ** 2, 0) / y.length);
      const centredErr = rms(await runNbits(b, x, m, 4));
      const uncentredErr = rms(await runNbits(uncentred, x, m, 4));
      // Random Q4_K scales and mins put many blocks' zeros outside 0..15 (clamped): there, no worse.
      const bound = type === GGML.Q4_1 ? 0.7 : 1;
      assert.ok(centredErr < bound * uncentredErr, `${name}: int8 products err ${centredErr} centred, ${uncentredErr} with zero points at 0`);
    });
  }
});

/**
 * Block j of row `row`'s zero point as MatMulNBits reads it: one byte a block at 8 bits, two a byte at 4
 * (the even block's in the low nibble), the default 2^(bits - 1) where the blocks carry none.
 */
function zeroPoint(b: BlockWeight, row: number, j: number): number {
  const nb = b.k / b.blockSize;
  if (!b.zeroPoints) return 2 ** (b.bits - 1);
  if (b.bits === 8) return b.zeroPoints[row * nb + j]!;
  return (b.zeroPoints[row * Math.ceil(nb / 2) + (j >> 1)]! >> ((j & 1) * 4)) & 0x0f;
}

/**
 * x [m, k] through a MatMulNBits graph of `b` as gqa-builder.ts writes it (weights-only source, 'nbits'), x
 * float32 in the product (accuracy level 0) or quantized to int8 per block (level 4, as the builder runs it).
 */
async function runNbits(b: BlockWeight, x: Float32Array, m: number, accuracyLevel: 0 | 4 = 0): Promise<Float32Array> {
  // The builder's own nodes, through its lm_head: a source whose embedding is these blocks, one layer-free graph is
  // too much machinery here, so the MatMulNBits and min term are written as the builder writes them.
  const nb = b.k / b.blockSize;
  const inits: Initializer[] = [
    { name: 'B', dataType: ONNX_UINT8, dims: [b.n, nb, (b.blockSize * b.bits) / 8], data: b.data },
    { name: 'S', dataType: ONNX_FLOAT, dims: [b.n, nb], data: new Uint8Array(b.scales.buffer) },
  ];
  const ins = ['x', 'B', 'S'];
  if (b.zeroPoints) {
    inits.push({ name: 'Z', dataType: ONNX_UINT8, dims: [b.n, Math.ceil((nb * b.bits) / 8)], data: b.zeroPoints });
    ins.push('Z');
  }
  const nodes: NodeSpec[] = [{ op: 'MatMulNBits', domain: 'com.microsoft', inputs: ins, outputs: [b.mins ? 'yq' : 'y'],
    attrs: { K: { int: b.k }, N: { int: b.n }, bits: { int: b.bits }, block_size: { int: b.blockSize }, accuracy_level: { int: accuracyLevel } } }];
  if (b.mins) {
    const minsT = new Float32Array(nb * b.n);
    for (let r = 0; r < b.n; r++) for (let j = 0; j < nb; j++) minsT[j * b.n + r] = b.mins[r * nb + j]!;
    inits.push({ name: 'M', dataType: ONNX_FLOAT, dims: [nb, b.n], data: new Uint8Array(minsT.buffer) }, int64s('shape', [0n, BigInt(nb), BigInt(b.blockSize)]), int64s('last', [-1n]));
    nodes.push({ op: 'Reshape', inputs: ['x', 'shape'], outputs: ['xb'] }, { op: 'ReduceSum', inputs: ['xb', 'last'], outputs: ['xs'], attrs: { keepdims: { int: 0 } } },
      { op: 'MatMul', inputs: ['xs', 'M'], outputs: ['ym'] }, { op: 'Add', inputs: ['yq', 'ym'], outputs: ['y'] });
  }
  const model = writeModel({ name: 't', nodes, initializers: inits, inputs: [{ name: 'x', elemType: ONNX_FLOAT, dims: [m, b.k] }],
    outputs: [{ name: 'y', elemType: ONNX_FLOAT, dims: [m, b.n] }], opsets: { '': 17, 'com.microsoft': 1 } });
  const s = await ort.InferenceSession.create(model);
  const out = await s.run({ x: new ort.Tensor('float32', x, [m, b.k]) });
  const y = out['y']!.data as Float32Array;
  await s.release();
  return y;
}

/** GPT-2's byte -> printable character map, for a byte-level vocabulary. */
