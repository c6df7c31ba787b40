/**
 * ragguard's SwiGlu op (src/backends/ort/ragguard-ops.c): the MLP's activation silu(gate + G) x (up + U)
 * over a product of gate and up side by side, against ONNX Runtime's own Split, Add, Sigmoid and Mul on
 * the same inputs in one graph (the nodes it replaces in a graph converted for ragguard's kernels) and
 * against the exact function (float64), with
 * and without the LoRA terms (rank 0: no adapter in the batch, and rank 5), at row and column counts not a multiple of 16 (the masked tails), and on
 * the plain C path that CPUs without AVX512 take; and LoRA factors that do not fit refused by SwiGlu and QMatMul alike.
 */
import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { test } from 'node:test';
import { ONNX_FLOAT, ONNX_INT64, ONNX_UINT8, writeModel } from '../src/runtime/onnx-proto.js';
import { DirectSession, ragguardOpsUnavailable, setRagguardOpsPortable } from '../src/backends/ort/ort-direct.js';
import { tempDir } from './helpers.js';

/** The largest differences (relative, at least absolute) of the op from ONNX Runtime's nodes and from the exact function (float64). */
async function compare(rows: number, inter: number, loraRank: number | undefined, seed: number, batch = 1, bBatch = 1): Promise<{ vsOrt: number; vsExact: number; ortVsExact: number }> {
  let s = seed;
  const r = () => ((s = (s * 1103515245 + 12345) >>> 0) / 2 ** 32);
  const split = new BigInt64Array([BigInt(inter), BigInt(inter)]);
  const withTerms = loraRank !== undefined;
  const R = loraRank ?? 0;
  const ins = ['gu', ...(withTerms ? ['ga', 'gb', 'ua', 'ub'] : [])];
  const model = writeModel({
    name: 'swiglu',
    nodes: [
      { op: 'SwiGlu', inputs: ins, outputs: ['y'], domain: 'ragguard' },
      { op: 'Split', inputs: ['gu', 'split'], outputs: ['g0', 'u0'], attrs: { axis: { int: -1 } } },
      ...(withTerms ? [
        { op: 'MatMul', inputs: ['ga', 'gb'], outputs: ['gt'] }, { op: 'MatMul', inputs: ['ua', 'ub'], outputs: ['ut'] },
        { op: 'Add', inputs: ['g0', 'gt'], outputs: ['g'] }, { op: 'Add', inputs: ['u0', 'ut'], outputs: ['u'] }] : [
        { op: 'Identity', inputs: ['g0'], outputs: ['g'] }, { op: 'Identity', inputs: ['u0'], outputs: ['u'] }]),
      { op: 'Sigmoid', inputs: ['g'], outputs: ['gs'] },
      { op: 'Mul', inputs: ['g', 'gs'], outputs: ['silu'] },
      { op: 'Mul', inputs: ['silu', 'u'], outputs: ['y_ort'] },
    ],
    initializers: [{ name: 'split', dataType: ONNX_INT64, dims: [2], data: new Uint8Array(split.buffer) }],
    inputs: [
      { name: 'gu', elemType: ONNX_FLOAT, dims: [batch, 'rows', 2 * inter] },
      ...(withTerms ? [
        { name: 'ga', elemType: ONNX_FLOAT, dims: [batch, 'rows', R] }, { name: 'gb', elemType: ONNX_FLOAT, dims: [bBatch, R, inter] },
        { name: 'ua', elemType: ONNX_FLOAT, dims: [batch, 'rows', R] }, { name: 'ub', elemType: ONNX_FLOAT, dims: [bBatch, R, inter] }] : []),
    ],
    outputs: [{ name: 'y', elemType: ONNX_FLOAT, dims: [batch, 'rows', inter] }, { name: 'y_ort', elemType: ONNX_FLOAT, dims: [batch, 'rows', inter] }],
    opsets: { '': 17, ragguard: 1 },
  });
  const file = path.join(await tempDir('swiglu-'), 'model.onnx');
  await writeFile(file, model);
  const session = DirectSession.create(file, { intraOpThreads: 2 })!;
  try {
    const feed = (dims: number[], spread: number) => {
      const t = session.tensor('float32', dims);
      const n = dims.reduce((a, b) => a * b, 1);
      // gate values over the sigmoid's whole range, and past the exponential's clamps
      (t.data as Float32Array).set(Float32Array.from({ length: n }, (_, i) => (r() - 0.5) * (i % 53 === 0 ? 300 : spread)));
      return t;
    };
    const feeds: Record<string, ReturnType<typeof feed>> = {
      gu: feed([batch, rows, 2 * inter], 16),
      ...(withTerms ? { ga: feed([batch, rows, R], 2), gb: feed([bBatch, R, inter], 0.5), ua: feed([batch, rows, R], 2), ub: feed([bBatch, R, inter], 0.5) } : {}),
    };
    const gu = feeds['gu']!.data as Float32Array;
    const [ga, gb, ua, ub] = ['ga', 'gb', 'ua', 'ub'].map((n) => feeds[n]?.data as Float32Array | undefined);
    // Row `row` of all batch x rows; B's batch is the row's batch, or 0 where GB and UB are broadcast.
    const term = (xa: Float32Array | undefined, b: Float32Array | undefined, row: number, j: number) => {
      const bi = bBatch === 1 ? 0 : Math.floor(row / rows);
      let t = 0;
      for (let k = 0; k < R; k++) t += xa![row * R + k]! * b![(bi * R + k) * inter + j]!;
      return t;
    };
    const out = await session.run(feeds, { y: null, y_ort: null });
    const y = out['y']!.data as Float32Array;
    const yOrt = out['y_ort']!.data as Float32Array;
    assert.deepEqual(out['y']!.dims, [batch, rows, inter]);
    const rel = (a: number, b: number) => Math.abs(a - b) / Math.max(1, Math.abs(b));
    const worst = { vsOrt: 0, vsExact: 0, ortVsExact: 0 };
    for (let i = 0; i < y.length; i++) {
      assert.ok(Number.isFinite(y[i]!), `finite at ${i}`);
      const row = Math.floor(i / inter), j = i % inter;
      const g = gu[row * 2 * inter + j]! + (withTerms ? term(ga, gb, row, j) : 0), u = gu[row * 2 * inter + inter + j]! + (withTerms ? term(ua, ub, row, j) : 0);
      const exact = (g / (1 + Math.exp(-g))) * u;
      worst.vsOrt = Math.max(worst.vsOrt, rel(y[i]!, yOrt[i]!));
      worst.vsExact = Math.max(worst.vsExact, rel(y[i]!, exact));
      worst.ortVsExact = Math.max(worst.ortVsExact, rel(yOrt[i]!, exact));
    }
    for (const t of [...Object.values(feeds), ...Object.values(out)]) t.dispose();
    return worst;
  } finally {
    session.dispose();
  }
}

for (const path_ of ['AVX512', 'the plain C path'] as const) test(`SwiGlu on ${path_} computes what Split, Add, Sigmoid and Mul do, within float rounding`, async (t) => {
  assert.equal(ragguardOpsUnavailable(), '', "ragguard's ops can run");
  setRagguardOpsPortable(path_ === 'the plain C path');
  t.after(() => setRagguardOpsPortable(false));
  let seed = 3;
  for (const [rows, inter] of [[1, 4864], [7, 37], [33, 16], [300, 100]] as const) {
    for (const loraRank of [undefined, 0, 5]) {
      const w = await compare(rows, inter, loraRank, seed++);
      t.diagnostic(`rows ${rows}, I ${inter}, LoRA rank ${loraRank ?? 'none'}: from ONNX Runtime's nodes ${w.vsOrt.toExponential(2)}, from the exact function ${w.vsExact.toExponential(2)} (ONNX Runtime's ${w.ortVsExact.toExponential(2)}), relative (at least absolute)`);
      // The op's e^x is within an ulp or two (the LoRA terms' float sums add their rounding, amplified by
      // u); ONNX Runtime's Sigmoid is an approximation (MLAS's logistic: up to ~1e-4 off here), which is
      // what the op differs from it by.
      assert.ok(w.vsExact < (loraRank ? 2e-5 : 2e-6), `SwiGlu is ${w.vsExact} off the exact function (rows ${rows}, I ${inter})`);
      assert.ok(w.vsOrt <= w.ortVsExact + 2e-6, `SwiGlu differs from ONNX Runtime's nodes by ${w.vsOrt}, more than their own ${w.ortVsExact} from the exact function (rows ${rows}, I ${inter})`);
    }
  }
  // A batch of several sequences: B per row's batch ([B, R, I]: an adapter entry a row) or broadcast
  // ([1, R, I]: one adapter for all, or rank 0 for none, as lora-feeds.ts feeds a batched run).
  for (const [batch, bBatch, loraRank] of [[3, 1, 0], [3, 1, 4], [3, 3, 4]] as const) {
    const w = await compare(5, 40, loraRank, seed++, batch, bBatch);
    assert.ok(w.vsExact < 2e-5, `SwiGlu is ${w.vsExact} off the exact function (batch ${batch}, B's batch ${bBatch}, rank ${loraRank})`);
  }
});

test("SwiGlu and QMatMul refuse LoRA factors that do not fit their input, saying which (one shape check for both ops)", async () => {
  assert.equal(ragguardOpsUnavailable(), '', "ragguard's ops can run");
  const dir = await tempDir('lora-misfit-');
  const open = async (name: string, nodes: Parameters<typeof writeModel>[0]['nodes'], inputs: Parameters<typeof writeModel>[0]['inputs'], initializers: Parameters<typeof writeModel>[0]['initializers'] = []) => {
    const file = path.join(dir, `${name}.onnx`);
    await writeFile(file, writeModel({ name, nodes, initializers, inputs, outputs: [{ name: 'y', elemType: ONNX_FLOAT, dims: ['b', 's', 'n'] }], opsets: { '': 17, ragguard: 1 } }));
    return DirectSession.create(file, { intraOpThreads: 1 })!;
  };
  const dyn = (name: string) => ({ name, elemType: ONNX_FLOAT, dims: [`${name}0`, `${name}1`, `${name}2`] });
  const run = async (s: DirectSession, shapes: Record<string, number[]>) => {
    const feeds = Object.fromEntries(Object.entries(shapes).map(([n, d]) => [n, s.tensor('float32', d)]));
    try {
      const out = await s.run(feeds, { y: null });
      for (const t of Object.values(out)) t.dispose();
    } finally {
      for (const t of Object.values(feeds)) t.dispose();
    }
  };
  const glu = await open('glu', [{ op: 'SwiGlu', inputs: ['gu', 'ga', 'gb', 'ua', 'ub'], outputs: ['y'], domain: 'ragguard' }], ['gu', 'ga', 'gb', 'ua', 'ub'].map(dyn));
  try {
    const fits = { gu: [2, 3, 8], ga: [2, 3, 4], gb: [1, 4, 4], ua: [2, 3, 4], ub: [1, 4, 4] };
    await run(glu, fits);
    await assert.rejects(run(glu, { ...fits, gb: [1, 4, 5] }), /SwiGlu: GU \[B, S, 2I\], GA \[B, S, R\] and GB \[B or 1, R, I\] do not fit/); // GB's columns not I
    await assert.rejects(run(glu, { ...fits, ga: [2, 2, 4], ua: [2, 2, 4] }), /do not fit/); // GA's rows not GU's
    await assert.rejects(run(glu, { ...fits, gb: [2, 5, 4] }), /do not fit/); // GB's rank not GA's
    await assert.rejects(run(glu, { ...fits, gb: [3, 4, 4], ub: [3, 4, 4] }), /do not fit/); // GB's batch neither B nor 1
    await assert.rejects(run(glu, { ...fits, ua: [2, 3, 3] }), /SwiGlu: UA is not GA's shape/);
    await assert.rejects(run(glu, { ...fits, ub: [2, 4, 4] }), /SwiGlu: UB is not GB's shape/);
  } finally {
    glu.dispose();
  }
  // QMatMul8 of 32 x 16 (one group of 16 columns, one block of 32), zero weights: only the shapes matter.
  const k = 32, n = 16;
  const weights = [
    { name: 'q', dataType: ONNX_UINT8, dims: [1, k / 4, 64], data: new Uint8Array(k * 16) },
    { name: 'd', dataType: ONNX_FLOAT, dims: [1, 1, 16], data: new Uint8Array(64) },
  ];
  const qm = await open('qm', [{ op: 'QMatMul8', inputs: ['x', 'q', 'd', '', 'xa', 'lb'], outputs: ['y'], domain: 'ragguard', attrs: { K: { int: k }, N: { int: n }, block_size: { int: k } } }], ['x', 'xa', 'lb'].map(dyn), weights);
  try {
    const fits = { x: [2, 3, k], xa: [2, 3, 4], lb: [2, 4, n] };
    await run(qm, fits);
    await run(qm, { ...fits, lb: [1, 4, n] });
    await assert.rejects(run(qm, { ...fits, lb: [2, 4, n - 1] }), /QMatMul: A \[B, S, K\], x A \[B, S, R\] and B \[B or 1, R, N\] do not fit/);
    await assert.rejects(run(qm, { ...fits, xa: [2, 4, 4] }), /do not fit/);
    await assert.rejects(run(qm, { ...fits, lb: [2, 3, n] }), /do not fit/);
  } finally {
    qm.dispose();
  }
});
