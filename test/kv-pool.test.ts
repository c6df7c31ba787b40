import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KvCachePool } from '../src/backends/ort/kv-pool.js';
import { Pacer } from '../src/runtime/pacer.js';

const shape = { numLayers: 2, numKvHeads: 2, headDim: 3 };
const BS = 4;

/** A present tensor [rows, H, width, D] whose values encode (layer/kind, row, head, pos, d). */
function present(rows: number, width: number): Float32Array[] {
  return Array.from({ length: 2 * shape.numLayers }, (_, i) => {
    const a = new Float32Array(rows * shape.numKvHeads * width * shape.headDim);
    for (let r = 0; r < rows; r++)
      for (let h = 0; h < shape.numKvHeads; h++)
        for (let p = 0; p < width; p++)
          for (let d = 0; d < shape.headDim; d++)
            a[((r * shape.numKvHeads + h) * width + p) * shape.headDim + d] = i * 10000 + r * 1000 + h * 100 + p * 10 + d;
    return a;
  });
}

test('scatter then gather returns each token in its slot, rows right-aligned to the width', () => {
  const pool = new KvCachePool(shape, 8, BS);
  assert.equal(pool.bytes, 8 * BS * pool.bytesPerSlot);
  // row 0: 6 tokens in blocks [5, 2]; row 1: 3 tokens in block [7]; written from a 2-row output of width 6
  const p = present(2, 6);
  pool.scatter(p, 2, 6, 0, 0, [5, 2], 0, 6);
  pool.scatter(p, 2, 6, 1, 3, [7], 0, 3);
  const [k0] = pool.gather([{ blocks: [5, 2], length: 6 }, { blocks: [7], length: 3 }], 6);
  const at = (r: number, h: number, pos: number) => Array.from(k0!.subarray(((r * 2 + h) * 6 + pos) * 3, ((r * 2 + h) * 6 + pos) * 3 + 3));
  assert.deepEqual(at(0, 1, 5), [1150, 1151, 1152].map((x) => x - 1000));
  assert.deepEqual(at(0, 0, 0), [0, 1, 2]);
  // row 1's 3 tokens came from positions 3..5 of its output row and sit at positions 3..5 (right-aligned)
  assert.deepEqual(at(1, 0, 3), [1030, 1031, 1032]);
  assert.deepEqual(at(1, 1, 5), [1150, 1151, 1152]);
  assert.deepEqual(at(1, 0, 0), [0, 0, 0], 'padding stays zero');
});

test('appending one token at a time crosses block boundaries correctly', () => {
  const pool = new KvCachePool(shape, 4, BS);
  const blocks = [3, 1];
  for (let t = 0; t < 7; t++) {
    const p = present(1, 1).map((a) => a.map((x) => x + t * 10)); // position t encoded as p*10
    pool.scatter(p, 1, 1, 0, 0, blocks, t, 1);
  }
  const gathered = pool.gather([{ blocks, length: 7 }], 7);
  const v = gathered[3]!; // layer 1 value
  for (let t = 0; t < 7; t++) assert.equal(v[t * 3], 30000 + t * 10);
});

test('copyBlock duplicates every layer of a block (copy-on-write)', () => {
  const pool = new KvCachePool(shape, 4, BS);
  pool.scatter(present(1, 4), 1, 4, 0, 0, [0], 0, 4);
  pool.copyBlock(0, 2);
  assert.deepEqual(pool.gather([{ blocks: [2], length: 4 }], 4), pool.gather([{ blocks: [0], length: 4 }], 4));
});

test('a paced gather copies the same as gather, letting the event loop run between its slices', async () => {
  const pool = new KvCachePool(shape, 8, BS);
  const p = present(2, 6);
  pool.scatter(p, 2, 6, 0, 0, [5, 2], 0, 6);
  pool.scatter(p, 2, 6, 1, 3, [7], 0, 3);
  const rows = [{ blocks: [5, 2], length: 6 }, { blocks: [7], length: 3 }];
  const want = pool.gather(rows, 6, 'left');
  const got = want.map((a) => new Float32Array(a.length));
  // A callback on every turn of the event loop, counting the turns the gather let pass.
  let turns = 0;
  let done = false;
  const tick = () => {
    turns++;
    if (!done) setImmediate(tick);
  };
  setImmediate(tick);
  // sliceMs 0: a pause after every row of every layer's keys or values (8 of them here).
  await pool.gatherIntoPaced(rows, 6, 'left', got, 0);
  done = true;
  assert.deepEqual(got, want);
  assert.ok(turns >= 4, `the event loop turned while it copied (${turns} turns; a gather in one go lets none)`);
});

test('a paced gather given a Pacer continues its slice: a spent slice turns before the first copy', async () => {
  const pool = new KvCachePool(shape, 4, BS);
  const p = present(1, 2);
  pool.scatter(p, 1, 2, 0, 0, [1], 0, 2);
  const rows = [{ blocks: [1], length: 2 }];
  const want = pool.gather(rows, 2, 'left');
  const got = want.map((a) => new Float32Array(a.length));
  const pacer = new Pacer(1e9); // never spent: no turn at all
  await pool.gatherIntoPaced(rows, 2, 'left', got, pacer);
  assert.deepEqual(got, want);
  assert.equal(pacer.yields, 0);
  const spent = new Pacer(0);
  await pool.gatherIntoPaced(rows, 2, 'left', got, spent);
  assert.ok(spent.yields >= 4, `a turn before each row of each layer's keys or values (${spent.yields})`);
});
