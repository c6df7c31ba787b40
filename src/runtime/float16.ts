/** IEEE 754 half-precision words (how ONNX Runtime hands float16 tensors to JavaScript) to float32 and back. */

const EXP = new Float32Array(32);
for (let e = 0; e < 32; e++) EXP[e] = 2 ** (e - 15);

export function halfToFloat(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return sign * m * 2 ** -24; // subnormal
  if (e === 31) return m === 0 ? sign * Infinity : NaN;
  return sign * EXP[e]! * (1 + m / 1024);
}

/** Converts `words` into a new Float32Array. */
export function halfsToFloats(words: Uint16Array): Float32Array {
  const out = new Float32Array(words.length);
  for (let i = 0; i < words.length; i++) out[i] = halfToFloat(words[i]!);
  return out;
}

const F32 = new Float32Array(1);
const U32 = new Uint32Array(F32.buffer);

/** float32 to the nearest half-precision word (ties to even; overflow to infinity). */
export function floatToHalf(x: number): number {
  F32[0] = x;
  const bits = U32[0]!;
  const sign = (bits >>> 16) & 0x8000;
  const exp = (bits >>> 23) & 0xff;
  const mant = bits & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0); // inf, nan
  const e = exp - 127 + 15;
  if (e >= 31) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign; // underflows to zero
    // Subnormal: shift the mantissa with its implicit bit, rounding to nearest even.
    const m = mant | 0x800000;
    const shift = 14 - e;
    const half = m >>> shift;
    const rest = m & ((1 << shift) - 1);
    const mid = 1 << (shift - 1);
    return sign | (half + (rest > mid || (rest === mid && (half & 1)) ? 1 : 0));
  }
  const half = (e << 10) | (mant >>> 13);
  const rest = mant & 0x1fff;
  // A carry out of the mantissa rounds up into the exponent, as IEEE rounding does.
  return sign | (half + (rest > 0x1000 || (rest === 0x1000 && (half & 1)) ? 1 : 0));
}

/** Converts `values` into a new array of half-precision words. */
export function floatsToHalfs(values: ArrayLike<number>): Uint16Array {
  const out = new Uint16Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = floatToHalf(values[i]!);
  return out;
}
