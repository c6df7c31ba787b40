/** The graphs the server writes itself (and the protobuf code that writes and reads them), run by ONNX Runtime on the CPU. */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as ort from 'onnxruntime-node';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { kvTailModel, ONNX_FLOAT, ONNX_FLOAT16 } from '../src/backends/ort/onnx-graph.js';
import { externalDataFiles, int64s, readInitializers, Writer, writeModel } from '../src/runtime/onnx-proto.js';
import { ROOT } from './helpers.js';

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

test('onnx-proto: a written model\'s initializers read back; graph attributes reach ONNX Runtime', async () => {
  const w = Float32Array.of(1, 2, 3, 4, 5, 6);
  const model = writeModel({
    name: 'g',
    nodes: [
      { op: 'MatMul', inputs: ['x', 'w'], outputs: ['y0'] },
      { op: 'LeakyRelu', inputs: ['y0'], outputs: ['y'], attrs: { alpha: { float: 0.5 } } },
    ],
    initializers: [{ name: 'w', dataType: ONNX_FLOAT, dims: [3, 2], data: new Uint8Array(w.buffer) }, int64s('unused', [7n, -1n])],
    inputs: [{ name: 'x', elemType: ONNX_FLOAT, dims: ['n', 3] }],
    outputs: [{ name: 'y', elemType: ONNX_FLOAT, dims: ['n', 2] }],
    opsets: { '': 17 },
  });
  const inits = readInitializers(model);
  assert.deepEqual([...inits.keys()], ['w', 'unused']);
  assert.deepEqual(inits.get('w')!.dims, [3, 2]);
  assert.deepEqual(Array.from(new Float32Array(inits.get('w')!.data.buffer)), Array.from(w));
  assert.deepEqual(Array.from(new BigInt64Array(inits.get('unused')!.data.buffer)), [7n, -1n]);
  const s = await ort.InferenceSession.create(model);
  const y = (await s.run({ x: new ort.Tensor('float32', Float32Array.of(1, 0, -1), [1, 3]) }))['y']!;
  // [1, 0, -1] x [[1, 2], [3, 4], [5, 6]] = [-4, -4], then leaky relu 0.5
  assert.deepEqual(Array.from(y.data as Float32Array), [-2, -2]);
});

test('onnx-proto: the shipped decoder\'s fp16 weights read back with the dims config.json implies', async () => {
  const inits = readInitializers(await readFile(path.join(ROOT, 'models', 'decoder', 'onnx', 'model.onnx')));
  const q = [...inits.values()].find((t) => /layers\.0\.self_attn\.k_proj\.weight/.test(t.name))!;
  assert.equal(q.dataType, ONNX_FLOAT16);
  assert.deepEqual(q.dims, [2 * 32, 256]); // kv_heads x head_dim, hidden
  assert.equal(q.data.length, 64 * 256 * 2);
});

test('onnx-proto: external data locations are found (a model over 2 GiB keeps its weights outside)', () => {
  // TensorProto{dims 1, data_type 2, name 8, external_data 13 {key 1, value 2}, data_location 14 = EXTERNAL}
  const w = new Writer();
  w.msg(7, (g) => {
    for (const file of ['weights.bin', 'weights.bin', 'other.data']) {
      g.msg(5, (t) => {
        t.int(1, 4).int(2, ONNX_FLOAT).str(8, `w_${file}`);
        t.msg(13, (e) => e.str(1, 'location').str(2, file));
        t.msg(13, (e) => e.str(1, 'offset').str(2, '0'));
        t.int(14, 1);
      });
    }
  });
  assert.deepEqual(externalDataFiles(w.finish()), ['weights.bin', 'other.data']);
  assert.throws(() => readInitializers(w.finish()), /external data/);
});
