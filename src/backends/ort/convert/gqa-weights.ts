/**
 * The weights the GQA builder (gqa-builder.ts) reads and writes: a source's weights by module name (an
 * export's initializers, or a GGUF file's blocks), block-quantized weights stacked for fused
 * projections, and the initializers it makes.
 */
import { floatsToHalfs, halfsToFloats } from '../../../runtime/float16.js';
import { ONNX_FLOAT, ONNX_FLOAT16, type Initializer } from '../../../runtime/onnx-proto.js';

export type GqaDtype = 'float32' | 'float16';

/**
 * A projection's weight block-quantized along its input (K) dimension, in MatMulNBits' layout: w[n][k] =
 * (q - zero_point) * scale + min for the block of k. `min` is not MatMulNBits' (it has no offset term):
 * the graph adds sum_k-in-block(x) * min per block beside it (Q4_1 and Q4_K store w = q * d + m).
 */
export interface BlockWeight {
  bits: 4 | 8;
  blockSize: number;
  /** Output rows and input width. */
  n: number;
  k: number;
  /** [n, k / blockSize, blockSize * bits / 8], element 2i in the low nibble of byte i at 4 bits. */
  data: Uint8Array;
  /** [n, k / blockSize]. */
  scales: Float32Array;
  /** Packed as MatMulNBits takes them, [n, ceil(blocks * bits / 8)]; absent: 2^(bits - 1). */
  zeroPoints?: Uint8Array;
  /** [n, k / blockSize], added to every weight of the block. */
  mins?: Float32Array;
}

/** Where the builder takes weights from, by Hugging Face module name. */
export interface WeightSource {
  /** float32 values in torch's layout ([out, in] for a projection), or undefined where the model lacks it. */
  floats(name: string): Float32Array | undefined;
  /** The weight block-quantized (losslessly, as stored), where the source stores it so. */
  blocks?(name: string): BlockWeight | undefined;
  /** Row count of a projection weight (its out dimension), without converting it. */
  rows?(name: string): number | undefined;
}

/** Finds weights by module name, whatever prefix or '_fp16' suffix the export gave them. */
export class Weights implements WeightSource {
  private readonly byName = new Map<string, Initializer>();

  constructor(all: ReadonlyMap<string, Initializer>) {
    for (const t of all.values()) {
      const name = t.name.replace(/_fp16$/, '');
      const at = name.search(/(^|\.)(model\.|lm_head\.)/);
      this.byName.set(at < 0 ? name : name.slice(name[at] === '.' ? at + 1 : at), t);
    }
  }

  get(name: string): Initializer | undefined {
    return this.byName.get(name);
  }

  floats(name: string): Float32Array | undefined {
    const t = this.get(name);
    return t && Weights.floats(t);
  }

  /** float32 values of a float32 or float16 initializer. */
  static floats(t: Initializer): Float32Array {
    if (t.dataType === ONNX_FLOAT) return new Float32Array(new Uint8Array(t.data).buffer);
    if (t.dataType === ONNX_FLOAT16) return halfsToFloats(new Uint16Array(new Uint8Array(t.data).buffer));
    throw new Error(`weight ${t.name} has element type ${t.dataType}; float32 or float16 expected`);
  }
}

export function tensor(name: string, dtype: GqaDtype, dims: number[], values: Float32Array): Initializer {
  const data = dtype === 'float32' ? new Uint8Array(values.buffer, values.byteOffset, values.byteLength) : new Uint8Array(floatsToHalfs(values).buffer);
  return { name, dataType: dtype === 'float32' ? ONNX_FLOAT : ONNX_FLOAT16, dims, data };
}

/** Rows of `parts` ([out_i, in] each) stacked, then transposed to [in, sum out_i]: a MatMul's right operand. */
export function stackTransposed(parts: readonly Float32Array[], inDim: number): { values: Float32Array; outDim: number } {
  const outDim = parts.reduce((s, p) => s + p.length / inDim, 0);
  const values = new Float32Array(inDim * outDim);
  let col = 0;
  for (const p of parts) {
    const rows = p.length / inDim;
    for (let r = 0; r < rows; r++) {
      for (let i = 0; i < inDim; i++) values[i * outDim + col + r] = p[r * inDim + i]!;
    }
    col += rows;
  }
  return { values, outDim };
}

/** Whether block weights can share one MatMulNBits (stacked along N). */
export function sameBlockForm(a: BlockWeight, b: BlockWeight): boolean {
  return a.bits === b.bits && a.blockSize === b.blockSize && a.k === b.k && !a.zeroPoints === !b.zeroPoints && !a.mins === !b.mins;
}

/** Block weights of one form stacked along N (fused q/k/v). */
export function stackBlocks(parts: readonly BlockWeight[]): BlockWeight {
  if (parts.length === 1) return parts[0]!;
  const cat = <A extends Uint8Array | Float32Array>(get: (p: BlockWeight) => A | undefined, make: (n: number) => A): A | undefined => {
    const xs = parts.map(get);
    if (xs.some((x) => x === undefined)) return undefined;
    const out = make(xs.reduce((sum, x) => sum + x!.length, 0));
    let at = 0;
    for (const x of xs) {
      out.set(x!, at);
      at += x!.length;
    }
    return out;
  };
  const p0 = parts[0]!;
  return {
    bits: p0.bits, blockSize: p0.blockSize, k: p0.k, n: parts.reduce((sum, p) => sum + p.n, 0),
    data: cat((p) => p.data, (n) => new Uint8Array(n))!,
    scales: cat((p) => p.scales, (n) => new Float32Array(n))!,
    zeroPoints: cat((p) => p.zeroPoints, (n) => new Uint8Array(n)),
    mins: cat((p) => p.mins, (n) => new Float32Array(n)),
  };
}
