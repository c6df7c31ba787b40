/**
 * The tokens a sequence's penalties act on, kept as the sequence grows: for a device sampler, which
 * takes them as a list (distinct token, count in the output) rather than the prompt and output ids that
 * sampler.ts's applyPenalties walks on every step. The same rules: the repetition penalty over the prompt
 * and the output, presence and frequency over the output only.
 */
import { penalized, type SamplerSettings } from './sampler.js';

export interface PenaltyList {
  repetition: number;
  presence: number;
  frequency: number;
  /** Distinct token ids, in first-seen order. */
  tokens: readonly number[];
  /** Each token's occurrences in the output (0: seen in the prompt only). */
  counts: readonly number[];
}

export class PenaltyTally {
  private readonly index = new Map<number, number>();
  private readonly tokens: number[] = [];
  private readonly counts: number[] = [];
  private outputsSeen = 0;

  /** Undefined where the settings apply no penalty (the list would change nothing). */
  static for(s: SamplerSettings, promptIds: readonly number[], vocab: number): PenaltyTally | undefined {
    return penalized(s) ? new PenaltyTally(s, promptIds, vocab) : undefined;
  }

  private constructor(private readonly s: SamplerSettings, promptIds: readonly number[], private readonly vocab: number) {
    // Prompt tokens matter only to the repetition penalty.
    if ((s.repetitionPenalty ?? 1) !== 1) for (const t of promptIds) this.add(t, 0);
  }

  /**
   * The list after `outputIds` (the sequence's output so far: it only grows). Its arrays are the tally's
   * own, not copies (a step packs them at once): valid until the next call.
   */
  list(outputIds: readonly number[]): PenaltyList {
    if (outputIds.length < this.outputsSeen) throw new Error('a sequence\'s output shrank under its penalty tally');
    for (; this.outputsSeen < outputIds.length; this.outputsSeen++) this.add(outputIds[this.outputsSeen]!, 1);
    return {
      repetition: this.s.repetitionPenalty ?? 1, presence: this.s.presencePenalty ?? 0, frequency: this.s.frequencyPenalty ?? 0,
      tokens: this.tokens, counts: this.counts,
    };
  }

  private add(token: number, n: number): void {
    // Ids outside the vocabulary have no logit to change (applyPenalties skips them too).
    if (token < 0 || token >= this.vocab) return;
    const i = this.index.get(token);
    if (i === undefined) {
      this.index.set(token, this.tokens.length);
      this.tokens.push(token);
      this.counts.push(n);
    } else {
      this.counts[i]! += n;
    }
  }
}
