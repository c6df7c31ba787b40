/** The event loop's turns: model runs one at a time through the gate, request preparation one every other turn. */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { gatedRun, gateStats } from '../src/runtime/run-gate.js';
import { MAX_HOLD_MS, nextTurn, noteArrival, setMaxHold } from '../src/runtime/turns.js';

test('requests prepare in arrival order, one every other turn of the event loop', async () => {
  const order: string[] = [];
  // Counts the turns of the event loop (an immediate each turn) while the steps run.
  let turn = 0;
  let ticking = true;
  const tick = () => {
    turn++;
    if (ticking) setImmediate(tick);
  };
  setImmediate(tick);
  const at: number[] = [];
  const a = nextTurn().then(() => {
    order.push('A');
    at.push(turn);
    // Work the first one schedules for later runs before the next one's turn: turns are not bunched.
    setImmediate(() => order.push('after A'));
  });
  const b = nextTurn().then(() => {
    order.push('B');
    at.push(turn);
  });
  const c = nextTurn().then(() => {
    order.push('C');
    at.push(turn);
  });
  await Promise.all([a, b, c]);
  ticking = false;
  assert.deepEqual(order, ['A', 'after A', 'B', 'C']);
  // A turn without a step between two steps: a new connection accepted on one turn's poll has its
  // request read on the next one's before another step runs.
  assert.ok(at[1]! - at[0]! >= 2 && at[2]! - at[1]! >= 2, `steps on turns ${at.join(', ')}`);
});

test('while queries keep arriving, preparation waits for a turn without an arrival; then one every other turn again', async () => {
  setMaxHold(3_600_000); // no clock in this test: the hold ends by the turns alone
  try {
    const order: string[] = [];
    noteArrival(); // a query read in this turn
    const a = nextTurn().then(() => order.push('A'));
    const b = nextTurn().then(() => order.push('B'));
    // Arrivals in each of the next three turns (as a burst's connections are read, one a turn).
    for (let i = 1; i <= 3; i++) {
      await new Promise<void>((r) => setImmediate(r));
      order.push(`arrival ${i}`);
      noteArrival();
    }
    await Promise.all([a, b]);
    assert.deepEqual(order, ['arrival 1', 'arrival 2', 'arrival 3', 'A', 'B']);
  } finally {
    setMaxHold(MAX_HOLD_MS);
  }
});

test('a hold that has run out lets steps go one every other turn while arrivals continue', async () => {
  setMaxHold(0);
  try {
    const order: string[] = [];
    noteArrival();
    const a = nextTurn().then(() => order.push('A'));
    const b = nextTurn().then(() => order.push('B'));
    const arrivals = (async () => {
      for (let i = 1; i <= 3; i++) {
        await new Promise<void>((r) => setImmediate(r));
        order.push(`arrival ${i}`);
        noteArrival();
      }
    })();
    await Promise.all([a, b, arrivals]);
    assert.deepEqual(order.slice(0, 4), ['A', 'arrival 1', 'arrival 2', 'B']);
  } finally {
    setMaxHold(MAX_HOLD_MS);
  }
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
