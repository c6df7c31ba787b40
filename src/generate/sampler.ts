/** Next-token choice: greedy at temperature 0, else softmax sampling from a seeded generator. */
import { maskLogits, type TokenMask } from './structured/token-mask.js';

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

/**
 * The first index of the largest logit (0 where none is larger than logits[0], NaN included). Four
 * running maxima over interleaved elements, merged at the end: a single one is a chain of dependent
 * compares, and a 152k vocabulary took 0.3-0.7 ms a row on the event loop that way (about 1.7 times this).
 */
export function argmax(logits: Float32Array): number {
  const n = logits.length;
  if (n === 0) return 0;
  let b0 = 0, b1 = -1, b2 = -1, b3 = -1;
  let t0 = logits[0]!, t1 = -Infinity, t2 = -Infinity, t3 = -Infinity;
  let i = 1;
  // Lane k sees indices i + k of each group of 4, so each lane's strict > keeps its first maximum.
  for (; i + 3 < n; i += 4) {
    const x0 = logits[i]!, x1 = logits[i + 1]!, x2 = logits[i + 2]!, x3 = logits[i + 3]!;
    if (x0 > t0) { t0 = x0; b0 = i; }
    if (x1 > t1) { t1 = x1; b1 = i + 1; }
    if (x2 > t2) { t2 = x2; b2 = i + 2; }
    if (x3 > t3) { t3 = x3; b3 = i + 3; }
  }
  // Merged by value, ties to the lower index: the first maximum overall.
  let best = b0, top = t0;
  if (b1 >= 0 && (t1 > top || (t1 === top && b1 < best))) { best = b1; top = t1; }
  if (b2 >= 0 && (t2 > top || (t2 === top && b2 < best))) { best = b2; top = t2; }
  if (b3 >= 0 && (t3 > top || (t3 === top && b3 < best))) { best = b3; top = t3; }
  for (; i < n; i++) {
    const x = logits[i]!;
    if (x > top) { top = x; best = i; }
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

/**
 * Per-request sampling settings, as OpenAI's and vLLM's requests name them. Plain numbers, so that a
 * device-side sampler can take the same fields. Absent = off.
 */
export interface SamplerSettings {
  /** 0 = greedy (after penalties). */
  temperature: number;
  /** Nucleus: keep the smallest set of most likely tokens whose probability sums to at least topP (0 < topP <= 1). */
  topP?: number;
  /** Keep the topK most likely tokens (0 or absent: all). topK = 1 is greedy. */
  topK?: number;
  /** HF/vLLM's: logits of tokens seen in the prompt or the output are divided (positive) or multiplied (negative) by it; 1 = off. */
  repetitionPenalty?: number;
  /** OpenAI's: subtracted from the logit of every token already generated. */
  presencePenalty?: number;
  /** OpenAI's: subtracted once per occurrence in the output so far. */
  frequencyPenalty?: number;
}

/** Whether any penalty would change the logits. */
export function penalized(s: SamplerSettings): boolean {
  return (s.repetitionPenalty !== undefined && s.repetitionPenalty !== 1) || !!s.presencePenalty || !!s.frequencyPenalty;
}

/** Whether sampleNext takes the argmax (of the penalized logits, where there are penalties). */
function greedy(s: SamplerSettings): boolean {
  return s.temperature <= 0 || s.topK === 1;
}

/**
 * Whether sampleNext under `s` is the plain argmax of the logits (greedy, no penalty): a row's greedy
 * id taken by the model's graph (DecoderModel's greedyIds) is then its next token as it stands.
 */
export function plainGreedy(s: SamplerSettings): boolean {
  return greedy(s) && !penalized(s);
}

/**
 * The penalties applied to a copy of the logits (the model's buffer is left as it was): repetition
 * over prompt and output tokens (as vLLM applies it), presence and frequency over the output only
 * (as OpenAI defines them).
 */
export function applyPenalties(logits: Float32Array, s: SamplerSettings, promptIds: readonly number[], outputIds: readonly number[]): Float32Array {
  if (!penalized(s)) return logits;
  const out = new Float32Array(logits);
  const rep = s.repetitionPenalty ?? 1;
  if (rep !== 1) {
    const seen = new Set<number>(promptIds);
    for (const t of outputIds) seen.add(t);
    for (const t of seen) {
      if (t < 0 || t >= out.length) continue;
      const x = out[t]!;
      out[t] = x > 0 ? x / rep : x * rep;
    }
  }
  if (s.presencePenalty || s.frequencyPenalty) {
    const counts = new Map<number, number>();
    for (const t of outputIds) counts.set(t, (counts.get(t) ?? 0) + 1);
    for (const [t, n] of counts) {
      if (t < 0 || t >= out.length) continue;
      out[t] = out[t]! - (s.presencePenalty ?? 0) - (s.frequencyPenalty ?? 0) * n;
    }
  }
  return out;
}

/**
 * The next token under the request's settings: penalties, then greedy at temperature 0, else
 * temperature, top-k and top-p filtering and one draw from `random` (exactly one per token, so a
 * seeded stream replays the same way, preempted or not).
 */
export function sampleNext(logits: Float32Array, s: SamplerSettings, random: () => number,
  promptIds: readonly number[], outputIds: readonly number[], allowed?: TokenMask): number {
  // A constrained row's mask comes first, as vLLM's logits processors: penalties and the cuts act on what may come.
  const l = applyPenalties(allowed ? maskLogits(logits, allowed) : logits, s, promptIds, outputIds);
  if (greedy(s)) return argmax(l);
  const topK = s.topK && s.topK > 0 ? Math.min(s.topK, l.length) : l.length;
  const topP = s.topP ?? 1;
  if (topK === l.length && topP >= 1) return sampleToken(l, s.temperature, random);
  // Candidates by descending logit (ties: lower id first, so the order is deterministic), taken from a
  // heap as far as needed: sorting a 152k vocabulary took tens of ms a row, on the event loop's thread.
  const heap = new LogitHeap(l);
  const order = [heap.pop()];
  const max = l[order[0]!]!;
  const weight = (i: number) => Math.exp((l[i]! - max) / s.temperature);
  const p = [weight(order[0]!)];
  let keep: number;
  if (topK < l.length) {
    while (order.length < topK) {
      order.push(heap.pop());
      p.push(weight(order.at(-1)!));
    }
    keep = cutAtTopP(p, p.reduce((a, b) => a + b, 0), topP);
  } else {
    // top_p alone: the whole vocabulary's mass, then candidates until their share reaches top_p.
    let total = 0;
    for (let i = 0; i < l.length; i++) total += weight(i);
    let acc = p[0]! / total;
    while (acc < topP && order.length < l.length) {
      order.push(heap.pop());
      p.push(weight(order.at(-1)!));
      acc += p.at(-1)! / total;
    }
    keep = p.length;
  }
  const sum = p.slice(0, keep).reduce((a, b) => a + b, 0);
  let r = random() * sum;
  for (let i = 0; i < keep; i++) {
    r -= p[i]!;
    if (r <= 0) return order[i]!;
  }
  return order[keep - 1]!;
}

/** How many of the candidates' weights `p` (by descending logit; `sum` their total) the nucleus top_p keeps. */
function cutAtTopP(p: readonly number[], sum: number, topP: number): number {
  if (topP >= 1) return p.length;
  let acc = 0;
  for (let i = 0; i < p.length; i++) {
    acc += p[i]! / sum;
    if (acc >= topP) return i + 1;
  }
  return p.length;
}

/**
 * Token ids in a binary max-heap by logit (ties: the lower id above): pop() gives them in the order a
 * sort by descending logit would, in O(log V) each after an O(V) build.
 */
class LogitHeap {
  private readonly ids: Int32Array;
  private n: number;

  constructor(private readonly l: Float32Array) {
    this.n = l.length;
    this.ids = new Int32Array(this.n);
    for (let i = 0; i < this.n; i++) this.ids[i] = i;
    for (let i = (this.n >> 1) - 1; i >= 0; i--) this.siftDown(i);
  }

  pop(): number {
    const top = this.ids[0]!;
    this.ids[0] = this.ids[--this.n]!;
    this.siftDown(0);
    return top;
  }

  private above(a: number, b: number): boolean {
    const x = this.l[a]!, y = this.l[b]!;
    return x > y || (x === y && a < b);
  }

  private siftDown(i: number): void {
    const { ids, n } = this;
    for (;;) {
      const left = 2 * i + 1;
      if (left >= n) return;
      const right = left + 1;
      const child = right < n && this.above(ids[right]!, ids[left]!) ? right : left;
      if (!this.above(ids[child]!, ids[i]!)) return;
      [ids[i], ids[child]] = [ids[child]!, ids[i]!];
      i = child;
    }
  }
}
