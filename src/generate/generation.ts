import type { TokenLogprobs } from './logprobs.js';

/** What a generation request ends with, on every backend. */
export type FinishReason = 'stop' | 'length';

export interface Generation {
  ids: number[];
  text: string;
  finishReason: FinishReason;
  /** Prompt tokens whose KV came from the prefix cache (the engine's; 0 for sequential generation). */
  cachedTokens?: number;
  /** Each generated token's logprobs (ids' order), where the request asked (logprobs.ts). */
  logprobs?: TokenLogprobs[];
  /**
   * Structured output only: to close the document within max_tokens, the budget left out a token the
   * schema allowed at some step (a string ended sooner, an optional property was left out).
   */
  steered?: boolean;
}
