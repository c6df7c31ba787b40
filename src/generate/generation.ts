/** What a generation request ends with, on every backend. */
export type FinishReason = 'stop' | 'length';

export interface Generation {
  ids: number[];
  text: string;
  finishReason: FinishReason;
  /** Prompt tokens whose KV came from the prefix cache (the engine's; 0 for sequential generation). */
  cachedTokens?: number;
}
