/**
 * The front door: the two replies that must not wait in a burst, answered on Node's own request and
 * response before express sees the request: a liveness probe (GET or HEAD /healthz) and a query shed
 * because every slot and queue place is taken (503 queue_full). Everything else, and any of these that
 * the front door cannot answer exactly as express would (a missing or wrong key, a server draining),
 * goes on to express unchanged.
 *
 * Why: Node reads one new connection per turn of the event loop, so in a burst of 200 each request's
 * handling holds back every connection behind it, the shed ones and the probes included. Through
 * express a shed query cost its prototypes, a walk over every middleware and route to the shedding
 * one, and `res.json` (content-type parsing, an ETag hash): in a CPU profile of a burst's first
 * 300 ms, express's modules took more of the main thread than Node's HTTP parsing and writing
 * together, and the last shed client waited 130-190 ms for its 503 where a trivial Node server
 * answers a burst's last request in 45-65 ms (bench:overload-floor).
 *
 * What these replies carry is what the express path gives them: the request id, the one log line and
 * the metrics (logging.ts trackRequest), the CORS headers, the same body and headers.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Admission } from '../guards/admission.js';
import { decoderRuntime, type RagService } from '../service/rag.js';
import { authorizer, corsHeaders, healthCaller } from './auth.js';
import { healthCounts } from './tenant-views.js';
import type { Tenant } from './tenant.js';
import { sendJson, toHttpError, type HttpError } from './errors.js';
import { errorState, routedOutcome, trackRequest, type Logger, type RequestDone } from './logging.js';
import { pathOf, type Lifecycle } from './shutdown.js';
import { nextTurn, noteArrival } from '../runtime/turns.js';

/**
 * GET /healthz's body: liveness, the store's counts, the models' providers, the queue and the KV pool. A
 * store that does not answer (Postgres down) is said, not a failed probe: the process itself is alive.
 */
export async function healthReport(service: RagService, admission: Admission, caller?: Tenant): Promise<Record<string, unknown>> {
  const { embedder, reranker, decoder } = service.models;
  // The counts only for an admin key (tenant-views.ts); `caller` undefined: an anonymous prober.
  const counts = await healthCounts(service, caller);
  return {
    status: 'ok',
    ...counts,
    store: service.store.kind,
    providers: { embedder: embedder.provider, reranker: reranker.provider, decoder: decoder.provider },
    // How the decoder takes its KV cache and how its runs reach its runtime (decoder-model.ts, backends/cuda).
    decoder: decoderRuntime(decoder),
    // The adapter a /query naming none generates with (RAGGUARD_QUERY_ADAPTER), null for the base model.
    query_adapter: service.queryAdapter ?? null,
    queue: { running: admission.running, waiting: admission.waiting },
    kv: service.blocks.stats(),
  };
}

/**
 * An admission place for a query that has just arrived, taken before its body is read: its ticket goes
 * in `res.locals.admission` (Admission.run takes it over) and back when the response closes, if the
 * query ended before. Returns the 503 queue_full when every place is taken. The front door's, and the
 * express route's for the queries the front door leaves to express (app.ts).
 */
export function letIn(admission: Admission, res: ServerResponse & { locals?: Record<string, unknown> }): HttpError | undefined {
  noteArrival(); // a burst still arriving holds back preparation (turns.ts)
  const ticket = admission.ticket();
  if (!ticket) return toHttpError(admission.queueFull());
  (res.locals ??= {})['admission'] = ticket;
  res.once('close', ticket.release);
  return undefined;
}

export interface FrontDoorDeps {
  service: RagService;
  admission: Admission;
  lifecycle: Lifecycle;
  log: Logger;
  onDone?: RequestDone;
}

/**
 * The front door's handler: answers the request itself, or hands it to `express` (now, or for a query
 * it let in, on a later turn of the event loop: turns.ts).
 */
export function frontDoor(d: FrontDoorDeps): (req: IncomingMessage, res: ServerResponse & { locals?: Record<string, unknown> }, express: () => void) => void {
  const refusal = authorizer(d.service.cfg);
  const caller = healthCaller(d.service.cfg);
  const cors = corsHeaders(d.service.cfg);

  const reply = (req: IncomingMessage, res: ServerResponse, path: string, route: string, status: number,
    body: Record<string, unknown>, headers: Record<string, string>, error?: HttpError): void => {
    trackRequest(d.log, d.onDone, req, res, () => ({ path, route, state: error ? errorState(status, error.body(), error) : {} }));
    cors(res, req.headers.origin);
    sendJson(res, status, body, headers, req.method === 'HEAD');
  };

  return (req, res, express) => {
    const path = pathOf(req);
    if (path === '/healthz' && (req.method === 'GET' || req.method === 'HEAD')) {
      // A probe: open to all, answered while draining too (shutdown.ts).
      void healthReport(d.service, d.admission, caller(req.headers.authorization)).then((body) => reply(req, res, path, '/healthz', 200, body, {}));
      return;
    }
    if (path !== '/query' || req.method !== 'POST') return express();
    // Refusals before shedding are express's to give, in its order (auth.ts, shutdown.ts).
    if (d.lifecycle.draining || refusal('POST', path, req.headers.authorization) !== undefined) return express();
    const shed = letIn(d.admission, res);
    // The body is never read (Node discards it once the reply is written).
    if (shed) return reply(req, res, path, '/query', shed.status, shed.body(), { ...shed.headers }, shed);
    // Let in: in flight from now (a drain waits for it, a hang-up aborts it), its log line and latency
    // counted from now. Express (its middleware, the body, the checks) takes it on a later turn, after
    // the burst's other arrivals: each admitted query's way through express held back every connection
    // behind it, the ones to be shed included.
    (res.locals ??= {})['requestId'] = trackRequest(d.log, d.onDone, req, res, () => routedOutcome(req, res, { path, route: '/query' }));
    d.lifecycle.track(req, res);
    void nextTurn().then(() => {
      if (!res.destroyed) express(); // else its client left while it waited: nothing more to do
    });
  };
}
