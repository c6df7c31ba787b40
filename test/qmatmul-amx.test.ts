/**
 * ragguard's QMatMul8 and QMatMul4 on AMX (src/backends/ort/qmatmul.c: products of 16 rows or more,
 * where the CPU has AMX-INT8 and Linux grants the tile state) against the same ops on their AVX512-VNNI
 * kernels: the same outputs bit for bit (each block's integer sum is exact either way, and its scaling
 * the same operations in the same order), at row counts around the 16-row tiles (the rows past the last
 * 16 take the VNNI tiles), column counts not a multiple of 16, blocks of 16 to 128, K not a multiple of 64.
 * test/qmatmul.test.ts holds the VNNI kernels to ONNX Runtime's MatMulNBits. And a product on AMX leaves
 * the thread's tile configuration as it found it (test/fixtures/qmatmul-tile-state.c), which llama.cpp's
 * AMX kernels in the same process rely on.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { test } from 'node:test';
import { ONNX_FLOAT, ONNX_UINT8, writeModel, type Initializer } from '../src/runtime/onnx-proto.js';
import { qmatmul4Layout, qmatmul8Layout, type Qmatmul8Layout } from '../src/backends/ort/qmatmul-layout.js';
import { DirectSession, ragguardOpsAmx, ragguardOpsAmxBf16, ragguardOpsUnavailable, ragguardOpsVnni, setRagguardOpsAmx, setRagguardOpsAmxBf16 } from '../src/backends/ort/ort-direct.js';
import { tempDir, xorshift } from './helpers.js';


const floats = (name: string, dims: number[], v: Float32Array): Initializer => ({ name, dataType: ONNX_FLOAT, dims, data: new Uint8Array(v.buffer, v.byteOffset, v.byteLength) });

interface Case { bits: 4 | 8; k: number; n: number; blk: number; bias: boolean }

/** A session holding one QMatMul of random weights (every byte value, every zero point) and x of `rows` rows. */
async function opModel(c: Case, seed: number): Promise<{ session: DirectSession; x: (rows: number) => Float32Array; reference: (x: Float32Array, rows: number) => { y: Float64Array; magnitude: Float64Array } }> {
  const r = xorshift(seed);
  const blocks = c.k / c.blk;
  const values = Uint8Array.from({ length: c.n * c.k }, () => Math.floor(r() * (c.bits === 8 ? 256 : 16)));
  const d = Float32Array.from({ length: c.n * blocks }, () => 0.001 + r() * 0.02);
  const bias = Float32Array.from({ length: c.n }, () => r() - 0.5);
  const zpRow = Math.ceil(blocks / 2);
  const zp = new Uint8Array(c.n * zpRow);
  for (let n = 0; n < c.n; n++) for (let b = 0; b < blocks; b++) zp[n * zpRow + (b >> 1)]! |= Math.floor(r() * 16) << ((b & 1) * 4);
  const q = c.bits === 8 ? values : Uint8Array.from({ length: (c.n * c.k) / 2 }, (_, i) => values[2 * i]! | (values[2 * i + 1]! << 4));
  const packed: Qmatmul8Layout & { offsets?: Float32Array } = c.bits === 8
    ? qmatmul8Layout({ n: c.n, k: c.k, blockSize: c.blk, data: q, scales: d })
    : qmatmul4Layout({ n: c.n, k: c.k, blockSize: c.blk, data: q, scales: d, zeroPoints: zp });
  const inits: Initializer[] = [
    { name: 'q16', dataType: ONNX_UINT8, dims: [packed.groups, (c.k * c.bits) / 32, 64], data: packed.q },
    floats('d16', [packed.groups, blocks, 16], packed.scales),
    ...(packed.offsets ? [floats('z16', [packed.groups, blocks, 16], packed.offsets)] : []),
    ...(c.bias ? [floats('bias', [c.n], bias)] : []),
  ];
  const ins = ['x', 'q16', 'd16', ...(c.bits === 4 ? ['z16'] : []), ...(c.bias ? ['bias'] : [])];
  const file = path.join(await tempDir('qmatmul-amx-'), 'model.onnx');
  await writeFile(file, writeModel({
    name: 'qmatmul-amx',
    nodes: [{ op: `QMatMul${c.bits}`, inputs: ins, outputs: ['y'], domain: 'ragguard', attrs: { K: { int: c.k }, N: { int: c.n }, block_size: { int: c.blk } } }],
    initializers: inits,
    inputs: [{ name: 'x', elemType: ONNX_FLOAT, dims: ['rows', c.k] }],
    outputs: [{ name: 'y', elemType: ONNX_FLOAT, dims: ['rows', c.n] }],
    opsets: { '': 17, ragguard: 1 },
  }));
  const session = DirectSession.create(file, { intraOpThreads: 2 })!;
  // Activations with a few large entries, as a normed hidden state has.
  const x = (rows: number) => Float32Array.from({ length: rows * c.k }, (_, i) => (r() - 0.5) * 4 * (i % 97 === 0 ? 20 : 1));
  // The product in float64 from the weights as MatMulNBits defines them (scale (q - zero point)), and each
  // output's sum of |x w| (the scale its rounding errors take).
  const weight = (n: number, k: number) => {
    const b = Math.floor(k / c.blk);
    const z = c.bits === 8 ? 128 : (zp[n * zpRow + (b >> 1)]! >> ((b & 1) * 4)) & 15;
    return d[n * blocks + b]! * (values[n * c.k + k]! - z);
  };
  const reference = (xs: Float32Array, rows: number) => {
    const y = new Float64Array(rows * c.n), magnitude = new Float64Array(rows * c.n);
    for (let n = 0; n < c.n; n++) {
      const w = Float64Array.from({ length: c.k }, (_, k) => weight(n, k));
      for (let i = 0; i < rows; i++) {
        let sum = c.bias ? bias[n]! : 0, mag = 0;
        for (let k = 0; k < c.k; k++) {
          const p = xs[i * c.k + k]! * w[k]!;
          sum += p;
          mag += Math.abs(p);
        }
        y[i * c.n + n] = sum;
        magnitude[i * c.n + n] = mag;
      }
    }
    return { y, magnitude };
  };
  return { session, x, reference };
}

async function run(s: DirectSession, x: Float32Array, rows: number, k: number): Promise<Float32Array> {
  const xt = s.tensor('float32', [rows, k]);
  (xt.data as Float32Array).set(x);
  const out = await s.run({ x: xt }, { y: null });
  const y = Float32Array.from(out['y']!.data as Float32Array);
  xt.dispose();
  out['y']!.dispose();
  return y;
}

test('QMatMul8 and QMatMul4 on AMX give the AVX512-VNNI kernels\' outputs bit for bit, at every row count around the 16-row tiles', async (t) => {
  assert.equal(ragguardOpsUnavailable(), '', "ragguard's ops can run");
  if (!ragguardOpsVnni() || !ragguardOpsAmx()) {
    t.skip(`no AMX here (AVX512-VNNI ${ragguardOpsVnni() ? 'yes' : 'no'}; the CPU or the kernel does not grant the tile state, or RAGGUARD_OPS_AMX=0)`);
    return;
  }
  // the int8 tiles at every row count (from 128 rows prefills take AMX-BF16 where it runs: the next test)
  setRagguardOpsAmxBf16(false);
  t.after(() => {
    setRagguardOpsAmx(true);
    setRagguardOpsAmxBf16(true);
  });
  const cases: Case[] = [
    { bits: 8, k: 896, n: 200, blk: 32, bias: true }, // Q5_0 / Q8_0 q/k/v with a bias, columns not a multiple of 16
    { bits: 8, k: 4864, n: 40, blk: 16, bias: false }, // Q6_K down projection, a last group of 8 columns
    { bits: 8, k: 96, n: 37, blk: 32, bias: false }, // K not a multiple of 64, an odd group count
    { bits: 8, k: 256, n: 9, blk: 128, bias: true }, // blocks longer than a tile's 64 bytes, one group
    { bits: 8, k: 512, n: 48, blk: 64, bias: false },
    { bits: 4, k: 4864, n: 40, blk: 32, bias: false }, // Q4_K down projection
    { bits: 4, k: 896, n: 200, blk: 32, bias: true },
    { bits: 4, k: 160, n: 21, blk: 16, bias: false }, // blocks of 16, an odd block count
    { bits: 4, k: 512, n: 9, blk: 128, bias: true },
  ];
  let seed = 7;
  for (const c of cases) {
    const { session, x } = await opModel(c, seed++);
    try {
      for (const rows of [15, 16, 17, 31, 32, 33, 47, 100]) {
        const xs = x(rows);
        setRagguardOpsAmx(true);
        const amx = await run(session, xs, rows, c.k);
        setRagguardOpsAmx(false);
        const vnni = await run(session, xs, rows, c.k);
        let differ = 0;
        for (let i = 0; i < amx.length; i++) if (!Object.is(amx[i], vnni[i])) differ++;
        assert.equal(differ, 0, `QMatMul${c.bits} k ${c.k} n ${c.n} blk ${c.blk} rows ${rows}: ${differ} of ${amx.length} outputs differ between AMX and AVX512-VNNI`);
        assert.ok(amx.every(Number.isFinite), 'finite outputs');
      }
    } finally {
      session.dispose();
    }
    t.diagnostic(`${c.bits} bits, k ${c.k} n ${c.n} blk ${c.blk}: equal at rows 15-100`);
  }
});

test('from 128 rows, QMatMul8 and QMatMul4 on AMX-BF16 are the product within bfloat16\'s rounding of x and the weights, and below it the int8 kernels\' own', async (t) => {
  assert.equal(ragguardOpsUnavailable(), '', "ragguard's ops can run");
  if (!ragguardOpsAmxBf16()) {
    t.skip(`no AMX-BF16 here (AMX ${ragguardOpsAmx() ? 'yes' : 'no'}; the CPU lacks AMX-BF16 or AVX512-BF16, or RAGGUARD_OPS_AMX_BF16=0)`);
    return;
  }
  t.after(() => setRagguardOpsAmxBf16(true));
  const cases: (Case & { rows: number[] })[] = [
    { bits: 8, k: 896, n: 200, blk: 32, bias: true, rows: [127, 128, 161] }, // columns not a multiple of 16, rows not of 32
    { bits: 4, k: 896, n: 200, blk: 32, bias: true, rows: [127, 128, 150] },
    { bits: 4, k: 160, n: 21, blk: 16, bias: false, rows: [128, 150] }, // blocks of 16, an odd group count
    { bits: 8, k: 256, n: 9, blk: 128, bias: true, rows: [140] }, // blocks longer than a tile's 32 values, one group
    { bits: 4, k: 512, n: 9, blk: 128, bias: false, rows: [140] },
    { bits: 4, k: 8960, n: 1000, blk: 32, bias: false, rows: [128] }, // the dequantized weights in 3 slabs
    { bits: 8, k: 48, n: 37, blk: 16, bias: false, rows: [150] }, // K not a multiple of 32: the int8 tiles
  ];
  let seed = 31;
  for (const c of cases) {
    const { session, x, reference } = await opModel(c, seed++);
    try {
      for (const rows of c.rows) {
        const xs = x(rows);
        setRagguardOpsAmxBf16(true);
        const bf16 = await run(session, xs, rows, c.k);
        setRagguardOpsAmxBf16(false);
        const int8 = await run(session, xs, rows, c.k);
        const what = `QMatMul${c.bits} k ${c.k} n ${c.n} blk ${c.blk} rows ${rows}`;
        let differ = 0;
        for (let i = 0; i < bf16.length; i++) if (!Object.is(bf16[i], int8[i])) differ++;
        if (rows < 128 || c.k % 32 !== 0) {
          assert.equal(differ, 0, `${what}: the int8 kernels' outputs (${differ} differ)`);
          continue;
        }
        assert.ok(differ > bf16.length / 2, `${what}: ran on AMX-BF16 (only ${differ} of ${bf16.length} outputs differ from the int8 kernels')`);
        // x and each weight rounded to bfloat16 (8 significant bits: a relative error of 2^-9 each at most),
        // their products summed in floats: each output within 2^-8 of its sum of |x w| (the int8 kernels'
        // error is some 2^-8.5 of it, so this bound tells a product gone wrong from bfloat16's rounding).
        const ref = reference(xs, rows);
        let worst = 0;
        for (let i = 0; i < bf16.length; i++) worst = Math.max(worst, Math.abs(bf16[i]! - ref.y[i]!) / (ref.magnitude[i]! + 1e-30));
        assert.ok(worst <= 2 ** -8, `${what}: an output ${worst.toExponential(2)} of its sum of |x w| off the float64 product`);
        t.diagnostic(`${what}: within ${worst.toExponential(2)} of the sum of |x w|`);
      }
    } finally {
      session.dispose();
    }
  }
});

test('a product on AMX puts back the tile configuration its thread held (llama.cpp\'s next tile load works) and releases the tiles where none was held', async (t) => {
  const ROOT = path.resolve(import.meta.dirname, '..');
  const dir = await tempDir('qmatmul-tile-state-');
  // Built as scripts/setup.sh builds the ops (-O3), and at -O2, where GCC 12's own _tile_loadconfig lost our configuration.
  for (const opt of ['-O3', '-O2']) {
    const exe = path.join(dir, `tile-state${opt}`);
    const cc = spawnSync('cc', [opt, '-Wall', '-Wextra', '-Werror', '-I', path.join(ROOT, 'src/backends/ort'), '-o', exe,
      path.join(ROOT, 'test/fixtures/qmatmul-tile-state.c'), path.join(ROOT, 'src/backends/ort/qmatmul.c'), path.join(ROOT, 'src/backends/ort/qmatmul-bf16.c'), '-lm'], { encoding: 'utf8' });
    if (cc.error) {
      t.skip(`no C compiler (cc: ${cc.error.message})`);
      return;
    }
    assert.equal(cc.status, 0, `cc ${opt} failed:\n${cc.stderr}`);
    const r = spawnSync(exe, [], { encoding: 'utf8', timeout: 60_000 });
    if (r.status === 2) {
      t.skip(`no AMX here: ${r.stdout.trim()}`);
      return;
    }
    assert.equal(r.signal, null, `${opt}: died with ${r.signal} after:\n${r.stdout}`);
    assert.equal(r.status, 0, `${opt}:\n${r.stdout}${r.stderr}`);
    // 4 products (8 and 4 bits, a configuration before or none) on the int8 tiles, and 4 more on AMX-BF16 where it runs
    const paths = ragguardOpsAmxBf16() ? 2 : 1;
    assert.equal((r.stdout.match(/as before/g) ?? []).length, 4 * paths, r.stdout);
    assert.equal((r.stdout.match(/a tile load after our product works/g) ?? []).length, 2 * paths, r.stdout);
    t.diagnostic(`${opt}: ${r.stdout.trim().split('\n').join('; ')}`);
  }
});
