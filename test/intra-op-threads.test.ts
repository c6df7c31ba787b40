/**
 * RAGGUARD_INTRA_OP_THREADS reaches ONNX Runtime: a direct session made with n intra-op threads starts
 * n - 1 pool threads of its own (the calling thread is the n-th), counted in /proc/self/task as the
 * session is made; its runs give the same output whatever the count. RAGGUARD_INTRA_OP_SPIN: a session
 * whose threads spin within runs computes the same output as one whose threads sleep.
 */
import assert from 'node:assert/strict';
import { readdirSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { loadConfig } from '../src/config/config.js';
import { applySessionSettings, DirectSession, setIntraOpSpin, setIntraOpThreads, type IntraOpSpin } from '../src/backends/ort/ort-direct.js';
import { ROOT } from './helpers.js';

const MODEL = path.join(ROOT, 'models/embedder/onnx/model.onnx');
const threads = () => readdirSync('/proc/self/task').length;

/** The threads a new session started, and its output for fixed ids. */
async function made(n: number, spin: IntraOpSpin = 'off'): Promise<{ started: number; out: number[] }> {
  applySessionSettings({ intraOpThreads: n, intraOpSpin: spin });
  const before = threads();
  const s = DirectSession.create(MODEL);
  assert.ok(s, 'the C API binds here');
  const started = threads() - before;
  try {
    const ids = s.tensor('int64', [1, 4]);
    const mask = s.tensor('int64', [1, 4]);
    (ids.data as BigInt64Array).set([1n, 5n, 9n, 2n]);
    (mask.data as BigInt64Array).fill(1n);
    const feeds: Record<string, typeof ids> = { input_ids: ids, attention_mask: mask };
    if (s.inputs.some((i) => i.name === 'token_type_ids')) {
      const types = s.tensor('int64', [1, 4]);
      (types.data as BigInt64Array).fill(0n);
      feeds['token_type_ids'] = types;
    }
    const r = await s.run(feeds, { [s.outputs[0]!.name]: null });
    const t = r[s.outputs[0]!.name]!;
    const out = Array.from(t.data as Float32Array);
    t.dispose();
    for (const f of Object.values(feeds)) f.dispose();
    return { started, out };
  } finally {
    s.dispose();
  }
}

test('RAGGUARD_INTRA_OP_THREADS: default 0 (ONNX Runtime\'s own), a count accepted, a negative one named', () => {
  assert.equal(loadConfig({}).intraOpThreads, 0);
  assert.equal(loadConfig({ RAGGUARD_INTRA_OP_THREADS: '1' }).intraOpThreads, 1);
  assert.throws(() => loadConfig({ RAGGUARD_INTRA_OP_THREADS: '-1' }), /RAGGUARD_INTRA_OP_THREADS: expected an integer/);
  assert.throws(() => setIntraOpThreads(-1), RangeError);
});

test('a session made with 1, 2 and 3 intra-op threads starts 0, 1 and 2 pool threads; the same output each time', { skip: process.platform !== 'linux' && 'Linux only' }, async () => {
  await made(1); // the first session of the process also starts the environment's own threads
  const one = await made(1);
  const two = await made(2);
  const three = await made(3);
  assert.equal(one.started, 0);
  assert.equal(two.started, 1);
  assert.equal(three.started, 2);
  for (const o of [two.out, three.out]) {
    assert.equal(o.length, one.out.length);
    o.forEach((x, i) => assert.ok(Math.abs(x - one.out[i]!) < 1e-5, `element ${i}: ${x} vs ${one.out[i]}`));
  }
  setIntraOpThreads(0);
});

test('RAGGUARD_INTRA_OP_SPIN: default runs, off accepted, anything else named', () => {
  assert.equal(loadConfig({}).intraOpSpin, 'runs');
  assert.equal(loadConfig({ RAGGUARD_INTRA_OP_SPIN: 'off' }).intraOpSpin, 'off');
  assert.throws(() => loadConfig({ RAGGUARD_INTRA_OP_SPIN: 'always' }), /RAGGUARD_INTRA_OP_SPIN: expected one of off, runs/);
  assert.throws(() => setIntraOpSpin('always' as IntraOpSpin), RangeError);
});

test('two intra-op threads spinning within runs: the same pool and the same output as sleeping ones, run after run', { skip: process.platform !== 'linux' && 'Linux only' }, async () => {
  await made(2);
  const sleeping = await made(2, 'off');
  const spinning = await made(2, 'runs');
  const again = await made(2, 'runs');
  assert.equal(spinning.started, sleeping.started);
  for (const o of [spinning.out, again.out]) {
    assert.equal(o.length, sleeping.out.length);
    o.forEach((x, i) => assert.ok(Math.abs(x - sleeping.out[i]!) < 1e-5, `element ${i}: ${x} vs ${sleeping.out[i]}`));
  }
  applySessionSettings({ intraOpThreads: 0, intraOpSpin: 'off' });
});
