/**
 * ragguard's QMatMul8 and QMatMul4 ops (src/backends/ort/ragguard-ops.c, qmatmul.c) against ONNX
 * Runtime's own MatMulNBits (8 bits without zero points, 4 bits with them; accuracy level 4) on the same
 * values in one graph, and both against the exact product with the weights dequantized: the shapes a
 * converted GGUF has (blocks of 32 and 16, a bias, rows from 1 to past one tile of 8, and 33: AMX's 16-row
 * tiles where the CPU has AMX, and a row past them) and the ones at
 * the edges (K not a multiple of 64, columns not a multiple of 16, blocks longer than the kernels' loads
 * at a time); on the CPU's kernels and on the plain C path that CPUs without AVX512-VNNI take.
 */
import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { test } from 'node:test';
import { ONNX_FLOAT, ONNX_UINT8, writeModel, type Initializer } from '../src/runtime/onnx-proto.js';
import { qmatmul4Layout, qmatmul8Layout, type Qmatmul8Layout } from '../src/backends/ort/qmatmul-layout.js';
import { accountingUnavailable, installCountingAllocator } from '../src/backends/ort/ort-allocator.js';
import { DirectSession, ragguardOpsAmxBf16, ragguardOpsUnavailable, ragguardOpsVnni, setRagguardOpsPortable } from '../src/backends/ort/ort-direct.js';
import { tempDir, xorshift } from './helpers.js';

// Before the first session of this process, as the server installs it.
const counters = installCountingAllocator();


const floats = (name: string, dims: number[], v: Float32Array): Initializer => ({ name, dataType: ONNX_FLOAT, dims, data: new Uint8Array(v.buffer, v.byteOffset, v.byteLength) });

interface Case { bits: 4 | 8; k: number; n: number; blk: number; bias: boolean }

async function both(c: Case, rows: number, seed: number) {
  // (weights random over the whole byte range, scales positive: every lane and column in use)
  const r = xorshift(seed);
  const blocks = c.k / c.blk;
  // values over the whole range (0..255 at 8 bits, 0..15 at 4) and, at 4 bits, zero points 0..15 a block
  const values = Uint8Array.from({ length: c.n * c.k }, () => Math.floor(r() * (c.bits === 8 ? 256 : 16)));
  const zeros = Uint8Array.from({ length: c.n * blocks }, () => (c.bits === 8 ? 128 : Math.floor(r() * 16)));
  const d = Float32Array.from({ length: c.n * blocks }, () => 0.001 + r() * 0.02);
  const bias = Float32Array.from({ length: c.n }, () => r() - 0.5);
  // Activations with a few large entries, as a normed hidden state has.
  const x = Float32Array.from({ length: rows * c.k }, (_, i) => (r() - 0.5) * 4 * (i % 97 === 0 ? 20 : 1));
  // MatMulNBits' packing (4 bits: value 2i in the low nibble of byte i, zero points two a byte), and the
  // same 16 columns side by side for ragguard's op.
  const zpRow = Math.ceil(blocks / 2);
  const q = c.bits === 8 ? values : Uint8Array.from({ length: (c.n * c.k) / 2 }, (_, i) => values[2 * i]! | (values[2 * i + 1]! << 4));
  const zp = new Uint8Array(c.n * zpRow);
  for (let n = 0; n < c.n; n++) for (let b = 0; b < blocks; b++) zp[n * zpRow + (b >> 1)]! |= zeros[n * blocks + b]! << ((b & 1) * 4);
  const packed: Qmatmul8Layout & { offsets?: Float32Array } = c.bits === 8
    ? qmatmul8Layout({ n: c.n, k: c.k, blockSize: c.blk, data: q, scales: d })
    : qmatmul4Layout({ n: c.n, k: c.k, blockSize: c.blk, data: q, scales: d, zeroPoints: zp });
  const inits: Initializer[] = [
    { name: 'q', dataType: ONNX_UINT8, dims: [c.n, blocks, (c.blk * c.bits) / 8], data: q },
    floats('d', [c.n, blocks], d),
    { name: 'zp', dataType: ONNX_UINT8, dims: [c.n, zpRow], data: zp },
    { name: 'q16', dataType: ONNX_UINT8, dims: [packed.groups, (c.k * c.bits) / 32, 64], data: packed.q },
    floats('d16', [packed.groups, blocks, 16], packed.scales),
    ...(packed.offsets ? [floats('z16', [packed.groups, blocks, 16], packed.offsets)] : []),
    ...(c.bias ? [floats('bias', [c.n], bias)] : []),
  ];
  const attrs = { K: { int: c.k }, N: { int: c.n }, block_size: { int: c.blk } };
  const nbitsIns = ['x', 'q', 'd', ...(c.bits === 4 ? ['zp'] : []), ...(c.bias ? [...(c.bits === 4 ? [''] : ['', '']), 'bias'] : [])];
  const oursIns = ['x', 'q16', 'd16', ...(c.bits === 4 ? ['z16'] : []), ...(c.bias ? ['bias'] : [])];
  const model = writeModel({
    name: 'qmatmul',
    nodes: [
      { op: 'MatMulNBits', inputs: nbitsIns, outputs: ['y_ort'], domain: 'com.microsoft', attrs: { ...attrs, bits: { int: c.bits }, accuracy_level: { int: 4 } } },
      { op: `QMatMul${c.bits}`, inputs: oursIns, outputs: ['y'], domain: 'ragguard', attrs },
    ],
    initializers: inits,
    inputs: [{ name: 'x', elemType: ONNX_FLOAT, dims: ['rows', c.k] }],
    outputs: [{ name: 'y', elemType: ONNX_FLOAT, dims: ['rows', c.n] }, { name: 'y_ort', elemType: ONNX_FLOAT, dims: ['rows', c.n] }],
    opsets: { '': 17, 'com.microsoft': 1, ragguard: 1 },
  });
  const file = path.join(await tempDir('qmatmul8-'), 'model.onnx');
  await writeFile(file, model);
  const s = DirectSession.create(file, { intraOpThreads: 2 })!;
  try {
    const xt = s.tensor('float32', [rows, c.k]);
    (xt.data as Float32Array).set(x);
    const out = await s.run({ x: xt }, { y: null, y_ort: null });
    const y = Float32Array.from(out['y']!.data as Float32Array);
    const yOrt = Float32Array.from(out['y_ort']!.data as Float32Array);
    assert.deepEqual(out['y']!.dims, [rows, c.n]);
    for (const t of [xt, ...Object.values(out)]) t.dispose();
    // The exact product with the weights as stored (dequantized) and x unquantized.
    const exact = new Float64Array(rows * c.n);
    for (let i = 0; i < rows; i++) {
      for (let n = 0; n < c.n; n++) {
        let acc = c.bias ? bias[n]! : 0;
        for (let k = 0; k < c.k; k++) {
          const b = Math.floor(k / c.blk);
          acc += d[n * blocks + b]! * (values[n * c.k + k]! - zeros[n * blocks + b]!) * x[i * c.k + k]!;
        }
        exact[i * c.n + n] = acc;
      }
    }
    return { y, yOrt, exact };
  } finally {
    s.dispose();
  }
}

const maxDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
};
const rms = (a: ArrayLike<number>) => Math.sqrt(Array.from(a).reduce((s, v) => s + v * v, 0) / a.length);

for (const path_ of ['the CPU\'s kernel', 'the plain C path'] as const) test(`QMatMul8 and QMatMul4 on ${path_} compute what MatMulNBits (8 and 4 bits, accuracy level 4) does, within float rounding, on every shape a GGUF gives`, async (t) => {
  // The library is built by npm run setup on every machine with a C compiler: its absence is a failure here.
  assert.equal(ragguardOpsUnavailable(), '', "ragguard's ops can run");
  setRagguardOpsPortable(path_ === 'the plain C path');
  t.after(() => setRagguardOpsPortable(false));
  t.diagnostic(`AVX512-VNNI kernel: ${ragguardOpsVnni() ? 'yes' : 'no'}`);
  if (path_ === 'the plain C path') assert.equal(ragguardOpsVnni(), false);
  const cases: Case[] = [
    { bits: 8, k: 896, n: 200, blk: 32, bias: true }, // Q5_0 / Q8_0 projections of a 896-wide model, qwen2's q/k/v bias
    { bits: 8, k: 4864, n: 64, blk: 16, bias: false }, // Q6_K down projection
    { bits: 8, k: 96, n: 37, blk: 32, bias: false }, // K not a multiple of 64, a column count not a multiple of 16
    { bits: 8, k: 160, n: 3, blk: 16, bias: true }, // a tail of two blocks of 16
    { bits: 8, k: 256, n: 9, blk: 128, bias: false }, // blocks of more than 8 loads, fewer than 16 columns
    { bits: 8, k: 512, n: 40, blk: 64, bias: true }, // a last group of 8 columns
    { bits: 4, k: 4864, n: 64, blk: 32, bias: false }, // Q4_K down projection
    { bits: 4, k: 896, n: 200, blk: 32, bias: true }, // Q4_0 / Q4_1 projections, with a bias
    { bits: 4, k: 96, n: 37, blk: 32, bias: false }, // K not a multiple of 64, an odd block count
    { bits: 4, k: 512, n: 9, blk: 128, bias: true }, // blocks of more than 4 loads, fewer than 16 columns
    { bits: 4, k: 160, n: 20, blk: 16, bias: false }, // blocks of 16
  ];
  let seed = 1;
  for (const c of cases) {
    // 33: two 16-row AMX tiles where AMX runs, and a row past them; 520: a prefill's rows in chunks of their
    // own (a third of the core's L2 each, 512 rows at most: two chunks or more at any L2, the last partial)
    for (const rows of [1, 3, 8, 13, 33, 520]) {
      const { y, yOrt, exact } = await both(c, rows, seed++);
      const scale = rms(exact);
      const vsOrt = maxDiff(y, yOrt) / scale;
      const vsExact = maxDiff(y, exact) / scale;
      const ortVsExact = maxDiff(yOrt, exact) / scale;
      t.diagnostic(`${c.bits} bits, k ${c.k} n ${c.n} blk ${c.blk} rows ${rows}: |y - MatMulNBits| ${vsOrt.toExponential(2)}, |y - exact| ${vsExact.toExponential(2)} (MatMulNBits' ${ortVsExact.toExponential(2)}) of the rms`);
      if (path_ === 'the CPU\'s kernel' && ragguardOpsAmxBf16() && rows >= 128 && c.k % 32 === 0) {
        // A prefill on AMX-BF16 (qmatmul-bf16.c): x rounded to bfloat16, not to int8 a block, so off the
        // exact product by less than MatMulNBits' int8 activations put it (test/qmatmul-amx.test.ts bounds it).
        assert.ok(vsExact < ortVsExact, `QMatMul${c.bits} on AMX-BF16 is ${vsExact} of the rms off the exact product, MatMulNBits ${ortVsExact} (k ${c.k}, blk ${c.blk}, rows ${rows})`);
        continue;
      }
      // The same int8 quantization of x and the same integer dots: only the float sums' order differs.
      assert.ok(vsOrt < 1e-4, `QMatMul${c.bits} differs from MatMulNBits by ${vsOrt} of the output's rms (k ${c.k}, blk ${c.blk}, rows ${rows})`);
      // int8 activations: off the exact product by their rounding, as MatMulNBits is.
      assert.ok(vsExact < Math.max(2 * ortVsExact, 1e-3), `QMatMul${c.bits} is ${vsExact} of the rms off the exact product, MatMulNBits ${ortVsExact}`);
    }
  }
});

test("the ops' working memory (x quantized) comes from the session's allocator: the counting allocator, which the guards read, sees it", async () => {
  assert.ok(counters, `the counting allocator is not installed: ${accountingUnavailable()}`);
  const k = 4864, n = 16, blk = 32, rows = 512;
  const blocks = k / blk;
  const packed = qmatmul8Layout({ n, k, blockSize: blk, data: new Uint8Array(n * k).fill(130), scales: new Float32Array(n * blocks).fill(0.01) });
  const file = path.join(await tempDir('qmatmul-mem-'), 'model.onnx');
  await writeFile(file, writeModel({
    name: 'qmatmul-mem',
    nodes: [{ op: 'QMatMul8', inputs: ['x', 'q16', 'd16'], outputs: ['y'], domain: 'ragguard', attrs: { K: { int: k }, N: { int: n }, block_size: { int: blk } } }],
    initializers: [{ name: 'q16', dataType: ONNX_UINT8, dims: [packed.groups, k / 4, 64], data: packed.q }, floats('d16', [packed.groups, blocks, 16], packed.scales)],
    inputs: [{ name: 'x', elemType: ONNX_FLOAT, dims: ['rows', k] }],
    outputs: [{ name: 'y', elemType: ONNX_FLOAT, dims: ['rows', n] }],
    opsets: { '': 17, ragguard: 1 },
  }));
  const s = DirectSession.create(file)!;
  try {
    const x = s.tensor('float32', [rows, k]);
    (x.data as Float32Array).fill(0.5);
    const before = counters.live();
    counters.resetPeak();
    const out = await s.run({ x }, { y: null });
    const rise = counters.peak() - before;
    // within bfloat16's rounding of the weight (0.02: 2^-9 of it at most), where the product runs on AMX-BF16
    assert.ok(Math.abs((out['y']!.data as Float32Array)[0]! - 0.5 * 0.01 * 2 * k) < 0.5 * 0.01 * 2 * k * 2 ** -8, 'the product is right');
    for (const t of [x, ...Object.values(out)]) t.dispose();
    // the output (32 KiB) and x's 512 x 4864 int8 values and block scales (2.5 MB), or its bfloat16 values
    // and the dequantized weights on AMX-BF16: without the second the rise would be the output alone
    assert.ok(rise >= rows * k + rows * n * 4, `the run's accounted peak rose by ${rise} bytes`);
    assert.ok(counters.live() <= before - rows * k * 4, `all of it freed after the run, x too (${counters.live()} bytes live, ${before} before)`);
  } finally {
    s.dispose();
  }
});

test("a prefill's LoRA term lands on its own rows when the product runs in chunks of rows (one B for all, and a B a batch entry)", async () => {
  assert.equal(ragguardOpsUnavailable(), '', "ragguard's ops can run");
  // Zero weights: y is the LoRA term alone, x A times B, exactly. k 4,864: the 600 rows run in chunks (a
  // third of the core's L2, whole 16-row tiles, 512 at most), and as 300 is no multiple of 16 a chunk spans
  // the two batch entries' boundary at row 300 whatever the chunk's size.
  const k = 4864, n = 40, rank = 4, batch = 2, seq = 300, groups = Math.ceil(n / 16);
  const model = writeModel({
    name: 'qmatmul-lora',
    nodes: [{ op: 'QMatMul8', inputs: ['x', 'q', 'd', '', 'xa', 'lb'], outputs: ['y'], domain: 'ragguard', attrs: { K: { int: k }, N: { int: n }, block_size: { int: 32 } } }],
    initializers: [
      { name: 'q', dataType: ONNX_UINT8, dims: [groups, k / 4, 64], data: new Uint8Array(groups * k * 16).fill(128) },
      floats('d', [groups, k / 32, 16], new Float32Array(groups * (k / 32) * 16)),
    ],
    inputs: [
      { name: 'x', elemType: ONNX_FLOAT, dims: [batch, seq, k] }, { name: 'xa', elemType: ONNX_FLOAT, dims: [batch, seq, rank] },
      { name: 'lb', elemType: ONNX_FLOAT, dims: ['lb0', rank, n] },
    ],
    outputs: [{ name: 'y', elemType: ONNX_FLOAT, dims: [batch, seq, n] }],
    opsets: { '': 17, ragguard: 1 },
  });
  const file = path.join(await tempDir('qmatmul-lora-'), 'model.onnx');
  await writeFile(file, model);
  const s = DirectSession.create(file, { intraOpThreads: 2 })!;
  const r = xorshift(7);
  const xa = Float32Array.from({ length: batch * seq * rank }, () => r() - 0.5);
  try {
    for (const entries of [1, batch]) {
      const lb = Float32Array.from({ length: entries * rank * n }, () => r() - 0.5);
      const xt = s.tensor('float32', [batch, seq, k]);
      (xt.data as Float32Array).fill(0.25);
      const at = s.tensor('float32', [batch, seq, rank]);
      (at.data as Float32Array).set(xa);
      const bt = s.tensor('float32', [entries, rank, n]);
      (bt.data as Float32Array).set(lb);
      const out = await s.run({ x: xt, xa: at, lb: bt }, { y: null });
      const y = Float32Array.from(out['y']!.data as Float32Array);
      for (const t of [xt, at, bt, ...Object.values(out)]) t.dispose();
      let worst = 0;
      for (let i = 0; i < batch * seq; i++) {
        const e = entries === 1 ? 0 : Math.floor(i / seq);
        for (let c = 0; c < n; c++) {
          let want = 0;
          for (let t = 0; t < rank; t++) want += xa[i * rank + t]! * lb[(e * rank + t) * n + c]!;
          worst = Math.max(worst, Math.abs(y[i * n + c]! - want));
        }
      }
      assert.ok(worst < 1e-5, `B ${entries === 1 ? 'shared' : 'a batch entry'}: off x A B by ${worst}`);
    }
  } finally {
    s.dispose();
  }
});
