/**
 * GGUF's quantized blocks as the CUDA backend keeps them on the device: still quantized (the same bits a
 * weight, the same scales), re-laid out so that the kernels read aligned vectors. A GGUF block is packed
 * (Q4_0 is 18 bytes: a half then 16 bytes of nibbles), so a row of blocks has no 16-byte alignment and
 * K-quants interleave their sub-blocks. Here every matrix is cut into units of 32 consecutive weights of
 * a row (a Q*_0 block, or one 32-weight sub-block of a K-quant's 256) and stored as planes:
 *
 *   Q plane  the unit's quantized bits, `q` bytes a unit (4-bit types: byte i holds element i in its low
 *            nibble and element i + 16 in its high nibble, Q4_0's own order, for every 4-bit type)
 *   S plane  the unit's own scales, `s` bytes a unit
 *   H plane  a K-quant super-block's header (d, dmin), `h` bytes per 8 units
 *
 * each plane starting 256-byte aligned (ragguard_cuda.cu QPlanes computes the same offsets). A unit's
 * element values are computed exactly as src/runtime/gguf.ts dequantizes the block (dequantUnits below is
 * the CPU reference of the device's unit32, and the tests hold it to gguf.ts bit for bit):
 *
 *   F16, BF16  q 64: the 32 values (F32 matrices are stored as F16: the backend's products take halves)
 *   Q8_0  q 32 int8, s 2 (d)                          w = d q
 *   Q4_0  q 16, s 2 (d)                               w = d (q - 8)
 *   Q4_1  q 16, s 4 (d, m)                            w = d q + m
 *   Q5_0  q 20 (16 nibble bytes + qh u32), s 2 (d)    w = d ((q | h << 4) - 16)
 *   Q4_K  q 16, s 2 (6-bit scale, 6-bit min), h 4 (d, dmin)     w = (d sc) q - (dmin mn)
 *   Q6_K  q 24 (16 nibble bytes, 8 bytes of 2-bit highs: element j's at byte j & 7, bits 2 (j >> 3)),
 *         s 2 (int8 scales of elements 0-15 and 16-31), h 2 (d)  w = (d sc) (q - 32)
 *
 * The bytes a unit costs are GGUF's own (Q4_K 4.625 bits a weight against its 4.5: the 12 packed scale
 * bytes of a super-block become 16), so decode reads what llama.cpp reads.
 */
import { GGML, ggmlTypeName, halfToFloat } from '../../runtime/gguf.js';
import { floatToHalf } from '../../runtime/float16.js';

/** The device's unit types (ggml type ids; F32 matrices are packed as F16). */
export const DEVICE_QUANT_TYPES = [GGML.F16, GGML.BF16, GGML.Q8_0, GGML.Q4_0, GGML.Q4_1, GGML.Q5_0, GGML.Q4_K, GGML.Q6_K] as const;
/**
 * RAGGUARD_CUDA_WEIGHTS=fp8's unit (not a ggml type; ragguard_cuda.cu QT_FP8): 32 E4M3 bytes and a float16
 * scale (the block's largest |value| / 448), made on the device from a float16/bfloat16 checkpoint at load.
 */
export const FP8_E4M3 = 1000;
export type DeviceQuantType = (typeof DEVICE_QUANT_TYPES)[number] | typeof FP8_E4M3;

export const UNIT = 32;
/** Units in a K-quant super-block (256 weights). */
export const SUPER_UNITS = 8;

export interface UnitLayout {
  /** Bytes of a unit in the Q plane, in the S plane, and of a super-block (8 units) in the H plane. */
  q: number;
  s: number;
  h: number;
}

const LAYOUTS: Record<DeviceQuantType, UnitLayout> = {
  [GGML.F16]: { q: 64, s: 0, h: 0 },
  [GGML.BF16]: { q: 64, s: 0, h: 0 },
  [GGML.Q8_0]: { q: 32, s: 2, h: 0 },
  [GGML.Q4_0]: { q: 16, s: 2, h: 0 },
  [GGML.Q4_1]: { q: 16, s: 4, h: 0 },
  [GGML.Q5_0]: { q: 20, s: 2, h: 0 },
  [GGML.Q4_K]: { q: 16, s: 2, h: 4 },
  [GGML.Q6_K]: { q: 24, s: 2, h: 2 },
  [FP8_E4M3]: { q: 32, s: 2, h: 0 },
};

export class QuantLayoutError extends Error {}

/** The device type a GGUF matrix of `type` is kept as, or an error naming what is not supported. */
export function deviceType(type: number, name = 'tensor'): DeviceQuantType {
  if (type === GGML.F32) return GGML.F16;
  if ((DEVICE_QUANT_TYPES as readonly number[]).includes(type)) return type as DeviceQuantType;
  throw new QuantLayoutError(`${name}: ggml type ${ggmlTypeName(type)} is not supported by the CUDA backend (${DEVICE_QUANT_TYPES.map(ggmlTypeName).join(', ')} and F32 are)`);
}

export function unitLayout(type: DeviceQuantType): UnitLayout {
  return LAYOUTS[type];
}

const align256 = (n: number) => Math.ceil(n / 256) * 256;

/** Byte offsets of the planes of a [rows, cols] matrix and its packed size (ragguard_cuda.cu qplanes). */
export function planeOffsets(type: DeviceQuantType, rows: number, cols: number): { q: number; s: number; h: number; bytes: number } {
  const l = LAYOUTS[type];
  const units = (rows * cols) / UNIT;
  const q = 0;
  const s = align256(units * l.q);
  const h = s + align256(units * l.s);
  const bytes = h + align256((units / SUPER_UNITS) * l.h);
  return { q, s, h, bytes };
}

/** Checks that a [rows, cols] matrix of `type` can be cut into units (and K-quant super-blocks) by row. */
export function checkShape(type: DeviceQuantType, rows: number, cols: number, name = 'tensor'): void {
  const per = type === GGML.Q4_K || type === GGML.Q6_K ? 256 : UNIT;
  if (cols % per !== 0 || rows < 1) throw new QuantLayoutError(`${name}: rows of ${cols} are not a whole number of ${per}-weight blocks`);
}

/** Copies n bytes (a loop: a subarray per block would be most of a large file's packing time). */
function copy(dst: Uint8Array, to: number, src: Uint8Array, from: number, n: number): void {
  for (let i = 0; i < n; i++) dst[to + i] = src[from + i]!;
}

function nibbles(dst: Uint8Array, at: number, v: ArrayLike<number>): void {
  for (let i = 0; i < 16; i++) dst[at + i] = (v[i]! & 15) | ((v[i + 16]! & 15) << 4);
}

/**
 * Re-lays the GGUF bytes of a [rows, cols] matrix (`raw`: rows of blocks as stored; F32 and F16/BF16
 * rows of values) into the device planes.
 */
export function packMatrix(ggmlType: number, raw: Uint8Array, rows: number, cols: number, name = 'tensor'): { type: DeviceQuantType; bytes: Uint8Array } {
  const type = deviceType(ggmlType, name);
  checkShape(type, rows, cols, name);
  const off = planeOffsets(type, rows, cols);
  const out = new Uint8Array(off.bytes);
  const units = (rows * cols) / UNIT;
  const dv = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
  const v = new Uint8Array(32);
  switch (ggmlType) {
    case GGML.F32: {
      const o = new DataView(out.buffer);
      for (let i = 0; i < rows * cols; i++) o.setUint16(2 * i, floatToHalf(dv.getFloat32(4 * i, true)), true);
      break;
    }
    case GGML.F16: case GGML.BF16:
      out.set(raw.subarray(0, rows * cols * 2), 0);
      break;
    case GGML.Q8_0: case GGML.Q4_0: case GGML.Q4_1: {
      // A block is its scales (the S plane's bytes) then its quants (the Q plane's), as they are.
      const { q, s } = LAYOUTS[type];
      for (let u = 0; u < units; u++) {
        copy(out, u * q, raw, u * (s + q) + s, q);
        copy(out, off.s + s * u, raw, u * (s + q), s);
      }
      break;
    }
    case GGML.Q5_0:
      for (let u = 0; u < units; u++) {
        copy(out, u * 20, raw, u * 22 + 6, 16);
        copy(out, u * 20 + 16, raw, u * 22 + 2, 4);
        copy(out, off.s + 2 * u, raw, u * 22, 2);
      }
      break;
    case GGML.Q4_K:
      for (let sb = 0; sb < units / SUPER_UNITS; sb++) {
        const at = sb * 144;
        copy(out, off.h + 4 * sb, raw, at, 4);
        for (let j = 0; j < 8; j++) {
          const u = sb * 8 + j;
          // q4kScaleMin's 6-bit scale and min of sub-block j, inline (a tuple a unit is slow at this count).
          const b = at + 4;
          out[off.s + 2 * u] = j < 4 ? raw[b + j]! & 63 : (raw[b + j + 4]! & 0x0f) | ((raw[b + j - 4]! >> 6) << 4);
          out[off.s + 2 * u + 1] = j < 4 ? raw[b + j + 4]! & 63 : (raw[b + j + 4]! >> 4) | ((raw[b + j]! >> 6) << 4);
          // Sub-block j: the low (j even) or high nibbles of the 32 bytes of chunk j >> 1.
          const q = at + 16 + 32 * (j >> 1);
          const shift = j & 1 ? 4 : 0;
          for (let i = 0; i < 16; i++) out[16 * u + i] = ((raw[q + i]! >> shift) & 15) | (((raw[q + i + 16]! >> shift) & 15) << 4);
        }
      }
      break;
    case GGML.Q6_K:
      for (let sb = 0; sb < units / SUPER_UNITS; sb++) {
        const at = sb * 210;
        copy(out, off.h + 2 * sb, raw, at + 208, 2);
        // Unit 4 half + quarter holds elements 128 half + 32 quarter + l (gguf.ts's q1..q4 of that half).
        for (let half = 0; half < 2; half++) {
          for (let quarter = 0; quarter < 4; quarter++) {
            const u = sb * 8 + 4 * half + quarter;
            const ql = at + 64 * half + (quarter & 1 ? 32 : 0);
            const qh = at + 128 + 32 * half;
            for (let l = 0; l < 32; l++) {
              const lo = quarter < 2 ? raw[ql + l]! & 15 : raw[ql + l]! >> 4;
              v[l] = lo | (((raw[qh + l]! >> (2 * quarter)) & 3) << 4);
            }
            nibbles(out, 24 * u, v);
            for (let k = 0; k < 8; k++) {
              out[24 * u + 16 + k] = (v[k]! >> 4) | ((v[k + 8]! >> 4) << 2) | ((v[k + 16]! >> 4) << 4) | ((v[k + 24]! >> 4) << 6);
            }
            const sc = at + 192 + 8 * half + 2 * quarter;
            out[off.s + 2 * u] = raw[sc]!;
            out[off.s + 2 * u + 1] = raw[sc + 1]!;
          }
        }
      }
      break;
  }
  return { type, bytes: out };
}

const F32 = new Float32Array(1);
const U32 = new Uint32Array(F32.buffer);
const f = Math.fround;

/**
 * The CPU reference of the device's dequantization (ragguard_cuda.cu unit32): the packed planes back to
 * float32 weights, [rows, cols], with float32 arithmetic in the kernel's order.
 */
export function dequantUnits(type: DeviceQuantType, packed: Uint8Array, rows: number, cols: number): Float32Array {
  const off = planeOffsets(type, rows, cols);
  const units = (rows * cols) / UNIT;
  const out = new Float32Array(rows * cols);
  const dv = new DataView(packed.buffer, packed.byteOffset, packed.byteLength);
  const h16 = (at: number) => halfToFloat(dv.getUint16(at, true));
  const nib = (at: number, i: number) => (i < 16 ? packed[at + i]! & 15 : packed[at + i - 16]! >> 4);
  for (let u = 0; u < units; u++) {
    const y = u * UNIT;
    switch (type) {
      case GGML.F16:
        for (let i = 0; i < 32; i++) out[y + i] = h16(2 * (y + i));
        break;
      case GGML.BF16:
        for (let i = 0; i < 32; i++) {
          U32[0] = dv.getUint16(2 * (y + i), true) << 16;
          out[y + i] = F32[0]!;
        }
        break;
      case GGML.Q8_0: {
        const d = h16(off.s + 2 * u);
        for (let i = 0; i < 32; i++) out[y + i] = f(d * dv.getInt8(32 * u + i));
        break;
      }
      case GGML.Q4_0: {
        const d = h16(off.s + 2 * u);
        for (let i = 0; i < 32; i++) out[y + i] = f(d * (nib(16 * u, i) - 8));
        break;
      }
      case GGML.Q4_1: {
        const d = h16(off.s + 4 * u), m = h16(off.s + 4 * u + 2);
        for (let i = 0; i < 32; i++) out[y + i] = f(d * nib(16 * u, i) + m);
        break;
      }
      case GGML.Q5_0: {
        const d = h16(off.s + 2 * u);
        const qh = dv.getUint32(20 * u + 16, true);
        for (let i = 0; i < 32; i++) out[y + i] = f(d * ((nib(20 * u, i) | (((qh >>> i) & 1) << 4)) - 16));
        break;
      }
      case GGML.Q4_K: {
        const sb = u >> 3;
        const d = h16(off.h + 4 * sb), dmin = h16(off.h + 4 * sb + 2);
        const scale = f(d * packed[off.s + 2 * u]!), min = f(dmin * packed[off.s + 2 * u + 1]!);
        for (let i = 0; i < 32; i++) out[y + i] = f(scale * nib(16 * u, i) - min);
        break;
      }
      case GGML.Q6_K: {
        const d = h16(off.h + 2 * (u >> 3));
        for (let i = 0; i < 32; i++) {
          const hi = (packed[24 * u + 16 + (i & 7)]! >> (2 * (i >> 3))) & 3;
          const q = (nib(24 * u, i) | (hi << 4)) - 32;
          out[y + i] = f(f(d * dv.getInt8(off.s + 2 * u + (i >> 4))) * q);
        }
        break;
      }
    }
  }
  return out;
}

/**
 * Row r of the transformers layout is stored row perm[r] (within each head of `headDim` rows): llama.cpp's
 * converter permutes a llama model's q and k rows to adjacent rotary pairs; the backend's rotary pairs
 * (i, i + d/2) as transformers does, so the rows go back (whole rows: blocks run along a row).
 */
export function llamaUnpermutation(rows: number, headDim: number): Int32Array {
  const perm = new Int32Array(rows);
  const half = headDim / 2;
  for (let h = 0; h < rows / headDim; h++) {
    for (let j = 0; j < 2; j++) for (let i = 0; i < half; i++) perm[h * headDim + j * half + i] = h * headDim + 2 * i + j;
  }
  return perm;
}

/** `raw` (rows of `rowBytes` bytes) with its rows taken in `perm`'s order. */
export function permuteRowBytes(raw: Uint8Array, rowBytes: number, perm: Int32Array): Uint8Array {
  const out = new Uint8Array(raw.length);
  for (let r = 0; r < perm.length; r++) out.set(raw.subarray(perm[r]! * rowBytes, (perm[r]! + 1) * rowBytes), r * rowBytes);
  return out;
}
