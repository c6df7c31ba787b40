/**
 * A request's run under the admission queue and the memory guard, as POST /query runs (app.ts): the
 * guard decides from the predicted shape (413 when it can never fit), the work waits for an admission
 * slot, then for its workspace reservation, and releases it when done. The streamed /query and the
 * /v1 routes use this; the reply's `guard` object is built the same way as /query's.
 */
import type { Response } from 'express';
import type { RequestShape } from '../guards/memory-model.js';
import type { RagService } from '../service/rag.js';
import { requestSignal } from './shutdown.js';
import type { SseStream } from './sse.js';

export { decideOrReject, generationShape, runGuarded, type Admitted, type GuardedRun, type GuardOptions } from '../service/guarded-run.js';
import type { Admitted } from '../service/guarded-run.js';

/**
 * What stops a request's work: its client leaving or a drain ending it (the request's signal), and for
 * a stream also the stream closing.
 */
export function workSignal(res: Response, sse?: SseStream): AbortSignal {
  return sse ? AbortSignal.any([requestSignal(res), sse.signal]) : requestSignal(res);
}

/** The reply's `guard` object, as /query gives it (app.ts), for a request that ran as `asRun`. */
export function guardReport(service: RagService, decision: Admitted | undefined, asRun: RequestShape): Record<string, unknown> {
  if (!decision) return { decision: 'off' };
  const p = service.guard.model.predict(asRun);
  return {
    decision: decision.action, reshaped: decision.reshaped,
    predicted_bytes: decision.prediction.workspaceBytes + decision.prediction.kvBytes,
    predicted_workspace_bytes: decision.prediction.workspaceBytes, reserved_bytes: decision.prediction.reserveBytes,
    peak_stage: decision.prediction.peakStage,
    as_run: {
      reranked_pairs: asRun.topK, rerank_batch: asRun.rerankBatch, rerank_runs: asRun.rerankRuns, pair_tokens: asRun.pairTokens,
      prompt_tokens: asRun.promptTokens, cached_prompt_tokens: asRun.cachedTokens ?? 0,
      predicted_workspace_bytes: p.workspaceBytes, peak_stage: p.peakStage, predicted_stage_bytes: p.stages,
    },
  };
}
