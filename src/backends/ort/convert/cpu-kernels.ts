/** Who runs a converted GGUF's block products (gqa-builder.ts): ONNX Runtime's MatMulNBits, or ragguard's QMatMul8 and QMatMul4. */
import type { BlockWeight } from './gqa-weights.js';

/** Who runs a converted GGUF's block products: ONNX Runtime's MatMulNBits or ragguard's QMatMul8 and QMatMul4. */
export type CpuKernels = 'ragguard' | 'onnxruntime';

/** The opsets a graph built with `ops` imports (QMatMul8 and QMatMul4 are in domain 'ragguard'). */
export function gqaOpsets(ops: CpuKernels | undefined): Record<string, number> {
  return { '': 17, 'com.microsoft': 1, ...(ops === 'ragguard' ? { ragguard: 1 } : {}) };
}

/**
 * Whether ragguard's kernels take these blocks: 8 bits at zero point 128 (QMatMul8) or 4 bits
 * (QMatMul4, any zero points), blocks a power of two from 16 that divides K.
 */
export function qmatmulTakes(b: BlockWeight): boolean {
  const bits = b.bits === 8 ? !b.zeroPoints : b.bits === 4;
  return bits && b.blockSize >= 16 && (b.blockSize & (b.blockSize - 1)) === 0 && b.k % b.blockSize === 0;
}

/**
 * MatMulNBits' accuracy level: 4 at every bit width, x quantized to int8 per block (of the weight's
 * block size) as llama.cpp's CPU products do for its quantized types. At level 0 ONNX Runtime 1.30
 * keeps x float32: for 8 bits it then has no kernel on this CPU and dequantizes the whole weight every
 * run (457 ms for a 49152 x 576 head, against 7 ms at level 4); for 4 bits it runs 2-3.5 times slower
 * than level 4 (measured on a 1536 x 576 product; Qwen2.5-Coder-0.5B's Q4_K down projections took 14.9
 * ms of a 103 ms decode step of 8 rows at level 0, 6.9 ms at level 4). Level 4 is as close to llama.cpp
 * as level 0 only with blocks that carry a min (Q4_1, Q4_K) centred on their own zero points: see
 * centreZeroPoints in gguf-weights.ts.
 */
export const NBITS_ACCURACY = 4;
