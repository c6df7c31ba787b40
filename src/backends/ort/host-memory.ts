/**
 * Host tensors' element types, and JavaScript's views of the memory ONNX Runtime allocated for them
 * (ort-direct.ts): one view per reserved region of the counting allocator, so that a large tensor adds none.
 */
import koffi from 'koffi';

export type HostTensorType = 'float32' | 'float16' | 'int64' | 'int32';

export const ELEMENT: Record<HostTensorType, { onnx: number; bytes: number }> = {
  float32: { onnx: 1, bytes: 4 }, float16: { onnx: 10, bytes: 2 }, int64: { onnx: 7, bytes: 8 }, int32: { onnx: 6, bytes: 4 },
};
export const BY_ONNX = new Map(Object.entries(ELEMENT).map(([k, v]) => [v.onnx, k as HostTensorType]));

export type HostArray = Float32Array | Uint16Array | BigInt64Array | Int32Array;

/** `count` elements of `type` at `byteOffset` of `ab` (all of it where count is not given). */
export function view(type: HostTensorType, ab: ArrayBuffer, byteOffset = 0, count?: number): HostArray {
  switch (type) {
    case 'float32': return new Float32Array(ab, byteOffset, count);
    case 'float16': return new Uint16Array(ab, byteOffset, count);
    case 'int64': return new BigInt64Array(ab, byteOffset, count);
    case 'int32': return new Int32Array(ab, byteOffset, count);
  }
}

/** A reserved region of native memory (counting-allocator.c) and the one ArrayBuffer over it. */
interface Region {
  start: bigint;
  end: bigint;
  buffer: ArrayBuffer;
}
export const regions: Region[] = [];

/**
 * Makes the one view of each of the counting allocator's reserved regions (ort-allocator.ts calls it
 * once they are reserved): a tensor whose memory lies in one is read through that view (dataOf), with
 * no new ArrayBuffer, so V8's external memory does not grow with every large tensor.
 */
export function viewRegions(list: readonly { base: unknown; size: number }[]): void {
  for (const { base, size } of list) {
    const start = koffi.address(base) as bigint;
    if (regions.some((r) => r.start === start)) continue;
    regions.push({ start, end: start + BigInt(size), buffer: koffi.view(base, size) as ArrayBuffer });
  }
}

/** Bytes of the regions' views (they count in process.memoryUsage().external, yet hold only what is in use). */
export function regionViewBytes(): number {
  return regions.reduce((s, r) => s + r.buffer.byteLength, 0);
}
