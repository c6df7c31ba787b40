/**
 * ragguard's GroupQueryAttention (src/backends/ort/attention.c, registered by ragguard-ops.c) against ONNX
 * Runtime's own (com.microsoft) on the same inputs: the output and the present keys and values, on the runs
 * a decoder makes (a first prompt, rows right-padded, a prompt after a past, decode steps of rows of several
 * lengths, a long prompt of many key blocks), in place (the present given the past buffer, as the decoder
 * runs) and into a present of its own, on several head shapes (groups of 6, 7 and 1; head sizes 128 and
 * 64), rotate-half and interleaved rotary and none, on AVX512 and on the plain C path; and the runs it does
 * not compute refused, saying why.
 */
import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { test } from 'node:test';
import { ONNX_FLOAT, ONNX_INT32, writeModel } from '../src/runtime/onnx-proto.js';
import { DirectSession, ragguardOpsUnavailable, setRagguardOpsPortable } from '../src/backends/ort/ort-direct.js';
import { tempDir, xorshift } from './helpers.js';

interface Shape { heads: number; kvHeads: number; dim: number; rotary: 'half' | 'interleaved' | 'none' }
interface Run { batch: number; seq: number; cap: number; lengths: number[]; total: number }

const POSITIONS = 512;

/** A session of one GroupQueryAttention node of `domain`. */
async function session(dir: string, domain: string, s: Shape, extra: Record<string, { int: number }> = {}, kv: 'packed' | 'separate' = 'packed'): Promise<DirectSession> {
  const rot = s.rotary !== 'none';
  const width = kv === 'packed' ? (s.heads + 2 * s.kvHeads) * s.dim : s.heads * s.dim;
  const file = path.join(dir, `${domain}-${s.heads}-${s.kvHeads}-${s.dim}-${s.rotary}-${kv}-${Object.keys(extra).join('_')}.onnx`);
  await writeFile(file, writeModel({
    name: 'gqa',
    nodes: [{
      op: 'GroupQueryAttention', domain,
      inputs: ['q', kv === 'packed' ? '' : 'k', kv === 'packed' ? '' : 'v', 'past_key', 'past_value', 'seqlens_k', 'total', rot ? 'cos' : '', rot ? 'sin' : ''],
      outputs: ['out', 'present_key', 'present_value'],
      attrs: { num_heads: { int: s.heads }, kv_num_heads: { int: s.kvHeads }, do_rotary: { int: rot ? 1 : 0 }, rotary_interleaved: { int: s.rotary === 'interleaved' ? 1 : 0 }, ...extra },
    }],
    initializers: [],
    inputs: [
      { name: 'q', elemType: ONNX_FLOAT, dims: ['b', 's', width] },
      ...(kv === 'packed' ? [] : [{ name: 'k', elemType: ONNX_FLOAT, dims: ['b', 's', s.kvHeads * s.dim] }, { name: 'v', elemType: ONNX_FLOAT, dims: ['b', 's', s.kvHeads * s.dim] }]),
      { name: 'past_key', elemType: ONNX_FLOAT, dims: ['b', s.kvHeads, 'p', s.dim] },
      { name: 'past_value', elemType: ONNX_FLOAT, dims: ['b', s.kvHeads, 'p', s.dim] },
      { name: 'seqlens_k', elemType: ONNX_INT32, dims: ['b'] },
      { name: 'total', elemType: ONNX_INT32, dims: [1] },
      ...(rot ? [{ name: 'cos', elemType: ONNX_FLOAT, dims: [POSITIONS, s.dim / 2] }, { name: 'sin', elemType: ONNX_FLOAT, dims: [POSITIONS, s.dim / 2] }] : []),
    ],
    outputs: [
      { name: 'out', elemType: ONNX_FLOAT, dims: ['b', 's', s.heads * s.dim] },
      { name: 'present_key', elemType: ONNX_FLOAT, dims: ['b', s.kvHeads, 'c', s.dim] },
      { name: 'present_value', elemType: ONNX_FLOAT, dims: ['b', s.kvHeads, 'c', s.dim] },
    ],
    opsets: { '': 17, 'com.microsoft': 1, ragguard: 1 },
  }));
  return DirectSession.create(file, { intraOpThreads: 2 })!;
}

type Result = Record<'out' | 'present_key' | 'present_value', Float32Array>;

/** One run of `sess` on the inputs `seed` makes (the same for both ops); `inPlace`: the present is the past buffer. */
async function runOnce(sess: DirectSession, s: Shape, r: Run, seed: number, inPlace: boolean): Promise<Result> {
  const rnd = xorshift(seed);
  const t = (type: 'float32' | 'int32', dims: number[], fill: (i: number) => number) => {
    const x = sess.tensor(type, dims);
    const d = x.data as Float32Array | Int32Array;
    for (let i = 0; i < d.length; i++) d[i] = fill(i);
    return x;
  };
  const width = (s.heads + 2 * s.kvHeads) * s.dim;
  const first = r.seq === r.total;
  // each row's past holds its own positions (before its new tokens); zeros past them
  const past = (i: number) => {
    const pos = Math.floor(i / s.dim) % r.cap, b = Math.floor(i / (s.dim * r.cap * s.kvHeads));
    return !first && pos < r.lengths[b]! - r.seq ? (rnd() - 0.5) * 2 : 0;
  };
  const half = s.dim / 2;
  const feeds = {
    q: t('float32', [r.batch, r.seq, width], () => (rnd() - 0.5) * 3),
    past_key: t('float32', [r.batch, s.kvHeads, r.cap, s.dim], past),
    past_value: t('float32', [r.batch, s.kvHeads, r.cap, s.dim], past),
    seqlens_k: t('int32', [r.batch], (b) => r.lengths[b]! - 1),
    total: t('int32', [1], () => r.total),
    ...(s.rotary !== 'none' ? {
      cos: t('float32', [POSITIONS, half], (i) => Math.cos(Math.floor(i / half) / 10000 ** ((i % half) / half))),
      sin: t('float32', [POSITIONS, half], (i) => Math.sin(Math.floor(i / half) / 10000 ** ((i % half) / half))),
    } : {}),
  };
  try {
    const out = await sess.run(feeds, { out: null, present_key: inPlace ? feeds.past_key : null, present_value: inPlace ? feeds.past_value : null });
    const result = { out: Float32Array.from(out['out']!.data as Float32Array), present_key: Float32Array.from(out['present_key']!.data as Float32Array), present_value: Float32Array.from(out['present_value']!.data as Float32Array) };
    out['out']!.dispose();
    if (!inPlace) for (const n of ['present_key', 'present_value']) out[n]!.dispose();
    return result;
  } finally {
    for (const x of Object.values(feeds)) x.dispose();
  }
}

/** The largest difference, relative to at least 1, over the values `keep` names ([b][pos] of output and present). */
function worst(a: Float32Array, b: Float32Array, keep: (i: number) => boolean): number {
  let w = 0;
  for (let i = 0; i < a.length; i++) {
    assert.ok(Number.isFinite(a[i]!), `finite at ${i}`);
    if (keep(i)) w = Math.max(w, Math.abs(a[i]! - b[i]!) / Math.max(1, Math.abs(b[i]!)));
  }
  return w;
}

async function compare(dir: string, s: Shape, r: Run, seed: number, inPlace: boolean): Promise<void> {
  const [ours, theirs] = [await session(dir, 'ragguard', s), await session(dir, 'com.microsoft', s)];
  try {
    const a = await runOnce(ours, s, r, seed, inPlace);
    const b = await runOnce(theirs, s, r, seed, inPlace);
    const first = r.seq === r.total;
    const pastOf = (row: number) => (first ? 0 : r.lengths[row]! - r.seq);
    // output: every real new token (a padded first prompt's row has lengths[b] of them)
    const realOut = (i: number) => {
      const row = Math.floor(i / (r.seq * s.heads * s.dim)), pos = Math.floor(i / (s.heads * s.dim)) % r.seq;
      return pos < (first ? r.lengths[row]! : r.seq);
    };
    // present: positions up to the row's last real one
    const cap = a.present_key.length / (r.batch * s.kvHeads * s.dim);
    const realKv = (i: number) => {
      const row = Math.floor(i / (s.kvHeads * cap * s.dim)), pos = Math.floor(i / s.dim) % cap;
      return pos < pastOf(row) + (first ? r.lengths[row]! : r.seq);
    };
    const what = `${JSON.stringify(s)} ${JSON.stringify(r)} ${inPlace ? 'in place' : 'own present'}`;
    assert.equal(a.present_key.length, b.present_key.length, what);
    assert.ok(worst(a.out, b.out, realOut) < 1e-4, `output ${worst(a.out, b.out, realOut)} off: ${what}`);
    assert.ok(worst(a.present_key, b.present_key, realKv) < 1e-5, `present keys ${worst(a.present_key, b.present_key, realKv)} off: ${what}`);
    assert.equal(worst(a.present_value, b.present_value, realKv), 0, `present values: ${what}`);
  } finally {
    ours.dispose();
    theirs.dispose();
  }
}

const QWEN_15B: Shape = { heads: 12, kvHeads: 2, dim: 128, rotary: 'half' };
const RUNS: [string, Run][] = [
  ['a first prompt', { batch: 1, seq: 37, cap: 48, lengths: [37], total: 37 }],
  ['a first prompt of rows right-padded', { batch: 3, seq: 20, cap: 24, lengths: [20, 13, 6], total: 20 }],
  ['a prompt after a past', { batch: 1, seq: 33, cap: 128, lengths: [83], total: 83 }],
  ['decode steps of rows of several lengths', { batch: 4, seq: 1, cap: 128, lengths: [10, 31, 65, 101], total: 101 }],
  ['a long prompt (many blocks of keys and rows)', { batch: 1, seq: 300, cap: 320, lengths: [300], total: 300 }],
];

for (const portable of [false, true]) {
  test(`GroupQueryAttention (ragguard) computes ONNX Runtime's on a decoder's runs${portable ? ', on the plain C path' : ''}`, async () => {
    assert.equal(ragguardOpsUnavailable(), '', "ragguard's ops can run");
    const dir = await tempDir('gqa-attention-');
    setRagguardOpsPortable(portable);
    try {
      let seed = 1;
      for (const [, run] of RUNS) {
        await compare(dir, QWEN_15B, run, seed++, true);
        await compare(dir, QWEN_15B, run, seed++, false);
      }
      // other head shapes and rotary forms, on a prompt after a past and a decode step
      for (const s of [{ heads: 14, kvHeads: 2, dim: 64, rotary: 'half' }, { heads: 8, kvHeads: 8, dim: 64, rotary: 'interleaved' }, { heads: 4, kvHeads: 2, dim: 32, rotary: 'none' }] as Shape[]) {
        await compare(dir, s, RUNS[2]![1], seed++, true);
        await compare(dir, s, RUNS[3]![1], seed++, false);
      }
    } finally {
      setRagguardOpsPortable(false);
    }
  });
}

test('GroupQueryAttention (ragguard) refuses what it does not compute, and lengths that do not fit its buffers', async () => {
  assert.equal(ragguardOpsUnavailable(), '', "ragguard's ops can run");
  const dir = await tempDir('attention-refuse-');
  await assert.rejects(async () => (await session(dir, 'ragguard', QWEN_15B, { local_window_size: { int: 16 } })).dispose(), /local_window_size, softcap and smooth_softmax are not implemented/);
  await assert.rejects(async () => (await session(dir, 'ragguard', { ...QWEN_15B, heads: 5 })).dispose(), /num_heads must be a positive multiple of kv_num_heads/);
  const separate = await session(dir, 'ragguard', QWEN_15B, {}, 'separate');
  try {
    const feeds = {
      q: separate.tensor('float32', [1, 1, 12 * 128]), k: separate.tensor('float32', [1, 1, 256]), v: separate.tensor('float32', [1, 1, 256]),
      past_key: separate.tensor('float32', [1, 2, 4, 128]), past_value: separate.tensor('float32', [1, 2, 4, 128]),
      seqlens_k: separate.tensor('int32', [1]), total: separate.tensor('int32', [1]),
      cos: separate.tensor('float32', [POSITIONS, 64]), sin: separate.tensor('float32', [POSITIONS, 64]),
    };
    (feeds.total.data as Int32Array)[0] = 1;
    await assert.rejects(separate.run(feeds, { out: null, present_key: null, present_value: null }), /separate key and value inputs are not taken/);
    for (const x of Object.values(feeds)) x.dispose();
  } finally {
    separate.dispose();
  }
  // a row whose past and new tokens overrun the buffer, or the rotary caches: refused before anything is written
  const ours = await session(dir, 'ragguard', QWEN_15B);
  try {
    await assert.rejects(runOnce(ours, QWEN_15B, { batch: 1, seq: 1, cap: 16, lengths: [40], total: 40 }, 1, true), /seqlens_k does not fit/);
    await assert.rejects(runOnce(ours, QWEN_15B, { batch: 1, seq: 4, cap: 600, lengths: [POSITIONS + 2], total: POSITIONS + 2 }, 1, true), /seqlens_k does not fit/);
  } finally {
    ours.dispose();
  }
});
