/** Next-token choice: greedy at temperature 0, else softmax sampling from a seeded generator. */

/** mulberry32: small, fast, seedable; Math.random cannot be replayed. */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function argmax(logits: Float32Array): number {
  let best = 0;
  let top = logits[0] ?? -Infinity;
  for (let i = 1; i < logits.length; i++) {
    const x = logits[i]!;
    if (x > top) {
      top = x;
      best = i;
    }
  }
  return best;
}

export function sampleToken(logits: Float32Array, temperature: number, random: () => number): number {
  if (temperature <= 0) return argmax(logits);
  let max = -Infinity;
  for (const x of logits) if (x > max) max = x;
  const p = new Float64Array(logits.length);
  let sum = 0;
  for (let i = 0; i < logits.length; i++) sum += p[i] = Math.exp((logits[i]! - max) / temperature);
  let r = random() * sum;
  for (let i = 0; i < p.length; i++) {
    r -= p[i]!;
    if (r <= 0) return i;
  }
  return p.length - 1;
}
