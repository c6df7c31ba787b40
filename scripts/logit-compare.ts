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
