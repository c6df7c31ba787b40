/**
 * Scoring generated answers against the question set's gold facts, for bench:rag.
 *
 * Correct: some accepted variant (or the gold answer itself) occurs in the answer as a whole run of
 * tokens, after both are normalised the same way: lowercased, split on anything but letters, digits
 * and the characters commands and paths are made of (/ . _ + $ > -), with dots trimmed from the ends of
 * tokens and slashes from their tails (so "/etc/exports." at the end of a sentence is "/etc/exports",
 * and "/usr/local/" is "/usr/local"); a path in the answer also matches its last components.
 *
 * Unreadable: empty; or a token repeated four times in a row, or one 3-token run three times or more
 * (a decoder in a loop); or fewer than 60% of its words (words()) known to the corpus' vocabulary
 * (gibberish).
 *
 * Echoed: the answer repeats a run of 5 or more tokens of the prompt's instruction (the model reading its
 * orders back instead of answering).
 */

export function normalizeTokens(text: string): string[] {
  return text.toLowerCase().split(/[^a-z0-9/._+$>-]+/).map((t) => t.replace(/^\.+|\.+$/g, '').replace(/(.)\/+$/, '$1')).filter((t) => t !== '');
}

/** Equal, or the answer's token is a path ending in the variant's ("/etc/munin/munin.conf" for "munin.conf"). */
const sameToken = (answer: string, variant: string) => answer === variant || answer.endsWith(`/${variant}`);

/** True when `variant`'s tokens occur as a contiguous run in `answer`'s. */
export function containsFact(answer: string, variant: string): boolean {
  const a = normalizeTokens(answer);
  const v = normalizeTokens(variant);
  if (v.length === 0) return false;
  outer: for (let i = 0; i + v.length <= a.length; i++) {
    for (let j = 0; j < v.length; j++) if (!sameToken(a[i + j]!, v[j]!)) continue outer;
    return true;
  }
  return false;
}

export function isCorrect(answer: string, gold: string, accept: readonly string[]): boolean {
  return [gold, ...accept].some((v) => containsFact(answer, v));
}

/**
 * The words of a text, as the vocabulary check sees them: whitespace-separated tokens of 3+ letters and
 * nothing else but surrounding punctuation (paths, options and commands are not judged).
 */
export function words(text: string): string[] {
  return text.toLowerCase().split(/\s+/).map((t) => t.replace(/^[("'`]+|[.,;:!?)"'`]+$/g, '')).filter((t) => /^[a-z]{3,}$/.test(t));
}

export function isUnreadable(answer: string, vocabulary: ReadonlySet<string>): boolean {
  const tokens = answer.trim().split(/\s+/).filter(Boolean);
  if (tokens.length === 0) return true;
  for (let i = 0; i + 3 < tokens.length; i++) {
    if (tokens[i] === tokens[i + 1] && tokens[i] === tokens[i + 2] && tokens[i] === tokens[i + 3]) return true;
  }
  const grams = new Map<string, number>();
  for (let i = 0; i + 2 < tokens.length; i++) {
    const g = tokens.slice(i, i + 3).join(' ');
    const n = (grams.get(g) ?? 0) + 1;
    if (n >= 3) return true;
    grams.set(g, n);
  }
  const w = words(answer);
  if (w.length === 0) return false; // a bare command or number
  return w.filter((x) => vocabulary.has(x)).length / w.length < 0.6;
}

/** BENCH_RAG_MAX_NEW_TOKENS and BENCH_RAG_STOP: fields added to every /query request. */
export function decodingPolicy(env: NodeJS.ProcessEnv): { max_new_tokens?: number; stop?: string | string[] } {
  const out: { max_new_tokens?: number; stop?: string | string[] } = {};
  const n = env['BENCH_RAG_MAX_NEW_TOKENS'];
  if (n) {
    if (!/^[1-9]\d*$/.test(n)) throw new Error(`BENCH_RAG_MAX_NEW_TOKENS must be a positive integer, not '${n}'`);
    out.max_new_tokens = Number(n);
  }
  const stop = env['BENCH_RAG_STOP'];
  if (stop) out.stop = stop.startsWith('[') ? (JSON.parse(stop) as string[]) : stop;
  return out;
}

/** The answer repeats a run of `run` or more of the instruction's tokens (normalised): the prompt echoed back. */
export function echoes(answer: string, instruction: string, run = 5): boolean {
  const a = normalizeTokens(answer).join(' ');
  const t = normalizeTokens(instruction);
  for (let i = 0; i + run <= t.length; i++) if (` ${a} `.includes(` ${t.slice(i, i + run).join(' ')} `)) return true;
  return false;
}
