/**
 * A sequence's output as text, token by token: incremental detokenization that never emits half a
 * UTF-8 character, stop sequences, and the text's ends trimmed as the non-streamed answer always was.
 *
 * Detokenization follows vLLM's: each step decodes a short window of the latest ids twice, with and
 * without the new ones, and emits the difference, unless it ends in U+FFFD (a byte-level token that
 * ends inside a character: the next token completes it). Decoding the window rather than every id
 * keeps a step's cost constant, and a window that starts a few tokens back keeps the spacing a
 * tokenizer only gets right with context (a leading space a decoder strips at the start of a text).
 *
 * What is emitted is held back where it might still change: a tail that could be the start of a stop
 * sequence (emitted once the text moves past it, dropped when the stop completes), and trailing
 * whitespace (emitted once more text follows, dropped at the end). So the concatenation of the deltas
 * is exactly the final text: stream and non-streamed reply agree.
 */

/** What the detokenizer needs of a tokenizer. */
export interface Detokenizer {
  decode(ids: readonly number[]): string;
}

export class OutputText {
  private readonly ids: number[] = [];
  /** Window start: decoded again each step for context. */
  private prefixOffset = 0;
  /** Ids up to here are already in `decoded`. */
  private readOffset = 0;
  /** All text decoded so far (before stop and trimming). */
  private decoded = '';
  /** Length of `decoded` already emitted. */
  private emitted = 0;
  /** The final text so far: what was emitted. */
  private out = '';
  /** A stop sequence matched: nothing more is taken. */
  stopped: string | undefined;

  constructor(
    private readonly tokenizer: Detokenizer,
    private readonly stop: readonly string[] = [],
  ) {}

  get text(): string {
    return this.out;
  }

  /**
   * Takes the next generated id; returns the text it makes final (possibly empty). After a stop
   * sequence completes, `stopped` is set and the text ends before it.
   */
  push(id: number): string {
    if (this.stopped !== undefined) return '';
    this.ids.push(id);
    const prefix = this.readOffset > this.prefixOffset ? this.tokenizer.decode(this.ids.slice(this.prefixOffset, this.readOffset)) : '';
    const full = this.tokenizer.decode(this.ids.slice(this.prefixOffset));
    if (full.length > prefix.length && !full.endsWith('\uFFFD')) {
      this.decoded += full.slice(prefix.length);
      this.prefixOffset = this.readOffset;
      this.readOffset = this.ids.length;
    }
    return this.release(false);
  }

  /** At the end of the generation: whatever was held back for a stop sequence; trailing whitespace is dropped. */
  finish(): string {
    return this.stopped !== undefined ? '' : this.release(true);
  }

  private release(final: boolean): string {
    // Leading whitespace is never part of the answer.
    let from = this.emitted;
    if (this.out === '') {
      while (from < this.decoded.length && /\s/.test(this.decoded[from]!)) from++;
    }
    let pending = this.decoded.slice(from);
    // A stop sequence may start in held-back text only: anything emitted was past every stop's prefix.
    let cut = -1;
    for (const s of this.stop) {
      const at = pending.indexOf(s);
      if (at >= 0 && (cut < 0 || at < cut)) cut = at;
    }
    if (cut >= 0) {
      this.stopped = this.stop.find((s) => pending.startsWith(s, cut));
      pending = pending.slice(0, cut).trimEnd();
      this.emitted = this.decoded.length;
      this.out += pending;
      return pending;
    }
    let hold = 0;
    if (!final) {
      // The longest tail that is a proper prefix of some stop sequence.
      for (const s of this.stop) {
        for (let n = Math.min(s.length - 1, pending.length); n > hold; n--) {
          if (pending.endsWith(s.slice(0, n))) {
            hold = n;
            break;
          }
        }
      }
    }
    let ready = pending.slice(0, pending.length - hold);
    // Trailing whitespace waits for what follows it (and is dropped at the end).
    ready = ready.trimEnd();
    this.emitted = from + ready.length;
    this.out += ready;
    return ready;
  }
}
