/**
 * The server's life between its first request and its exit: which requests are in flight, each one's
 * AbortSignal (aborted when its client goes away, or when a shutdown's grace period ends), readiness,
 * and the drain on SIGTERM.
 *
 * Drain: stop admitting (every new request but the probes gets 503 shutting_down with Retry-After;
 * GET /readyz says 503), let the requests in flight finish within the grace period, then stop the
 * rest (their work ends at its next step and they are answered 503 shutting_down), and report what
 * happened, so that the caller exits 0 only when nothing was dropped.
 */
import type { NextFunction, Request, Response } from 'express';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { HttpError, sendJson } from './errors.js';

/** The path of a request's URL (without its query string); the front door routes by it too. */
export function pathOf(req: IncomingMessage): string {
  const url = req.url ?? '';
  const q = url.indexOf('?');
  return q < 0 ? url : url.slice(0, q);
}

/** Requests that never count as work: probes and read-only views, answered while draining too. */
const PROBES = new Set(['/healthz', '/readyz', '/metrics', '/debug/memory']);

/** Why a request's signal was aborted: its client closed the connection (nobody to answer). */
export class ClientClosedError extends HttpError {
  constructor(method: string, route: string) {
    super(499, 'client_closed_request', `the client closed the connection before the reply to ${method} ${route}`);
  }
}

const retryAfter = { 'Retry-After': '1' };
/** How long stopped requests get to reach their next step and reply, when the grace period is shorter. */
const STOP_MS = 2000;

export const shuttingDown = (why: string) => new HttpError(503, 'shutting_down', `the server is shutting down: ${why}`, {}, retryAfter);

export interface DrainReport {
  /** Requests in flight when the drain began. */
  inFlight: number;
  /** Of those, ended within the grace period. */
  finished: number;
  /** Stopped at the end of the grace period (answered 503 shutting_down, their work dropped). */
  dropped: number;
  /** New requests refused while draining. */
  refused: number;
  ms: number;
}

interface Tracked {
  req: IncomingMessage;
  /** Made when first asked for (requestSignal) or needed (an abort): a shed request never asks, and a
   * controller (its signal an EventTarget) was the costliest step of this bookkeeping in a burst. */
  controller?: AbortController;
}

const controllerOf = (t: Tracked): AbortController => (t.controller ??= new AbortController());

/** Whether what the server depends on answers (the Postgres store's database); the reason when not. */
export type Readiness = () => Promise<{ ok: true } | { ok: false; reason: string }>;

/** How long a readiness check may take before the probe is told not ready (a database that accepts and never answers). */
const READY_WAIT_MS = 2000;

function withinReadyWait(check: ReturnType<Readiness>): ReturnType<Readiness> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<{ ok: false; reason: string }>((resolve) => {
    timer = setTimeout(() => resolve({ ok: false, reason: `the store did not answer within ${READY_WAIT_MS} ms` }), READY_WAIT_MS);
    timer.unref();
  });
  return Promise.race([check, late]).finally(() => clearTimeout(timer));
}

export class Lifecycle {
  /**
   * Asked by GET /readyz once the server is up and not draining: a replica whose database does not answer
   * is taken out of rotation (503 store_unavailable) rather than sent queries it can only refuse.
   */
  readiness: Readiness | undefined;
  private drainingSince: number | undefined;
  /** One readiness check at a time: probes arriving together share it. */
  private checking: ReturnType<Readiness> | undefined;
  private readonly inflight = new Map<ServerResponse, Tracked>();
  private refused = 0;
  private idleWaiters: (() => void)[] = [];

  get draining(): boolean {
    return this.drainingSince !== undefined;
  }

  get inFlight(): number {
    return this.inflight.size;
  }

  /**
   * The middleware to mount first: readiness, refusal while draining, and each request's signal.
   * A plain middleware, not an express.Router: a router hands a request on to the next layer through
   * setImmediate, one more event-loop turn before the request reaches admission, and in a burst that
   * turn is spent behind the model work already running (a shed request's 503 came that much later).
   */
  middleware(): (req: Request, res: Response, next: NextFunction) => void {
    return (req, res, next) => {
      if ((req.path === '/readyz' || req.path === '/readyz/') && (req.method === 'GET' || req.method === 'HEAD')) {
        if (this.draining) {
          res.status(503).set(retryAfter).json(shuttingDown('not ready (draining)').body());
          return;
        }
        if (!this.readiness) {
          res.json({ status: 'ready' });
          return;
        }
        this.checking ??= withinReadyWait(this.readiness()).finally(() => (this.checking = undefined));
        void this.checking.then((r) => {
          if (r.ok) res.json({ status: 'ready' });
          else res.status(503).set(retryAfter).json(new HttpError(503, 'store_unavailable', `not ready: ${r.reason}`).body());
        }, (e: Error) => res.status(503).set(retryAfter).json(new HttpError(503, 'store_unavailable', `not ready: ${e.message}`).body()));
        return;
      }
      if (PROBES.has(req.path)) return next();
      // Let in before a drain began (the front door tracks a query it admits on arrival): it is work in flight.
      if (this.inflight.has(res)) return next();
      if (this.draining) {
        this.refused++;
        const e = shuttingDown('no new requests are admitted');
        res.status(e.status).set({ ...e.headers, Connection: 'close' }).json(e.body());
        return;
      }
      this.track(req, res);
      next();
    };
  }

  /**
   * Counts a request as in flight until its response closes (drain waits for it) and gives it a signal
   * (`res.locals.signal`): aborted when its client goes away first, or when a drain stops it. The
   * middleware does this; the front door does it for a query it lets in before express sees it.
   */
  track(req: IncomingMessage, res: ServerResponse & { locals?: Record<string, unknown> }): void {
    const t: Tracked = { req };
    this.inflight.set(res, t);
    res.locals ??= {};
    Object.defineProperty(res.locals, 'signal', { get: () => controllerOf(t).signal, enumerable: false });
    res.on('close', () => {
      // 'close' before the reply was written: the client went away; its work stops.
      if (!res.writableFinished && !controllerOf(t).signal.aborted) controllerOf(t).abort(new ClientClosedError(req.method ?? '', pathOf(req)));
      this.inflight.delete(res);
      if (this.inflight.size === 0) for (const w of this.idleWaiters.splice(0)) w();
    });
  }

  /**
   * Stops admitting, waits up to `graceMs` for the requests in flight, then aborts the rest (answered
   * 503 shutting_down) and waits for their replies (up to `graceMs` again, at least STOP_MS: their work
   * stops at its next step); one still unanswered then is answered 503 here. Resolves with what happened.
   */
  async drain(graceMs: number): Promise<DrainReport> {
    const t0 = performance.now();
    this.drainingSince ??= t0;
    const inFlight = this.inflight.size;
    await this.idle(graceMs);
    const late = [...this.inflight.values()];
    for (const t of late) {
      controllerOf(t).abort(shuttingDown(`RAGGUARD_SHUTDOWN_GRACE_MS (${graceMs} ms) ran out before ${t.req.method} ${pathOf(t.req)} finished; it was stopped`));
    }
    if (late.length > 0) await this.idle(Math.max(graceMs, STOP_MS));
    // A request whose handler never saw its signal (its body still arriving) still gets its answer.
    for (const [res, t] of this.inflight) {
      if (res.headersSent) continue;
      const e = shuttingDown(`${t.req.method} ${pathOf(t.req)} was still unanswered when the drain ended`);
      // Plain Node: a request the front door let in may not have reached express yet.
      sendJson(res, e.status, e.body(), { ...e.headers, Connection: 'close' });
    }
    return { inFlight, finished: inFlight - late.length, dropped: late.length, refused: this.refused, ms: Math.round(performance.now() - t0) };
  }

  private idle(ms: number): Promise<void> {
    if (this.inflight.size === 0) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      function done() {
        clearTimeout(timer);
        resolve();
      }
      this.idleWaiters.push(done);
    });
  }
}

/** The request's signal (aborted when its client leaves or a drain stops it); never aborted outside a Lifecycle. */
export function requestSignal(res: Response): AbortSignal {
  const s: unknown = res.locals['signal'];
  return s instanceof AbortSignal ? s : new AbortController().signal;
}
