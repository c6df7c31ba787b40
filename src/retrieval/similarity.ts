/**
 * Cosine similarity of two vectors: how the encoders' outputs are compared with a reference (the CUDA
 * encoders' checks against ONNX Runtime and sentence-transformers); the stores rank by inner product
 * of unit vectors instead.
 */
export function cosine(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) throw new RangeError(`vectors of ${a.length} and ${b.length} dimensions`);
  let d = 0, na = 0, nb = 0;
  for (let i = 0; i < a.length; i++) {
    d += a[i]! * b[i]!;
    na += a[i]! ** 2;
    nb += b[i]! ** 2;
  }
  return d / Math.sqrt(na * nb);
}
