/** The event loop's turns: model runs one at a time through the gate, request preparation one per turn. */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { gatedRun, gateStats } from '../src/runtime/run-gate.js';
import { nextTurn } from '../src/server/turns.js';

test('requests prepare in arrival order, one per turn of the event loop', async () => {
  const order: string[] = [];
  const a = nextTurn().then(() => {
    order.push('A');
    // Work the first one schedules for later runs before the third one's turn: turns are not bunched.
    setImmediate(() => order.push('after A'));
  });
  const b = nextTurn().then(() => order.push('B'));
  const c = nextTurn().then(() => order.push('C'));
  await Promise.all([a, b, c]);
  assert.deepEqual(order, ['A', 'B', 'after A', 'C']);
});

test('model runs pass the gate one at a time, first come first served', async () => {
  const events: string[] = [];
  let live = 0;
  const run = (name: string) => gatedRun(async () => {
    live++;
    assert.equal(live, 1, `${name} runs alone`);
    events.push(`${name} start`);
    await new Promise((r) => setImmediate(r));
    await new Promise((r) => setImmediate(r));
    events.push(`${name} end`);
    live--;
    return name;
  });
  const before = gateStats().runs;
  assert.deepEqual(await Promise.all([run('x'), run('y'), run('z')]), ['x', 'y', 'z']);
  assert.deepEqual(events, ['x start', 'x end', 'y start', 'y end', 'z start', 'z end']);
  assert.equal(gateStats().runs - before, 3);
  assert.deepEqual([gateStats().busy, gateStats().waiting], [false, 0]);
  // A failed run passes the gate on all the same.
  await assert.rejects(gatedRun(() => Promise.reject(new Error('boom'))), /boom/);
  assert.equal(await run('after'), 'after');
});
