import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KvCachePool, kvBytesPerToken } from '../src/generate/kv-pool.js';
import { halfsToFloats, halfToFloat } from '../src/runtime/float16.js';

test('half-precision words decode to their float values', () => {
  assert.equal(halfToFloat(0x3c00), 1);
  assert.equal(halfToFloat(0xc000), -2);
  assert.equal(halfToFloat(0x3555), 0.333251953125);
  assert.equal(halfToFloat(0x7bff), 65504);
  assert.equal(halfToFloat(0x0001), 2 ** -24);
  assert.equal(halfToFloat(0x7c00), Infinity);
  assert.equal(halfToFloat(0xfc00), -Infinity);
  assert.ok(Number.isNaN(halfToFloat(0x7e00)));
  assert.deepEqual(Array.from(halfsToFloats(Uint16Array.of(0, 0x8000, 0x3800))), [0, -0, 0.5]);
});

test('a float16 KV pool takes half the bytes and moves 16-bit words unchanged', () => {
  const shape = { numLayers: 1, numKvHeads: 1, headDim: 2 };
  assert.equal(kvBytesPerToken({ ...shape, kvDtype: 'float16' }) * 2, kvBytesPerToken(shape));
  const pool = new KvCachePool({ ...shape, kvDtype: 'float16' }, 4, 2);
  const words = Uint16Array.of(0x3c00, 0xc000, 0x7bff, 0x0001, 0x3555, 0x8000);
  pool.scatter([words, words], 1, 3, 0, 0, [2, 1], 0, 3);
  const [k] = pool.gather([{ blocks: [2, 1], length: 3 }], 4);
  assert.ok(k instanceof Uint16Array);
  assert.deepEqual(Array.from(k), [0, 0, ...words]);
});
