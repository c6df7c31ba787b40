import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Admission } from '../src/guards/admission.js';
import { HttpError } from '../src/server/errors.js';

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
  await assert.rejects(a.run(async () => 3), (e: unknown) => e instanceof HttpError && e.status === 503 && e.code === 'queue_full'
    && Number(e.headers['Retry-After']) === 10);
  g.open();
  assert.deepEqual(await Promise.all([first, second]), [1, 2]);
  assert.deepEqual(order, ['first', 'second']);
});

test('a query that waits past the timeout gets 503 queue_timeout and never runs', async () => {
  const a = new Admission({ concurrency: 1, maxQueue: 5, timeoutMs: 50 });
  const g = gate();
  const first = a.run(() => g.wait);
  let ran = false;
  await assert.rejects(a.run(async () => { ran = true; }), (e: unknown) => e instanceof HttpError && e.code === 'queue_timeout');
  g.open();
  await first;
  await a.drain();
  assert.equal(ran, false);
});

test('errors of the work itself pass through unchanged', async () => {
  const a = new Admission({ concurrency: 2, maxQueue: 0, timeoutMs: 1000 });
  await assert.rejects(a.run(async () => { throw new Error('boom'); }), /boom/);
});
