/** IEEE 754 half-precision words (how ONNX Runtime hands float16 tensors to JavaScript) to float32. */

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
