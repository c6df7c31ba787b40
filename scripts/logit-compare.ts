/** Logits of one position against a reference's: the largest |difference| and whether the argmaxes agree. */
export function compareLogits(ours: ArrayLike<number>, theirs: ArrayLike<number>, vocab: number): { maxDiff: number; argmaxEqual: boolean } {
  let diff = 0, am = 0, bm = 0;
  for (let v = 0; v < vocab; v++) {
    diff = Math.max(diff, Math.abs(ours[v]! - theirs[v]!));
    if (ours[v]! > ours[am]!) am = v;
    if (theirs[v]! > theirs[bm]!) bm = v;
  }
  return { maxDiff: diff, argmaxEqual: am === bm };
}

/** A reference case: its prompt and the reference's largest |logit| (the scale differences are measured in). */
export interface LogitCase {
  prompt_ids: number[];
  logit_scale: number;
}

/** The runner's side of a prefill comparison: it keeps each step's logits while asked (check-cuda.ts). */
export interface LogitSource {
  keepLogits: boolean;
  lastLogits: Float32Array | null;
}

/**
 * Each case's prompt prefilled (`prefill` runs it for one token) with the runner keeping its logits: the
 * last position's logits, one copy per case.
 */
export async function prefillLogits(runner: LogitSource, cases: readonly LogitCase[], prefill: (ids: number[]) => Promise<unknown>): Promise<Float32Array[]> {
  runner.keepLogits = true;
  const out: Float32Array[] = [];
  try {
    for (const c of cases) {
      await prefill(c.prompt_ids);
      out.push(runner.lastLogits!.slice());
    }
  } finally {
    runner.keepLogits = false;
  }
  return out;
}

/**
 * Each case's logits against the reference's last-position logits ([cases, vocab] in `reference`): the
 * largest |difference| relative to the case's logit scale, and how many argmaxes agree.
 */
export function logitsAgainst(logits: readonly Float32Array[], cases: readonly LogitCase[], reference: Float32Array, vocab: number): { worst: number; argmaxEqual: number } {
  let worst = 0, argmaxEqual = 0;
  cases.forEach((c, i) => {
    const { maxDiff, argmaxEqual: same } = compareLogits(logits[i]!, reference.subarray(i * vocab, (i + 1) * vocab), vocab);
    worst = Math.max(worst, maxDiff / c.logit_scale);
    if (same) argmaxEqual++;
  });
  return { worst, argmaxEqual };
}

/** One position's agreement with a reference: KL(reference || ours) in nats and whether the top-1 tokens agree. */
export function positionAgreement(ours: ArrayLike<number>, ref: ArrayLike<number>, vocab: number): { kl: number; top1: boolean } {
  let mo = -Infinity, mr = -Infinity, ao = 0, ar = 0;
  for (let v = 0; v < vocab; v++) {
    if (ours[v]! > mo) { mo = ours[v]!; ao = v; }
    if (ref[v]! > mr) { mr = ref[v]!; ar = v; }
  }
  // log-softmax of both in float64: KL = sum p_ref (log p_ref - log p_ours).
  let zo = 0, zr = 0;
  for (let v = 0; v < vocab; v++) { zo += Math.exp(ours[v]! - mo); zr += Math.exp(ref[v]! - mr); }
  const lzo = Math.log(zo), lzr = Math.log(zr);
  let kl = 0;
  for (let v = 0; v < vocab; v++) {
    const lr = ref[v]! - mr - lzr;
    const lo = ours[v]! - mo - lzo;
    kl += Math.exp(lr) * (lr - lo);
  }
  return { kl: Math.max(0, kl), top1: ao === ar };
}

/** A side's agreement with the reference over every compared position (rows of `vocab` logits, in the same order). */
export interface Agreement {
  rows: number;
  top1: number;
  mean_kl: number;
  max_kl: number;
  /** The position of the largest KL: its sequence and its index in that sequence. */
  worst: { sequence: number; position: number };
  /** Top-1 agreement at each sequence's first compared position (the first generated token). */
  first_top1: number;
}

/** `rowOf(i)` gives our row i; `sequences` the first compared position and length of each sequence. */
export function agreementOf(rowOf: (i: number) => ArrayLike<number>, reference: Float32Array, vocab: number,
  sequences: readonly { first: number; ids: readonly number[] }[]): Agreement {
  let i = 0, top1 = 0, sum = 0, max = -1, firstTop1 = 0;
  let worst = { sequence: 0, position: 0 };
  sequences.forEach((s, k) => {
    for (let p = s.first; p < s.ids.length; p++, i++) {
      const a = positionAgreement(rowOf(i), reference.subarray(i * vocab, (i + 1) * vocab), vocab);
      if (a.top1) top1++;
      if (a.top1 && p === s.first) firstTop1++;
      sum += a.kl;
      if (a.kl > max) { max = a.kl; worst = { sequence: k, position: p }; }
    }
  });
  const round = (x: number) => Number(x.toPrecision(4));
  return { rows: i, top1: round(top1 / i), mean_kl: round(sum / i), max_kl: round(max), worst, first_top1: round(firstTop1 / sequences.length) };
}
