/** The event loop's turns: model runs one at a time through the gate, request preparation one per turn. */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { gatedRun, gateStats } from '../src/runtime/run-gate.js';
import { nextTurn, Turns } from '../src/server/turns.js';

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

describe('intake before preparation (Turns, on a clock the test moves)', () => {
  const turn = () => new Promise<void>((r) => setImmediate(r));
  function setup() {
    let now = 0;
    const timers: (() => void)[] = [];
    const turns = new Turns({ quietMs: 50, windowMs: 500, now: () => now, after: (fn) => void timers.push(fn) });
    let prepared = 0;
    const prepare = () => void turns.next().then(() => prepared++);
    return {
      turns, timers, prepare, prepared: () => prepared,
      advance: (ms: number) => (now += ms),
      /** Fires the pending timer (the test's stand-in for its delay having passed). */
      fire: () => timers.shift()!(),
    };
  }

  test('a request arriving alone is prepared on the next turn, with no wait', async () => {
    const t = setup();
    t.turns.arrived();
    t.prepare();
    await turn();
    await turn();
    assert.equal(t.prepared(), 1);
    assert.equal(t.timers.length, 0);
  });

  test('while a burst keeps arriving, preparation waits; once arrivals pause it goes on, one per turn', async () => {
    const t = setup();
    for (let i = 0; i < 3; i++) t.turns.arrived();
    t.prepare();
    t.prepare();
    await turn();
    await turn();
    assert.equal(t.prepared(), 0, 'waits while the burst arrives');
    assert.equal(t.timers.length, 1);
    // More arrive before the quiet period: still waiting.
    t.advance(30);
    t.turns.arrived();
    t.fire();
    await turn();
    assert.equal(t.prepared(), 0);
    assert.equal(t.timers.length, 1);
    // Quiet for 50 ms: preparation goes on, one per turn.
    t.advance(50);
    t.fire();
    assert.equal(t.prepared(), 0, 'resolved on a later microtask');
    await Promise.resolve();
    assert.equal(t.prepared(), 1, 'the first at once');
    await turn();
    assert.equal(t.prepared(), 2, 'the second on the next turn');
  });

  test('a stream that never pauses waits one window, then is prepared as it comes; after a pause a burst waits again', async () => {
    const t = setup();
    t.turns.arrived();
    t.turns.arrived();
    t.prepare();
    await turn();
    // Arrivals every 40 ms (under the quiet period) for longer than the window.
    let waited = 0;
    while (t.prepared() === 0) {
      assert.ok(waited <= 500, `still waiting after ${waited} ms`);
      t.advance(40);
      waited += 40;
      t.turns.arrived();
      if (t.timers.length > 0) t.fire();
      await turn();
    }
    assert.ok(waited >= 500, `prepared after ${waited} ms: the window is 500`);
    // Still arriving without a pause: the next preparations do not wait again.
    t.advance(40);
    t.turns.arrived();
    t.turns.arrived();
    t.prepare();
    await turn();
    await turn();
    assert.equal(t.prepared(), 2);
    assert.equal(t.timers.length, 0);
    // A pause, then a new burst: it waits again.
    t.advance(60);
    t.prepare(); // a quiet turn re-arms
    await turn();
    await turn();
    assert.equal(t.prepared(), 3);
    t.turns.arrived();
    t.turns.arrived();
    t.prepare();
    await turn();
    await turn();
    assert.equal(t.prepared(), 3);
    assert.equal(t.timers.length, 1);
  });
});
