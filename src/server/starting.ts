/**
 * The server before its service is ready. The port opens within a second of the start, while the
 * models load, the profile runs and the corpus ingests (service/startup.ts), so that a liveness probe
 * finds the process alive and a client learns why it must wait, the way Kubernetes' probes expect:
 * - GET /healthz: 200, alive, with the phase (liveness: restarting the process would not help);
 * - GET /readyz: 503 `starting` with the phase, its progress and Retry-After (readiness);
 * - GET /metrics: the process' own metrics and `ragguard:startup_phase`; GET /debug/memory: 503
 *   `starting` with the process' memory (what can be said before the budget exists);
 * - everything else (POST /query, /v1/*, /documents): 503 `starting` with Retry-After, after the
 *   same CORS and key checks as once ready (a wrong key is 401 whether or not the server is ready).
 *
 * AppHandoff is the listener the HTTP server is made with: these replies until the service's app is
 * handed over, that app from then on. The service's app is built once, over a started service, so
 * none of its routes ever sees a service that is not there. Until the start is over /readyz stays
 * here: the app takes requests while the warm-up query runs, but the server is not ready yet.
 */
import type { IncomingMessage, RequestListener, ServerResponse } from 'node:http';
import express, { type NextFunction, type Request, type Response } from 'express';
import type { Registry } from 'prom-client';
import type { Config } from '../config/config.js';
import { STARTUP_PHASES, type Startup } from '../service/startup.js';
import { authenticate, cors } from './auth.js';
import { HttpError } from './errors.js';
import { noteError, requestLogger, type Logger } from './logging.js';
import { dashboardIfHtml } from './memory-dashboard.js';
import { pathOf } from './shutdown.js';

/** Seconds a client is asked to wait before trying again: a start takes seconds to minutes. */
export const STARTING_RETRY_AFTER_S = 5;

export function startingError(startup: Startup): HttpError {
  return new HttpError(503, 'starting',
    `the server is starting: ${startup.describe()}; retry once GET /readyz answers 200`,
    {}, { 'Retry-After': String(STARTING_RETRY_AFTER_S) });
}

/** The replies of a server whose service is not ready yet (the module's header lists them). */
export function startingApp(cfg: Config, startup: Startup, log: Logger): express.Express {
  const app = express();
  app.disable('x-powered-by');
  app.use(requestLogger(log));
  app.use(cors(cfg), authenticate(cfg));
  app.get('/healthz', (_req, res) => {
    res.json({ status: 'ok', ready: false, ...startup.status() });
  });
  // A probe's answer, not a refusal: on the request's log line as its status alone.
  app.get('/readyz', (_req, res) => {
    const e = startingError(startup);
    res.status(503).set(e.headers).json({ status: 'starting', ...startup.status(), ...e.body() });
  });
  let metrics: Promise<Registry> | undefined;
  app.get('/metrics', (_req, res, next) => {
    (metrics ??= startingMetrics(startup)).then((r) => r.metrics().then((text) => res.type(r.contentType).send(text))).catch(next);
  });
  app.get(['/debug/memory', '/debug/memory.html'], dashboardIfHtml);
  app.get('/debug/memory', (_req, res) => {
    const e = startingError(startup);
    const m = process.memoryUsage();
    res.status(503).set(e.headers).json({
      ...e.body(), starting: startup.status(),
      process: { rss: m.rss, heap_total: m.heapTotal, heap_used: m.heapUsed, external: m.external, array_buffers: m.arrayBuffers },
    });
  });
  app.use((_req, _res, next) => next(startingError(startup)));
  app.use((err: unknown, _req: Request, res: Response, _next: NextFunction) => {
    // Here only the refusals above and auth's 401/403 reach this; anything else is a failure of ours.
    const e = err instanceof HttpError ? err : new HttpError(500, 'internal', 'internal error');
    noteError(res, e.status, e.body(), err);
    res.status(e.status).set(e.headers).json(e.body());
  });
  return app;
}

/**
 * The process' default metrics and the phase, until the service's own registry (metrics.ts) takes over.
 * prom-client is loaded when first asked for: the port opens before it (see library/serve.ts).
 */
async function startingMetrics(startup: Startup): Promise<Registry> {
  const { Gauge, Registry, collectDefaultMetrics } = await import('prom-client');
  const r = new Registry();
  collectDefaultMetrics({ register: r });
  new Gauge({
    name: 'ragguard:startup_phase', help: 'The start-up phase the server is in (1), while it is not ready.', labelNames: ['phase'], registers: [r],
    collect() {
      for (const p of STARTUP_PHASES) this.labels(p).set(startup.phase === p ? 1 : 0);
    },
  });
  return r;
}

const isReadyz = (req: IncomingMessage) => {
  const p = pathOf(req);
  return p === '/readyz' || p === '/readyz/';
};

/** The HTTP server's listener: the starting app's replies until `serve` hands over the service's app. */
export class AppHandoff {
  private app: RequestListener | undefined;

  constructor(private readonly startup: Startup, private readonly starting: RequestListener) {}

  readonly listener = (req: IncomingMessage, res: ServerResponse): void => {
    const app = this.app;
    if (app && (this.startup.ready || !isReadyz(req))) return void app(req, res);
    void this.starting(req, res);
  };

  serve(app: RequestListener): void {
    this.app = app;
  }
}
