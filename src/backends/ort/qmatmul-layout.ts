/**
 * QMatMul8's and QMatMul4's weight layouts (src/backends/ort/qmatmul.h): blocks as MatMulNBits takes
 * them (8 bits: [n][k] bytes at zero point 128; 4 bits: [n][k / 2] bytes, value 2i in the low nibble of
 * byte i, zero points packed two a byte; a scale per block, [n][k / blockSize]) rearranged 16 columns
 * side by side, so that the kernels' one 64-byte load holds 4 (8 bits) or 8 (4 bits) values of each of
 * 16 columns:
 *
 *   8-bit q  [G][k / 4][16][4]         G = ceil(n / 16); columns past n: zero weights (128)
 *   4-bit q  [G][k / 8][16][4]         value 8p + e in the low nibble of byte [p][c][e], 8p + 4 + e in the high
 *   scales   [G][k / blockSize][16]    columns past n: 0
 *   offsets  [G][k / blockSize][16]    (4 bits) -scale x zero point + min (the block's min where it has
 *                                      one): w = scale q + offset, float
 *
 * The same values and scales, moved, and at 4 bits each block's zero point and min as one offset.
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

export interface Qmatmul4Blocks {
  n: number;
  k: number;
  blockSize: number;
  /** [n][k / 2]: value 2i of a row in the low nibble of its byte i (MatMulNBits' 4-bit packing). */
  data: Uint8Array;
  /** [n][k / blockSize]. */
  scales: Float32Array;
  /** [n][ceil(blocks / 2)]: block 2j's in the low nibble of byte j; absent: 8. */
  zeroPoints?: Uint8Array;
  /** [n][blocks]: each block's min, added to its weights (Q4_1, Q4_K as gguf-weights.ts reads them); absent: 0. */
  mins?: Float32Array;
}

export interface Qmatmul4Layout extends Qmatmul8Layout {
  offsets: Float32Array;
}

/** Column `col`'s scales into [G][blocks][16]. */
function scatterScales(scales: Float32Array, col: number, blocks: number, out: Float32Array): void {
  const g = col >> 4;
  const c = col & 15;
  for (let b = 0; b < blocks; b++) out[(g * blocks + b) * 16 + c] = scales[col * blocks + b]!;
}

export function qmatmul4Layout(b: Qmatmul4Blocks): Qmatmul4Layout {
  const { n, k, blockSize } = b;
  if (k % 8 !== 0 || k % blockSize !== 0) throw new Error(`QMatMul4 layout: k ${k} is not a multiple of 8 and of the block size ${blockSize}`);
  const blocks = k / blockSize;
  const zpRow = Math.ceil(blocks / 2);
  if (b.data.length !== (n * k) / 2 || b.scales.length !== n * blocks || (b.zeroPoints && b.zeroPoints.length !== n * zpRow) || (b.mins && b.mins.length !== n * blocks)) {
    throw new Error(`QMatMul4 layout: ${b.data.length} bytes, ${b.scales.length} scales and ${b.zeroPoints?.length ?? 'no'} zero points and ${b.mins?.length ?? 'no'} mins for ${n} x ${k} in blocks of ${blockSize}`);
  }
  const groups = Math.ceil(n / 16);
  const pairs = k / 8;
  const q = new Uint8Array(groups * pairs * 64);
  const scales = new Float32Array(groups * blocks * 16);
  const offsets = new Float32Array(groups * blocks * 16);
  const value = (row: number, i: number) => (b.data[(row * k + i) >> 1]! >> ((i & 1) * 4)) & 15;
  for (let col = 0; col < n; col++) {
    const g = col >> 4;
    const c = col & 15;
    for (let p = 0; p < pairs; p++) {
      const dst = (g * pairs + p) * 64 + c * 4;
      for (let e = 0; e < 4; e++) q[dst + e] = value(col, 8 * p + e) | (value(col, 8 * p + 4 + e) << 4);
    }
    scatterScales(b.scales, col, blocks, scales);
    for (let blk = 0; blk < blocks; blk++) {
      const zero = b.zeroPoints ? (b.zeroPoints[col * zpRow + (blk >> 1)]! >> ((blk & 1) * 4)) & 15 : 8;
      offsets[(g * blocks + blk) * 16 + c] = (b.mins?.[col * blocks + blk] ?? 0) - zero * b.scales[col * blocks + blk]!;
    }
  }
  return { groups, q, scales, offsets };
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
    scatterScales(b.scales, col, blocks, scales);
  }
  return { groups, q, scales };
}
