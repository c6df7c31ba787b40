import assert from 'node:assert/strict';
import { test } from 'node:test';
import { BlockTable, DEFAULT_BLOCK_TABLE_BUCKETS } from '../src/generate/block-table.js';

test('a table grows through the buckets 4 -> 16 -> 64 -> 256 one push at a time, never straight to the largest', () => {
  const t = new BlockTable();
  assert.equal(t.capacity, 4);
  const seen: number[] = [t.bucket];
  for (let i = 0; i < 300; i++) {
    t.push(1000 + i);
    if (seen.at(-1) !== t.bucket) seen.push(t.bucket);
    assert.ok(t.capacity >= t.length);
  }
  assert.deepEqual(seen, [4, 16, 64, 256, 1024]);
  assert.equal(t.length, 300);
  assert.equal(t.get(0), 1000);
  assert.equal(t.get(299), 1299);
});

test('capacity at the bucket edges', () => {
  const t = new BlockTable();
  for (let i = 0; i < 4; i++) t.push(i);
  assert.equal(t.capacity, 4, 'exactly full stays in its bucket');
  t.push(4);
  assert.equal(t.capacity, 16);
  for (let i = 5; i < 17; i++) t.push(i);
  assert.equal(t.capacity, 64);
  assert.deepEqual(Array.from(t.ids()), Array.from({ length: 17 }, (_, i) => i), 'entries survive growth');
});

test('past the last bucket the capacity doubles', () => {
  assert.equal(BlockTable.capacityFor(4096), 4096);
  assert.equal(BlockTable.capacityFor(4097), 8192);
  assert.equal(BlockTable.capacityFor(20000), 32768);
  const t = new BlockTable([2, 3]);
  const caps: number[] = [];
  for (let i = 0; i < 13; i++) {
    t.push(i);
    if (caps.at(-1) !== t.capacity) caps.push(t.capacity);
  }
  assert.deepEqual(caps, [2, 3, 6, 12, 24]);
});

test('reserve jumps to the bucket that holds n, not beyond', () => {
  const t = new BlockTable();
  t.reserve(3);
  assert.equal(t.capacity, 4);
  t.reserve(17);
  assert.equal(t.capacity, 64);
  assert.equal(t.length, 0);
  assert.equal(BlockTable.capacityFor(0), 4);
  assert.equal(BlockTable.capacityFor(257, DEFAULT_BLOCK_TABLE_BUCKETS), 1024);
});

test('get, set and the ids view; out-of-range indexes throw', () => {
  const t = new BlockTable();
  t.push(7);
  t.push(9);
  t.set(1, 3);
  assert.equal(t.get(1), 3);
  const v = t.ids();
  assert.ok(v instanceof Int32Array);
  assert.deepEqual(Array.from(v), [7, 3]);
  assert.throws(() => t.get(2), RangeError);
  assert.throws(() => t.get(-1), RangeError);
  assert.throws(() => t.set(2, 0), RangeError);
});

test('countByBucket reports how many tables sit in each bucket', () => {
  const lengths = [1, 4, 5, 16, 17, 100];
  const tables = lengths.map((n) => {
    const t = new BlockTable();
    for (let i = 0; i < n; i++) t.push(i);
    return t;
  });
  assert.deepEqual(BlockTable.countByBucket(tables), { 4: 2, 16: 2, 64: 1, 256: 1 });
  assert.deepEqual(BlockTable.countByBucket([]), {});
});

test('invalid bucket lists are refused', () => {
  assert.throws(() => new BlockTable([]));
  assert.throws(() => new BlockTable([4, 4]));
  assert.throws(() => new BlockTable([16, 4]));
  assert.throws(() => new BlockTable([0, 4]));
  assert.throws(() => new BlockTable([2.5]));
});
