/**
 * QMatMul8's weight layout (src/backends/ort/qmatmul8.h): 8-bit blocks as MatMulNBits takes them
 * ([n][k] bytes at zero point 128, a scale per block, [n][k / blockSize]) rearranged 16 columns side by
 * side, so that the kernel's one 64-byte load holds 4 bytes of each of 16 columns:
 *
 *   q       [G][k / 4][16][4]          G = ceil(n / 16); columns past n: zero weights (128)
 *   scales  [G][k / blockSize][16]     columns past n: 0
 *
 * The same bytes and scales, moved: the values the graph computes with are unchanged.
 */
export interface Qmatmul8Blocks {
  n: number;
  k: number;
  blockSize: number;
  /** [n][k] (MatMulNBits' [n][k / blockSize][blockSize] at 8 bits). */
  data: Uint8Array;
  /** [n][k / blockSize]. */
  scales: Float32Array;
}

export interface Qmatmul8Layout {
  groups: number;
  q: Uint8Array;
  scales: Float32Array;
}

export function qmatmul8Layout(b: Qmatmul8Blocks): Qmatmul8Layout {
  const { n, k, blockSize } = b;
  if (k % 4 !== 0 || k % blockSize !== 0) throw new Error(`QMatMul8 layout: k ${k} is not a multiple of 4 and of the block size ${blockSize}`);
  if (b.data.length !== n * k || b.scales.length !== (n * k) / blockSize) throw new Error(`QMatMul8 layout: ${b.data.length} bytes and ${b.scales.length} scales for ${n} x ${k} in blocks of ${blockSize}`);
  const groups = Math.ceil(n / 16);
  const quads = k / 4;
  const blocks = k / blockSize;
  const q = new Uint8Array(groups * quads * 64).fill(128);
  const scales = new Float32Array(groups * blocks * 16);
  for (let col = 0; col < n; col++) {
    const g = col >> 4;
    const c = col & 15;
    const src = col * k;
    for (let j = 0; j < quads; j++) {
      const dst = (g * quads + j) * 64 + c * 4;
      q[dst] = b.data[src + 4 * j]!;
      q[dst + 1] = b.data[src + 4 * j + 1]!;
      q[dst + 2] = b.data[src + 4 * j + 2]!;
      q[dst + 3] = b.data[src + 4 * j + 3]!;
    }
    for (let blk = 0; blk < blocks; blk++) scales[(g * blocks + blk) * 16 + c] = b.scales[col * blocks + blk]!;
  }
  return { groups, q, scales };
}
