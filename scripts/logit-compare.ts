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
