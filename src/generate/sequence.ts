/** One request's generation state, as the scheduler and the engine see it. */
import { seededRandom, type SamplerSettings } from './sampler.js';
import type { DecoderAdapter } from './lora-pool.js';
import type { FinishReason } from './generation.js';
import type { OutputText } from './output-text.js';
import type { TokenGrammar, TokenGuide } from './structured/token-mask.js';
import type { TokenLogprobs } from './logprobs.js';

export type SequenceStatus = 'waiting' | 'running' | 'finished';

/**
 * Plain numbers and arrays (sampler.ts documents each): a device-side sampler takes the same fields.
 * Stop sequences are matched on the host, in the output's text (output-text.ts).
 */
export interface SamplingParams extends SamplerSettings {
  maxNewTokens: number;
  /** 0 = greedy. */
  temperature: number;
  seed?: number;
  /** The output ends before the first of these texts (finish reason 'stop'). */
  stop?: readonly string[];
  /** LoRA adapter the row runs with (loaded by the caller, who releases it after the generation). */
  adapter?: DecoderAdapter;
  /**
   * Mixed into the prefix cache's block hashes: a tenant's cached blocks are found only by its own
   * sequences (vLLM's cache_salt), so one tenant never reads another's KV, nor times a hit on it.
   */
  cacheSalt?: string;
  /** Generate exactly maxNewTokens, past any end-of-sequence token (benchmarks of decode throughput). */
  ignoreEos?: boolean;
  /** Constrained decoding: every token drawn from those the grammar allows next (structured/token-mask.ts). */
  grammar?: TokenGrammar;
  /** Log-probabilities of each generated token and of this many most likely alternatives (0-20; logprobs.ts); absent: none computed. */
  logprobs?: number;
}

export class Sequence {
  readonly outputIds: number[] = [];
  status: SequenceStatus = 'waiting';
  finishReason: FinishReason | undefined;
  /** Tokens whose KV is in the cache; the rest are fed to the model at the next step. */
  numComputed = 0;
  /** Prompt tokens found in the prefix cache at its first prefill (not computed for this request). */
  cachedPrefix: number | undefined;
  /** Times this sequence was preempted (its blocks freed, to be recomputed). */
  preemptions = 0;
  /** The sampler's state survives preemption, so a preempted sample continues the same stream. */
  readonly random: () => number;
  /** The output as text, detokenized as generated (stop sequences, streaming): engine.ts sets it. */
  text: OutputText | undefined;
  /** Where the output stands in params.grammar (survives preemption, as the output does). */
  readonly guide: TokenGuide | undefined;
  /** Each output token's logprobs, where params.logprobs asks (outputIds' order). */
  readonly logprobs: TokenLogprobs[] = [];
  /**
   * Parallel samples of the same prompt (OpenAI's `n`) waiting for this sequence's prefill: each then
   * takes its first token from the same logits and shares the prompt's blocks (engine.ts).
   */
  forks: Sequence[] | undefined;

  constructor(
    readonly id: number,
    readonly promptIds: readonly number[],
    readonly params: SamplingParams,
    readonly arrival: number,
  ) {
    if (promptIds.length === 0) throw new Error('empty prompt');
    // Without a seed, a request's own (as OpenAI and vLLM do): a fixed default would give every
    // unseeded request at the same temperature the same "sample".
    this.random = seededRandom(params.seed ?? Math.floor(Math.random() * 2 ** 32));
    this.guide = params.grammar?.start(params.maxNewTokens);
  }

  /** The adapter's key: the KV depends on it, so prefix-cache entries are per adapter (block-manager.ts). */
  get adapter(): string | undefined {
    return this.params.adapter?.key;
  }

  get cacheSalt(): string | undefined {
    return this.params.cacheSalt;
  }

  get length(): number {
    return this.promptIds.length + this.outputIds.length;
  }

  /** Prompt and generated tokens: what the KV cache holds once computed. */
  get tokenIds(): number[] {
    return [...this.promptIds, ...this.outputIds];
  }

  /** Tokens still to feed through the model (a whole prompt at first, one token per decode step). */
  get pending(): number[] {
    return this.tokenIds.slice(this.numComputed);
  }

  get lastToken(): number {
    return this.outputIds.at(-1) ?? this.promptIds.at(-1)!;
  }
}
