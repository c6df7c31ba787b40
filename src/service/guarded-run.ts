/**
 * The guarded run: the one way a request's work reaches the models. Every way in calls `guardedRun`
 * (POST /query streamed or not, the /v1 routes, rerank and score, embeddings, the library's calls):
 *
 *   1. the guard decides from the request's shape as asked (admit, queue, reshape, or refuse with a
 *      TooLargeError when it can never fit, or when a reshape would cut what it cannot lose, its `floor`);
 *   2. the work waits for an admission slot, taking over the admission ticket the request was given on
 *      arrival (server/front-door.ts letIn): the one place a ticket changes hands;
 *   3. then for its workspace reservation, runs on the decided shape and releases the reservation;
 *   4. the result comes back with the guard's report (the decision, the prediction as asked and for the
 *      shape as it ran), a value the server renders as it is.
 *
 * With the guards off (RAGGUARD_GUARDS=false) nothing is predicted or reserved: the work runs on the
 * shape as asked, under the admission queue alone.
 *
 * Traced (runtime/tracing.ts): an `admission` span from the decision to the work's start (the wait for a
 * slot and for workspace), with the decision and what was reshaped; the work's own spans are its
 * siblings under the request's, whichever request's callback the queue hands the slot on from.
 */
import type { Admission, AdmissionTicket } from '../guards/admission.js';
import type { RequestShape } from '../guards/memory-model.js';
import type { Decision } from '../guards/policy.js';
import { TooLargeError } from '../runtime/errors.js';
import { bindActive, endSpan, startSpan, type Span } from '../runtime/tracing.js';
import type { QueryInput, QueryResult, RagService } from './rag.js';

export type Admitted = Exclude<Decision, { action: 'reject' }>;

/** What a reshape may not cut: below it the request is refused as too large, with this message. */
export interface Floor {
  /** The prompt tokens that are the caller's own (a completion's prompt, a chat's conversation). */
  promptTokens?: number;
  /** Pairs that must all be scored (rerank, score). */
  topK?: number;
  message: string;
  /** The refusal's details; by default the predicted and the budget's bytes. */
  details?: Record<string, unknown>;
}

export interface GuardedRequest<T> {
  /**
   * The request's shape as asked, its worst case (asked for only with the guards on); absent: the
   * request is admitted by the queue alone, nothing predicted (a batch of embeddings).
   */
  shape?: () => RequestShape;
  floor?: Floor;
  /** The work, on the shape the guard decided (undefined: run as asked, the guards off or no shape). */
  work: (shape: RequestShape | undefined) => Promise<T>;
  /** The shape as it ran, for the report's `as_run` (default: the decided shape). */
  asRun?: (result: T, decided: RequestShape) => RequestShape;
}

export interface RunOptions {
  /** Aborted while queued (for an admission slot or for workspace): the work is not started. */
  signal?: AbortSignal;
  /** The admission place the request was given when it arrived: handed to the queue as the run is queued. */
  ticket?: AdmissionTicket;
}

/** The guard's report on a request: its decision, what it predicted as asked, and for the shape as it ran. */
export type GuardReport = Record<string, unknown>;

export interface GuardedResult<T> {
  result: T;
  guard: GuardReport;
}

/** Decides, queues, reserves and runs `req`'s work: the one guarded run (this module's header). */
export async function guardedRun<T>(service: RagService, admission: Admission, req: GuardedRequest<T>, opts: RunOptions = {}): Promise<GuardedResult<T>> {
  const span = startSpan('admission');
  let decision: Admitted | undefined;
  try {
    decision = service.cfg.guards && req.shape ? decide(service, req.shape(), req.floor) : undefined;
  } catch (e) {
    endSpan(span, e, { 'ragguard.guard.decision': 'reject' });
    throw e;
  }
  if (span) span.setAttributes(decisionAttributes(decision));
  let waiting: Span | undefined = span;
  const started = () => {
    endSpan(waiting);
    waiting = undefined;
  };
  let result: T;
  try {
    // Bound to this request's context: the queue may start it from another request's callback.
    result = await admission.run(bindActive(async () => {
      if (opts.signal?.aborted) throw opts.signal.reason instanceof Error ? opts.signal.reason : new Error('aborted');
      if (!decision) {
        started();
        return req.work(undefined);
      }
      const release = await service.guard.reserve(decision.prediction.reserveBytes, service.cfg.queueTimeoutMs, opts.signal);
      try {
        started();
        return await req.work(decision.shape);
      } finally {
        release();
      }
    }), opts.signal, opts.ticket);
  } catch (e) {
    // Refused or timed out while waiting (a failure of the work itself is the work's spans').
    if (waiting) endSpan(waiting, e);
    throw e;
  }
  return { result, guard: decision ? guardReport(service, decision, req.asRun?.(result, decision.shape) ?? decision.shape) : { decision: 'off' } };
}

/** The admission span's attributes: the guard's decision, what it reshaped, the bytes it predicted and reserved. */
function decisionAttributes(decision: Admitted | undefined): Record<string, string | number | string[]> {
  if (!decision) return { 'ragguard.guard.decision': 'off' };
  return {
    'ragguard.guard.decision': decision.action,
    'ragguard.guard.reshaped': decision.reshaped.map((r) => `${r.field}:${r.from}->${r.to}`),
    'ragguard.guard.predicted_bytes': decision.prediction.workspaceBytes + decision.prediction.kvBytes,
    'ragguard.guard.reserved_bytes': decision.prediction.reserveBytes,
    'ragguard.guard.peak_stage': decision.prediction.peakStage,
  };
}

/** A retrieval-augmented query (QueryInput), guarded: reshaped as the guard decided (queryOnShape). */
export function guardedQuery(service: RagService, admission: Admission, q: QueryInput, opts: RunOptions & { floor?: Floor } = {}): Promise<GuardedResult<QueryResult>> {
  return guardedRun(service, admission, {
    shape: () => service.requestShape(q),
    floor: opts.floor,
    work: (shape) => service.query(queryOnShape(q, shape), opts.signal),
    asRun: (r) => r.shape,
  }, opts);
}

/** The query as the guard shaped it: its candidates, new tokens, prompt budget and reranker batch. */
export function queryOnShape(q: QueryInput, shape: RequestShape | undefined): QueryInput {
  if (!shape) return q;
  return { ...q, topK: shape.topK, maxNewTokens: shape.maxNewTokens, promptBudget: shape.promptTokens, rerankBatch: shape.rerankBatch };
}

/** The shape of a generation without retrieval: only prefill and decode. */
export function generationShape(promptTokens: number, maxNewTokens: number, samples = 1): RequestShape {
  // samples: forks of the prompt (OpenAI's n), each a decode row with its own new tokens' KV.
  return { queryTokens: 0, topK: 0, rerankTopN: 0, pairTokens: 0, rerankBatch: 1, promptTokens, maxNewTokens, ...(samples > 1 ? { samples } : {}) };
}

/** The guard's decision for `shape`; refused (TooLargeError) when it can never fit, or only below `floor`. */
function decide(service: RagService, shape: RequestShape, floor: Floor | undefined): Admitted {
  const decision = service.guard.decide(shape);
  const predicted = decision.prediction.workspaceBytes + decision.prediction.kvBytes;
  const bytes = { predicted_bytes: predicted, budget_bytes: service.budget.budgetBytes };
  if (decision.action === 'reject') {
    throw new TooLargeError('request_too_large', `this request can never fit the memory budget: ${decision.reason}`, bytes);
  }
  if (floor && (decision.shape.promptTokens < (floor.promptTokens ?? 0) || decision.shape.topK < (floor.topK ?? 0))) {
    throw new TooLargeError('request_too_large', floor.message, floor.details ?? bytes);
  }
  return decision;
}

function guardReport(service: RagService, decision: Admitted, asRun: RequestShape): GuardReport {
  const p = service.guard.model.predict(asRun);
  return {
    decision: decision.action, reshaped: decision.reshaped,
    predicted_bytes: decision.prediction.workspaceBytes + decision.prediction.kvBytes,
    predicted_workspace_bytes: decision.prediction.workspaceBytes, reserved_bytes: decision.prediction.reserveBytes,
    peak_stage: decision.prediction.peakStage,
    // The same prediction for the shape as it ran (pairs left after pruning, the assembled prompt): the
    // reservation is the worst case of the request as asked.
    as_run: {
      reranked_pairs: asRun.topK, rerank_batch: asRun.rerankBatch, rerank_runs: asRun.rerankRuns, pair_tokens: asRun.pairTokens,
      prompt_tokens: asRun.promptTokens, cached_prompt_tokens: asRun.cachedTokens ?? 0,
      predicted_workspace_bytes: p.workspaceBytes, peak_stage: p.peakStage, predicted_stage_bytes: p.stages,
    },
  };
}
