/**
 * What every backend and the guards know of a decoder: its layer dimensions and the element type of its
 * KV cache, and the bytes a token of KV takes. The ONNX Runtime decoder (backends/ort/decoder-model.ts)
 * and the CUDA decoder (backends/cuda) each read it from their model files. Also the KV layouts of an ONNX
 * decoder's graph and a genai buffer's capacity: the guard's memory model sizes a run's KV buffers by them,
 * so they live here, not in the backend.
 */

export interface DecoderShape {
  numLayers: number;
  hiddenSize: number;
  numHeads: number;
  intermediateSize: number;
  numKvHeads: number;
  headDim: number;
  vocabSize: number;
  maxPositions: number;
  /** Element type of the past/present KV tensors (and of the activations). */
  kvDtype: KvDtype;
}

export type KvDtype = 'float32' | 'float16';

/**
 * How an ONNX decoder's graph takes its KV cache: 'optimum' (rows right-aligned, a longer present each
 * run) or 'genai' (rows left-aligned in a buffer of some capacity, written in place).
 */
export type KvLayout = 'optimum' | 'genai';

/** Capacity of a genai past buffer: room for `tokens` and some steps to come, in 64-position steps. */
export function bufferCapacity(tokens: number, maxPositions: number): number {
  return Math.min(Math.ceil((tokens + 16) / 64) * 64, Math.max(tokens, maxPositions));
}
export type KvArray = Float32Array | Uint16Array;

export interface KvShape {
  numLayers: number;
  numKvHeads: number;
  headDim: number;
  /** float32 when absent. */
  kvDtype?: KvDtype;
}

export const dtypeBytes = (d: KvDtype | undefined): number => (d === 'float16' ? 2 : 4);

/** KV bytes one token takes across all layers: a key and a value per layer and KV head. */
export function kvBytesPerToken(shape: KvShape): number {
  return 2 * shape.numLayers * shape.numKvHeads * shape.headDim * dtypeBytes(shape.kvDtype);
}

/** A zeroed array of `n` elements of the KV type. */
export function kvArray(dtype: KvDtype | undefined, n: number): KvArray {
  return dtype === 'float16' ? new Uint16Array(n) : new Float32Array(n);
}

