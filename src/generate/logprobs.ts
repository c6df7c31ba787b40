/**
 * Log-probabilities of a sampled token and of the most likely alternatives, for OpenAI's `logprobs` /
 * `top_logprobs`.
 *
 * They are of the model's own distribution: the log-softmax of the raw logits, before penalties,
 * temperature, top-k or top-p (vLLM's default, `raw_logprobs`). So a token's logprob does not depend on
 * the sampling settings of the request, and the greedy token is the top one. Computed only for rows
 * whose request asked (a pass and a half over the vocabulary: about a millisecond a row at 152k).
 */

export interface TopLogprob {
  id: number;
  logprob: number;
}

/** The chosen token's logprob and the `top` most likely tokens' (most likely first; ties: lower id first). */
export interface TokenLogprobs {
  id: number;
  logprob: number;
  top: TopLogprob[];
}

/** Largest number of alternatives a request may ask for (OpenAI's top_logprobs limit). */
export const MAX_TOP_LOGPROBS = 20;

/** log(sum(exp(logits))), in float64, shifted by the maximum so that nothing overflows. */
export function logSumExp(logits: Float32Array): number {
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i]! > max) max = logits[i]!;
  if (max === -Infinity || Number.isNaN(max)) return max;
  let sum = 0;
  for (let i = 0; i < logits.length; i++) sum += Math.exp(logits[i]! - max);
  return max + Math.log(sum);
}

/**
 * The `k` largest logits' ids, largest first (ties: lower id first): one pass keeping a small sorted
 * list, which a k of at most 20 keeps cheaper than sorting the vocabulary.
 */
export function topIds(logits: Float32Array, k: number): number[] {
  const ids: number[] = [];
  if (k <= 0) return ids;
  let floor = -Infinity; // the smallest kept logit once the list is full
  for (let i = 0; i < logits.length; i++) {
    const x = logits[i]!;
    if (ids.length === k && !(x > floor)) continue;
    let at = ids.length;
    // Strictly larger moves ahead: an equal logit stays behind the lower id already kept.
    while (at > 0 && x > logits[ids[at - 1]!]!) at--;
    ids.splice(at, 0, i);
    if (ids.length > k) ids.pop();
    if (ids.length === k) floor = logits[ids[k - 1]!]!;
  }
  return ids;
}

/** The logprobs of `chosen` and of the `top` most likely tokens under the raw logits of one row. */
export function tokenLogprobs(logits: Float32Array, chosen: number, top: number): TokenLogprobs {
  const lse = logSumExp(logits);
  return {
    id: chosen,
    logprob: logits[chosen]! - lse,
    top: topIds(logits, top).map((id) => ({ id, logprob: logits[id]! - lse })),
  };
}
