import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Admission } from '../src/guards/admission.js';
import { BusyError } from '../src/runtime/errors.js';
import { toHttpError } from '../src/server/errors.js';

function gate(): { wait: Promise<void>; open: () => void } {
  let open!: () => void;
  const wait = new Promise<void>((r) => (open = r));
  return { wait, open };
}

test('runs up to the concurrency, queues up to the limit, sheds the rest with 503 queue_full', async () => {
  const a = new Admission({ concurrency: 1, maxQueue: 1, timeoutMs: 10_000 });
  const g = gate();
  const order: string[] = [];
  const first = a.run(async () => { await g.wait; order.push('first'); return 1; });
  const second = a.run(async () => { order.push('second'); return 2; });
  assert.equal(a.running, 1);
  assert.equal(a.waiting, 1);
  await assert.rejects(a.run(async () => 3), (e: unknown) => e instanceof BusyError && e.code === 'queue_full'
    && e.retryAfterSeconds === 10 && toHttpError(e).status === 503 && toHttpError(e).headers['Retry-After'] === '10');
  g.open();
  assert.deepEqual(await Promise.all([first, second]), [1, 2]);
  assert.deepEqual(order, ['first', 'second']);
});

test('a query that waits past the timeout gets 503 queue_timeout and never runs', async () => {
  const a = new Admission({ concurrency: 1, maxQueue: 5, timeoutMs: 50 });
  const g = gate();
  const first = a.run(() => g.wait);
  let ran = false;
  await assert.rejects(a.run(async () => { ran = true; }), (e: unknown) => e instanceof BusyError && e.code === 'queue_timeout');
  g.open();
  await first;
  await a.drain();
  assert.equal(ran, false);
});

test('errors of the work itself pass through unchanged', async () => {
  const a = new Admission({ concurrency: 2, maxQueue: 0, timeoutMs: 1000 });
  await assert.rejects(a.run(async () => { throw new Error('boom'); }), /boom/);
});

test('tickets count queries still being read, so a burst past the limits is shed before any body is parsed', async () => {
  const a = new Admission({ concurrency: 1, maxQueue: 1, timeoutMs: 600_000 });
  const t1 = a.ticket();
  const t2 = a.ticket();
  assert.ok(t1 && t2);
  assert.equal(a.ticket(), null, 'two arriving queries fill one slot and one queue place');
  t2.release();
  t2.release(); // idempotent
  const t3 = a.ticket();
  assert.ok(t3);
  let open!: () => void;
  const first = a.run(() => new Promise<number>((r) => (open = () => r(1))), undefined, t1);
  assert.equal(a.ticket(), null, 'one running, one arriving');
  t3.release();
  const t4 = a.ticket();
  assert.ok(t4, 'a released ticket frees its place');
  t4.release();
  open();
  assert.equal(await first, 1);
});
