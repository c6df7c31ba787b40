/**
 * JSON logs (pino): one line per request, and the server's own events (start-up, capacity, progress).
 *
 * Every request gets an id: the client's `X-Request-Id` when it sends a sane one (so that ids follow a
 * request across proxies), else a new UUID; it is returned in the response's `X-Request-Id` header and
 * is on the request's log line. A request ends in exactly one line: method, path, status, latency, and
 * for an error its code and message. Client errors (4xx) are that one line with no stack: they are
 * the client's to fix, and a stack would bury real failures. Server errors (5xx) carry the stack,
 * except the server's deliberate answers (503 queue_full, queue_timeout, memory_busy, adapters_busy,
 * shutting_down: any 5xx but the catch-all 500 `internal`): those are one line at level warn. Their
 * stacks say nothing (only where the 503 was made), and formatting one (through the source maps)
 * cost more than the rest of a shed request: in a burst of 200, the shed requests' stacks held the
 * event loop for tens of milliseconds.
 */
import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { NextFunction, Request, Response } from 'express';
import { pino, type DestinationStream, type Logger, type LevelWithSilent } from 'pino';

export type { Logger };

export function createLogger(level: LevelWithSilent = 'info', destination?: DestinationStream): Logger {
  return pino({ level, base: { name: 'ragguard' }, timestamp: pino.stdTimeFunctions.isoTime }, destination);
}

const REQUEST_ID = /^[A-Za-z0-9._:\-]{1,128}$/;

/** What the error middleware leaves for the request's log line. */
interface RequestLogState {
  requestId: string;
  error?: { code: string; message: string };
  /** The failure itself, logged with its stack: only for 5xx that the server did not answer on purpose. */
  cause?: unknown;
  /** A 5xx answered on purpose (any code but `internal`): logged at warn, without a stack. */
  deliberate?: boolean;
}

function state(res: Response): RequestLogState {
  return res.locals as RequestLogState;
}

export function requestId(res: Response): string {
  return state(res).requestId;
}

/** Called by the error middleware: the error goes on the request's one line (with its stack if 5xx). */
export function noteError(res: Response, status: number, body: { error: Record<string, unknown> }, cause: unknown): void {
  Object.assign(state(res), errorState(status, body, cause));
}

/** What the log line of a request answered with `status` and `body` says about the error. */
export function errorState(status: number, body: { error: Record<string, unknown> }, cause: unknown): Omit<RequestLogState, 'requestId'> {
  const error = { code: String(body.error['code']), message: String(body.error['message']) };
  if (status < 500) return { error };
  // `internal` is the reply to a failure nothing anticipated (toHttpError's catch-all): a bug.
  return body.error['code'] === 'internal' ? { error, cause } : { error, deliberate: true };
}

/** What a finished request's log line says besides its status and latency. */
export interface RequestOutcome {
  path: string;
  /** The matched route's pattern (not the path: ids in paths would make every line its own series), or 'unmatched'. */
  route: string;
  state: Omit<RequestLogState, 'requestId'>;
}

export type RequestDone = (method: string, route: string, status: number, seconds: number) => void;

/**
 * Gives a request its id (the X-Request-Id header of the reply) and, when it ends, its one log line and
 * `onDone` (metrics). `outcome` is read then: the route matched and the error noted by that time. Used
 * by the express middleware below and by the front door (front-door.ts), which answers some requests
 * before express sees them: both log the same line.
 */
export function trackRequest(log: Logger, onDone: RequestDone | undefined, req: IncomingMessage, res: ServerResponse,
  outcome: () => RequestOutcome): string {
  const t0 = performance.now();
  const given = req.headers['x-request-id'];
  const id = typeof given === 'string' && REQUEST_ID.test(given) ? given : randomUUID();
  res.setHeader('X-Request-Id', id);
  let logged = false;
  const done = (aborted: boolean) => {
    if (logged) return;
    logged = true;
    const ms = Math.round((performance.now() - t0) * 100) / 100;
    const { path, route, state: s } = outcome();
    const method = req.method ?? '';
    onDone?.(method, route, res.statusCode, ms / 1000);
    const line: Record<string, unknown> = {
      req_id: id, method, path, route, status: res.statusCode, latency_ms: ms,
      ...(aborted ? { aborted: true } : {}),
      ...(s.error ? { error: s.error } : {}),
    };
    if (s.cause !== undefined) log.error({ ...line, err: s.cause }, 'request failed');
    else if (s.deliberate) log.warn(line, 'request refused');
    else log.info(line, 'request');
  };
  res.on('finish', () => done(false));
  // The client went away before the reply was written.
  res.on('close', () => done(!res.writableFinished));
  return id;
}

/**
 * A request's route and log state as express left them; `fallback` (path, route) for one that never
 * reached express (a query the front door let in whose client left before its turn).
 */
export function routedOutcome(req: IncomingMessage, res: ServerResponse & { locals?: Record<string, unknown> },
  fallback: { path: string; route: string }): RequestOutcome {
  const r = req as Partial<Request>;
  const s = (res.locals ?? {}) as Omit<RequestLogState, 'requestId'>;
  if (r.path === undefined) return { ...fallback, state: s };
  return { path: r.path, route: r.route ? `${r.baseUrl ?? ''}${String((r.route as { path: unknown }).path)}` : 'unmatched', state: s };
}

export function requestLogger(log: Logger, onDone?: RequestDone) {
  return (req: Request, res: Response, next: NextFunction): void => {
    // Tracked from its arrival by the front door (a query it let in): its line is already coming.
    if (state(res).requestId === undefined) {
      state(res).requestId = trackRequest(log, onDone, req, res, () => routedOutcome(req, res, { path: req.path, route: 'unmatched' }));
    }
    next();
  };
}
