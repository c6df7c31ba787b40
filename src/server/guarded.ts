/**
 * What an HTTP request gives the guarded run (service/guarded-run.ts): the signal that stops its work
 * and the admission ticket it was given on arrival (POST /query: front-door.ts letIn).
 */
import type { Response } from 'express';
import type { AdmissionTicket } from '../guards/admission.js';
import type { RunOptions } from '../service/guarded-run.js';
import { requestSignal } from './shutdown.js';
import type { SseStream } from './sse.js';

/**
 * The run's options for this request: what stops its work (its client leaving or a drain ending it,
 * and for a stream also the stream closing) and its admission ticket, if it was given one.
 */
export function runOptions(res: Response, sse?: SseStream): RunOptions & { signal: AbortSignal } {
  const signal = sse ? AbortSignal.any([requestSignal(res), sse.signal]) : requestSignal(res);
  const ticket = res.locals['admission'] as AdmissionTicket | undefined;
  return { signal, ...(ticket ? { ticket } : {}) };
}
