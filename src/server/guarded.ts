/**
 * A request's run under the admission queue and the memory guard, as POST /query runs (app.ts): the
 * guard decides from the predicted shape (413 when it can never fit), the work waits for an admission
 * slot, then for its workspace reservation, and releases it when done. The streamed /query and the
 * /v1 routes use this; the reply's `guard` object is built the same way as /query's.
 */
import type { Response } from 'express';
import type { Admission } from '../guards/admission.js';
import type { RequestShape } from '../guards/memory-model.js';
import type { Decision } from '../guards/policy.js';
import type { RagService } from '../rag.js';
import { HttpError } from './errors.js';
import { requestSignal } from './shutdown.js';
import type { SseStream } from './sse.js';

export type Admitted = Exclude<Decision, { action: 'reject' }>;

export interface GuardedRun<T> {
  result: T;
  /** Undefined when the guards are off (RAGGUARD_GUARDS=false). */
  decision: Admitted | undefined;
}

export interface GuardOptions {
  /** The prompt is the client's own (a completion, a chat without retrieval): it cannot be shortened by a reshape. */
  fixedPrompt?: boolean;
  /** Aborted while queued (for an admission slot or for workspace): the work is not started. */
  signal?: AbortSignal;
}

/** The guard's decision for `shape` (413 when it can never fit), or undefined with the guards off. */
export function decideOrReject(service: RagService, shape: RequestShape, opts: GuardOptions = {}): Admitted | undefined {
  if (!service.cfg.guards) return undefined;
  const decision = service.guard.decide(shape);
  const predicted = decision.prediction.workspaceBytes + decision.prediction.kvBytes;
  if (decision.action === 'reject') {
    throw new HttpError(413, 'request_too_large', `this request can never fit the memory budget: ${decision.reason}`,
      { predicted_bytes: predicted, budget_bytes: service.budget.budgetBytes });
  }
  if (opts.fixedPrompt && decision.reshaped.some((r) => r.field === 'prompt_tokens')) {
    throw new HttpError(413, 'request_too_large',
      `a prompt of ${shape.promptTokens} tokens with ${shape.maxNewTokens} new tokens can never fit the memory budget`,
      { predicted_bytes: predicted, budget_bytes: service.budget.budgetBytes });
  }
  return decision;
}

/** Runs `work` on the decided shape inside an admission slot and a workspace reservation. */
export async function runGuarded<T>(service: RagService, admission: Admission, decision: Admitted | undefined,
  work: (shape: RequestShape | undefined) => Promise<T>, opts: GuardOptions = {}): Promise<T> {
  return admission.run(async () => {
    if (opts.signal?.aborted) throw opts.signal.reason instanceof Error ? opts.signal.reason : new Error('aborted');
    if (!decision) return work(undefined);
    const release = await service.guard.reserve(decision.prediction.reserveBytes, service.cfg.queueTimeoutMs, opts.signal);
    try {
      return await work(decision.shape);
    } finally {
      release();
    }
  }, opts.signal);
}

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

/** The shape of a generation without retrieval: only prefill and decode. */
export function generationShape(promptTokens: number, maxNewTokens: number): RequestShape {
  return { queryTokens: 0, topK: 0, rerankTopN: 0, pairTokens: 0, rerankBatch: 1, promptTokens, maxNewTokens };
}
