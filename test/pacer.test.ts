/** Pacer: a turn of the event loop once a slice is spent, none before; the slice restarts after each. */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Pacer } from '../src/runtime/pacer.js';

test('a slice not yet spent: no turn, not even a promise', () => {
  const p = new Pacer(1e9);
  assert.equal(p.due, false);
  assert.equal(p.pace(), undefined);
  assert.equal(p.yields, 0);
});

test('a spent slice: the event loop turns (an immediate queued before runs first), then a new slice', async () => {
  const p = new Pacer(0);
  const order: string[] = [];
  setImmediate(() => order.push('immediate'));
  await p.pace();
  order.push('after pace');
  assert.deepEqual(order, ['immediate', 'after pace']);
  assert.equal(p.yields, 1);
});

test('start() and turn() begin a new slice', async () => {
  const p = new Pacer(1e9);
  await p.turn();
  assert.equal(p.yields, 1);
  assert.equal(p.due, false);
  p.start();
  assert.equal(p.due, false);
});
