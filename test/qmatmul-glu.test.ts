/**
 * QMatMul8 and QMatMul4 with activation 1 (src/backends/ort/ragguard-ops.c, qmatmul-bf16.c): the MLP's
 * silu(gate) x up over the product's two halves, as a converted GGUF's gate-and-up product takes it,
 * against the same op without the activation followed by SwiGlu on the same inputs in one graph. On
 * AMX-BF16 a prefill's sums go straight into the activation (the product is never written); its sums are
 * the plain product's, tile for tile, and the activation is SwiGlu's function, so the two agree bit for
 * bit: prefills of 130 and 300 rows (AMX-BF16 where the CPU has it), a decode-sized 20 rows (the int8
 * kernels, then SwiGlu's pass inside the op), with and without a bias and with the activation's LoRA
 * terms (rank 3, which take the unfused path), at 4 and 8 bits, and a product wider than one slab of
 * dequantized weights (its gate and up groups in two slabs).
 */
import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { test } from 'node:test';
import { ONNX_FLOAT, ONNX_UINT8, writeModel, type Initializer } from '../src/runtime/onnx-proto.js';
import { qmatmul4Layout, qmatmul8Layout } from '../src/backends/ort/qmatmul-layout.js';
import { DirectSession, ragguardOpsUnavailable } from '../src/backends/ort/ort-direct.js';
import { tempDir, xorshift } from './helpers.js';

const floats = (name: string, dims: number[], v: Float32Array): Initializer => ({ name, dataType: ONNX_FLOAT, dims, data: new Uint8Array(v.buffer, v.byteOffset, v.byteLength) });

interface Case { bits: 4 | 8; k: number; inter: number; rows: number; bias: boolean; rank: number }

async function fusedAndSplit(c: Case, seed: number): Promise<{ fused: Float32Array; split: Float32Array }> {
  const r = xorshift(seed);
  const n = 2 * c.inter, blk = 32, blocks = c.k / blk;
  const values = Uint8Array.from({ length: n * c.k }, () => Math.floor(r() * (c.bits === 8 ? 256 : 16)));
  const q = c.bits === 8 ? values : Uint8Array.from({ length: (n * c.k) / 2 }, (_, i) => values[2 * i]! | (values[2 * i + 1]! << 4));
  const d = Float32Array.from({ length: n * blocks }, () => 0.001 + r() * 0.02);
  const zpRow = Math.ceil(blocks / 2);
  const zp = Uint8Array.from({ length: n * zpRow }, () => Math.floor(r() * 256));
  const packed = c.bits === 8
    ? qmatmul8Layout({ n, k: c.k, blockSize: blk, data: q, scales: d })
    : qmatmul4Layout({ n, k: c.k, blockSize: blk, data: q, scales: d, zeroPoints: zp });
  const offsets = 'offsets' in packed ? (packed.offsets as Float32Array) : undefined;
  const inits: Initializer[] = [
    { name: 'q16', dataType: ONNX_UINT8, dims: [packed.groups, (c.k * c.bits) / 32, 64], data: packed.q },
    floats('d16', [packed.groups, blocks, 16], packed.scales),
    ...(offsets ? [floats('z16', [packed.groups, blocks, 16], offsets)] : []),
    ...(c.bias ? [floats('bias', [n], Float32Array.from({ length: n }, () => r() - 0.5))] : []),
  ];
  const op = `QMatMul${c.bits}`;
  const weights = ['x', 'q16', 'd16', ...(offsets ? ['z16'] : []), c.bias ? 'bias' : ''];
  const terms = c.rank > 0 ? ['ga', 'gb', 'ua', 'ub'] : [];
  const fusedIns = [...weights, ...(terms.length ? ['', '', ...terms] : [])];
  while (fusedIns.at(-1) === '') fusedIns.pop();
  const plainIns = [...weights];
  while (plainIns.at(-1) === '') plainIns.pop();
  const attrs = { K: { int: c.k }, N: { int: n }, block_size: { int: blk } };
  const model = writeModel({
    name: 'glu',
    nodes: [
      { op, inputs: fusedIns, outputs: ['fused'], domain: 'ragguard', attrs: { ...attrs, activation: { int: 1 } } },
      { op, inputs: plainIns, outputs: ['gu'], domain: 'ragguard', attrs },
      { op: 'SwiGlu', inputs: ['gu', ...terms], outputs: ['split'], domain: 'ragguard' },
    ],
    initializers: inits,
    inputs: [
      { name: 'x', elemType: ONNX_FLOAT, dims: [1, c.rows, c.k] },
      ...terms.map((t) => ({ name: t, elemType: ONNX_FLOAT, dims: t.endsWith('a') ? [1, c.rows, c.rank] : [1, c.rank, c.inter] })),
    ],
    outputs: [{ name: 'fused', elemType: ONNX_FLOAT, dims: [1, c.rows, c.inter] }, { name: 'split', elemType: ONNX_FLOAT, dims: [1, c.rows, c.inter] }],
    opsets: { '': 17, ragguard: 1 },
  });
  const file = path.join(await tempDir('qmatmul-glu-'), 'model.onnx');
  await writeFile(file, model);
  const session = DirectSession.create(file, { intraOpThreads: 2 })!;
  try {
    const feed = (dims: number[], spread: number) => {
      const t = session.tensor('float32', dims);
      (t.data as Float32Array).set(Float32Array.from({ length: dims.reduce((a, b) => a * b, 1) }, () => (r() - 0.5) * spread));
      return t;
    };
    const feeds = { x: feed([1, c.rows, c.k], 4), ...Object.fromEntries(terms.map((t) => [t, t.endsWith('a') ? feed([1, c.rows, c.rank], 2) : feed([1, c.rank, c.inter], 0.5)])) };
    const out = await session.run(feeds, { fused: null, split: null });
    assert.deepEqual(out['fused']!.dims, [1, c.rows, c.inter]);
    const result = { fused: Float32Array.from(out['fused']!.data as Float32Array), split: Float32Array.from(out['split']!.data as Float32Array) };
    for (const t of [...Object.values(out), ...Object.values(feeds)]) t.dispose();
    return result;
  } finally {
    session.dispose();
  }
}

test('QMatMul with activation 1 computes its product followed by SwiGlu, bit for bit, fused or not', async () => {
  assert.equal(ragguardOpsUnavailable(), '', "ragguard's ops can run");
  const cases: Case[] = [];
  for (const bits of [4, 8] as const) {
    for (const rows of [130, 300, 20]) cases.push({ bits, k: 256, inter: 48, rows, bias: rows !== 300, rank: 0 });
    cases.push({ bits, k: 256, inter: 48, rows: 130, bias: false, rank: 3 }, { bits, k: 256, inter: 48, rows: 20, bias: true, rank: 3 });
  }
  // 8 MB of bfloat16 weights a slab: 512 of gate's groups and as many of up's at k 256, so 520 take two slabs
  cases.push({ bits: 4, k: 256, inter: 520 * 16, rows: 130, bias: true, rank: 0 });
  let seed = 11;
  for (const c of cases) {
    const { fused, split } = await fusedAndSplit(c, seed++);
    assert.ok(fused.every(Number.isFinite), `finite: ${JSON.stringify(c)}`);
    assert.ok(split.some((v) => v !== 0), `a product that is not all zero: ${JSON.stringify(c)}`);
    const at = fused.findIndex((v, i) => v !== split[i]);
    assert.equal(at, -1, `${JSON.stringify(c)}: output ${at} (row ${Math.floor(at / c.inter)}, column ${at % c.inter}) ${fused[at]} against ${split[at]}`);
  }
});

test('QMatMul refuses an activation it does not compute, and the activation\'s terms without it', async () => {
  assert.equal(ragguardOpsUnavailable(), '', "ragguard's ops can run");
  const dir = await tempDir('qmatmul-glu-refuse-');
  const packed = qmatmul4Layout({ n: 48, k: 64, blockSize: 32, data: new Uint8Array(48 * 32), scales: new Float32Array(48 * 2), zeroPoints: new Uint8Array(48) });
  const load = async (attrs: Record<string, { int: number }>, extra: string[]) => {
    const file = path.join(dir, `m${Math.random().toString(36).slice(2)}.onnx`);
    await writeFile(file, writeModel({
      name: 'refuse',
      nodes: [{ op: 'QMatMul4', inputs: ['x', 'q16', 'd16', 'z16', ...extra], outputs: ['y'], domain: 'ragguard', attrs: { K: { int: 64 }, N: { int: 48 }, block_size: { int: 32 }, ...attrs } }],
      initializers: [
        { name: 'q16', dataType: ONNX_UINT8, dims: [packed.groups, 8, 64], data: packed.q },
        floats('d16', [packed.groups, 2, 16], packed.scales), floats('z16', [packed.groups, 2, 16], packed.offsets),
        floats('t', [1, 1, 1], new Float32Array(1)),
      ],
      inputs: [{ name: 'x', elemType: ONNX_FLOAT, dims: [1, 1, 64] }],
      outputs: [{ name: 'y', elemType: ONNX_FLOAT, dims: [1, 1, 'n'] }],
      opsets: { '': 17, ragguard: 1 },
    }));
    const s = DirectSession.create(file)!;
    try {
      const x = s.tensor('float32', [1, 1, 64]);
      try {
        await s.run({ x }, { y: null });
      } finally {
        x.dispose();
      }
    } finally {
      s.dispose();
    }
  };
  // 48 columns: halves of 24, not whole groups of 16
  await assert.rejects(load({ activation: { int: 1 } }, []), /QMatMul: activation is 0 \(none\) or 1/);
  await assert.rejects(load({ activation: { int: 2 } }, []), /QMatMul: activation is 0 \(none\) or 1/);
  await assert.rejects(load({}, ['', '', '', 't', 't', 't', 't']), /GA, GB, UA and UB are the activation's/);
});
