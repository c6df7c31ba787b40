/**
 * What every backend and the guards know of a decoder: its layer dimensions and the element type of its
 * KV cache, and the bytes a token of KV takes. The ONNX Runtime decoder (backends/ort/decoder-model.ts)
 * and the CUDA decoder (backends/cuda) each read it from their model files.
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

