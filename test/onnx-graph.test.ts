/** The graphs the server writes itself, run by ONNX Runtime on the CPU. */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as ort from 'onnxruntime-node';
import { kvTailModel, ONNX_FLOAT, ONNX_FLOAT16 } from '../src/runtime/onnx-graph.js';

test('kv-tail returns the last n positions of every input, any shape, float32 and float16', async () => {
  const f32 = await ort.InferenceSession.create(kvTailModel(3, ONNX_FLOAT));
  assert.deepEqual(f32.inputNames, ['x0', 'x1', 'x2', 'starts']);
  const x = (k: number) => new ort.Tensor('float32', Float32Array.from({ length: 2 * 2 * 5 * 3 }, (_, i) => k * 1000 + i), [2, 2, 5, 3]);
  const out = await f32.run({ x0: x(0), x1: x(1), x2: x(2), starts: new ort.Tensor('int64', BigInt64Array.of(-2n), [1]) });
  for (let k = 0; k < 3; k++) {
    const y = out[`y${k}`]!;
    assert.deepEqual(y.dims, [2, 2, 2, 3]);
    // row 1, head 0: positions 3 and 4 of that [5, 3] slab
    const base = (1 * 2 + 0) * 5 * 3;
    assert.deepEqual(Array.from((y.data as Float32Array).subarray(12, 18)), Array.from({ length: 6 }, (_, i) => k * 1000 + base + 9 + i));
  }
  const f16 = await ort.InferenceSession.create(kvTailModel(1, ONNX_FLOAT16));
  const words = Uint16Array.from({ length: 1 * 1 * 4 * 2 }, (_, i) => 0x3c00 + i);
  const y = (await f16.run({ x0: new ort.Tensor('float16', words, [1, 1, 4, 2]), starts: new ort.Tensor('int64', BigInt64Array.of(-4n), [1]) }))['y0']!;
  assert.deepEqual(Array.from(y.data as Uint16Array), Array.from(words));
});
