/**
 * The position table (chunk ids in index order, tombstones, the live bitmap, a rebuild's remap) and the
 * filter bitmaps kept level with it: pure logic, no faiss.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Bitmap, PositionTable, Selections } from '../src/retrieval/positions.js';

test('positions follow chunk ids: a chunk is found by binary search, a removed one is not', () => {
  const t = PositionTable.empty();
  assert.equal(t.append([0, 1, 2]), 0);
  assert.equal(t.append([5, 9]), 3);
  assert.deepEqual([t.size, t.liveCount, t.tombstones], [5, 5, 0]);
  for (const [id, p] of [[0, 0], [2, 2], [5, 3], [9, 4]]) assert.equal(t.positionOf(id!), p);
  assert.equal(t.positionOf(3), -1);
  t.kill(1);
  t.kill(3);
  assert.deepEqual([t.liveCount, t.tombstones], [3, 2]);
  assert.equal(t.positionOf(5), -1, 'a removed chunk has no live position');
  assert.equal(t.positionOf(9), 4, 'the search still finds chunks past a tombstone');
  assert.equal(t.idAt(1), -1);
  assert.deepEqual([...t.snapshot()], [0, -2, 2, -6, 9]);
  assert.deepEqual([...t.livePositions()], [0, 2, 4]);
  assert.throws(() => t.append([9]), /does not follow/);
  assert.throws(() => t.kill(1), /already removed/);
  assert.throws(() => PositionTable.of([0, 3, 2]), /out of order/);
  const again = PositionTable.of(t.snapshot());
  assert.deepEqual([again.liveCount, again.positionOf(9), again.positionOf(5)], [3, 4, -1]);
});

test('a remap keeps the live positions in order, then the ones added during a rebuild', () => {
  const t = PositionTable.of([0, 1, 2, 3, 4, 5]);
  t.kill(1);
  const kept = t.livePositions(4); // a rebuild began when there were 4 positions: 0, 2, 3
  t.kill(2); // removed during the build
  t.append([6]);
  const r = t.remap(kept, Int32Array.from([4, 5, 6]));
  assert.deepEqual([...r.snapshot()], [0, -3, 3, 4, 5, 6]);
  assert.deepEqual([r.positionOf(3), r.positionOf(6), r.positionOf(2)], [2, 5, -1]);
  assert.equal(r.tombstones, 1);
  const c = r.copy();
  c.kill(0);
  assert.equal(r.liveCount, 5, 'a copy is its own');
});

test('a bitmap grows as positions do and counts its bits', () => {
  const b = new Bitmap(8);
  b.set(3);
  b.set(3);
  b.set(1000);
  assert.deepEqual([b.count, b.has(3), b.has(4), b.has(1000), b.has(5000)], [2, true, false, true, false]);
  b.clear(3);
  b.clear(4);
  assert.equal(b.count, 1);
  assert.ok(b.bytes.length >= 126);
});

test('filter bitmaps are built once, then follow adds and removals; the least recently used goes first', () => {
  const s = new Selections<string>(2);
  let builds = 0;
  const build = () => {
    builds++;
    const b = new Bitmap();
    b.set(0);
    return b;
  };
  const red = s.get('red', 'red', build);
  s.get('red', 'red', build);
  assert.equal(builds, 1);
  s.added(7, (f) => f === 'red');
  s.added(8, (f) => f === 'blue');
  assert.deepEqual([red.has(7), red.has(8), red.count], [true, false, 2]);
  s.removed(0);
  assert.equal(red.count, 1);
  s.get('blue', 'blue', build);
  s.get('red', 'red', build); // red used last: green pushes blue out
  s.get('green', 'green', build);
  assert.equal(builds, 3);
  s.get('red', 'red', build);
  assert.equal(builds, 3, 'red stayed');
  s.get('blue', 'blue', build);
  assert.equal(builds, 4, 'blue was dropped');
  s.clear();
  assert.equal(s.bytes, 0);
});
