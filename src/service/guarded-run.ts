/**
 * A request's run under the admission queue and the memory guard: the guard decides from the predicted
 * shape (413 when it can never fit), the work waits for an admission slot, then for its workspace
 * reservation, and releases it when done. Every way in runs through it: POST /query and the /v1 routes
 * (server/), and the library's calls (index.ts).
 */
import type { Admission } from '../guards/admission.js';
import type { RequestShape } from '../guards/memory-model.js';
import type { Decision } from '../guards/policy.js';
import { HttpError } from '../runtime/errors.js';
import type { RagService } from './rag.js';

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
  /**
   * The admission place the request was given when it arrived (server/front-door.ts letIn): handed to
   * the queue as the run is queued, so that the request is counted once, as running or waiting.
   */
  ticket?: { release(): void };
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
  }, opts.signal, opts.ticket);
}

/** The shape of a generation without retrieval: only prefill and decode. */
export function generationShape(promptTokens: number, maxNewTokens: number, samples = 1): RequestShape {
  // samples: forks of the prompt (OpenAI's n), each a decode row with its own new tokens' KV.
  return { queryTokens: 0, topK: 0, rerankTopN: 0, pairTokens: 0, rerankBatch: 1, promptTokens, maxNewTokens, ...(samples > 1 ? { samples } : {}) };
}
