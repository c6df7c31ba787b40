/**
 * Small ONNX graphs the server builds itself, written straight as protobuf (no onnx package in Node).
 *
 * kvTailModel: takes the last `n` positions of each present-KV tensor [batch, kv_heads, positions,
 * head_dim] (inputs x0..xK-1, plus `starts` = [-n]) and returns them as y0..yK-1. Run on the device
 * that holds the present KV, with outputs in host memory, it is how the engine writes the device's new
 * tokens back to the host pool: ONNX Runtime's own copy brings back only the tail, a few tokens per row
 * (onnxruntime-node 1.30 cannot download a 'gpu-buffer' tensor through Tensor.getData: it aborts).
 */

import { int64s, ONNX_INT64, writeModel, type Dim } from '../../runtime/onnx-proto.js';

export { ONNX_FLOAT, ONNX_FLOAT16 } from '../../runtime/onnx-proto.js';

export function kvTailModel(count: number, elemType: number): Uint8Array {
  const dims: Dim[] = ['batch', 'kv_heads', 'positions', 'head_dim'];
  const ids = Array.from({ length: count }, (_, i) => i);
  return writeModel({
    name: 'kv_tail',
    nodes: ids.map((i) => ({ op: 'Slice', inputs: [`x${i}`, 'starts', 'ends', 'axes'], outputs: [`y${i}`] })),
    initializers: [int64s('ends', [2n ** 62n]), int64s('axes', [2n])],
    inputs: [...ids.map((i) => ({ name: `x${i}`, elemType, dims })), { name: 'starts', elemType: ONNX_INT64, dims: [1] }],
    outputs: ids.map((i) => ({ name: `y${i}`, elemType, dims: ['batch', 'kv_heads', 'tail', 'head_dim'] })),
    opsets: { '': 17 },
  });
}
