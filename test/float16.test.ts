import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KvCachePool } from '../src/backends/ort/kv-pool.js';
import { kvBytesPerToken } from '../src/generate/decoder-shape.js';
import { floatToHalf, halfsToFloats, halfToFloat } from '../src/runtime/float16.js';

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

test('float16: round to nearest even, subnormals, overflow to infinity, and back', () => {
  // Values a half holds exactly come back exactly.
  for (const x of [0, 1, -2.5, 65504, 6.103515625e-5, 5.960464477539063e-8]) assert.equal(halfToFloat(floatToHalf(x)), x);
  assert.equal(floatToHalf(1), 0x3c00);
  assert.equal(floatToHalf(65520), 0x7c00, 'past the largest half: infinity');
  assert.equal(floatToHalf(1 + 2 ** -11), 0x3c00, 'a tie rounds to even (down)');
  assert.equal(floatToHalf(1 + 3 * 2 ** -11), 0x3c02, 'a tie rounds to even (up)');
  assert.equal(floatToHalf(2 ** -25), 0, 'below half the smallest subnormal: zero');
  assert.equal(floatToHalf(2 ** -24), 1, 'the smallest subnormal');
  assert.ok(Math.abs(halfToFloat(floatToHalf(0.1)) - 0.1) < 1e-4);
});
