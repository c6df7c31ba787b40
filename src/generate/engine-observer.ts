/**
 * What the engine tells an observer as it runs (metrics: time to first token, inter-token latency,
 * request latency, token counts). One optional listener; an engine without one pays a branch.
 */
import type { Sequence } from './sequence.js';

export interface EngineObserver {
  /** A token was sampled for `seq` (the end-of-sequence token too: it ends the request at that time). */
  token(seq: Sequence, now: number): void;
  /** `seq` left the engine: finished (its finishReason set) or failed. */
  finished(seq: Sequence, now: number, failed: boolean): void;
}
