/**
 * The HTTP surface: small handlers over the RAG service, one error middleware that turns every
 * failure into a status plus `{error: {code, message}}`.
 */
import express, { type NextFunction, type Request, type Response } from 'express';
import { AdapterInvalidError, AdapterNotFoundError } from '../generate/adapters.js';
import { Admission } from '../guards/admission.js';
import { guardedQuery } from '../service/guarded-run.js';
import { checkQueryShape } from '../service/request-shape.js';
import type { RagService } from '../service/rag.js';
import { frontDoor, healthReport, letIn } from './front-door.js';
import { authenticate, cors, healthCaller } from './auth.js';
import { scopedMemory } from './tenant-views.js';
import { reloadKeysOnChange } from './key-reload.js';
import { memorySnapshot } from './debug-memory.js';
import { documentsRouter } from './documents.js';
import { multipartUpload, postDocuments, uploadJson } from './document-intake.js';
import { createLogger, noteError, requestLogger, type Logger } from './logging.js';
import { dashboardIfHtml } from './memory-dashboard.js';
import { metricsFor, metricsHandler } from './metrics.js';
import { HttpError, toHttpError } from './errors.js';
import { Lifecycle } from './shutdown.js';
import { nextTurn } from '../runtime/turns.js';
import { parseQuery } from './validate.js';
import { chargeTokens, checkTokenBudget, limitKeys, limitsFor } from './rate-limits.js';
import { checkAdapter, tenantOf } from './tenant.js';
import { streamQuery } from './query-stream.js';
import { runOptions } from './guarded.js';
import { openaiRoutes } from './openai-routes.js';
import { jsonBody } from './json-body.js';
import { StructuredOutputs } from './structured.js';

/**
 * `lifecycle`: readiness, draining and each request's AbortSignal (serve() drains it on SIGTERM);
 * `logger`: where request lines go (JSON on stdout by default); `admission`: the queue to share (a new one by default).
 */
export function createApp(service: RagService, opts: { logger?: Logger; lifecycle?: Lifecycle; admission?: Admission } = {}): express.Express {
  const lifecycle = opts.lifecycle ?? new Lifecycle();
  // Readiness follows the store (Postgres answering); an in-process faiss index is always there.
  const store = service.store;
  if (store.ready) lifecycle.readiness = () => store.ready!();
  const { cfg } = service;
  const log = opts.logger ?? createLogger(cfg.logLevel);
  const metrics = metricsFor(service);
  // One queue per process where the library shares its own (library/ragguard.ts) with the apps it mounts.
  const admission = opts.admission ?? new Admission({ concurrency: cfg.maxConcurrentQueries, maxQueue: cfg.maxQueueLength, timeoutMs: cfg.queueTimeoutMs });
  metrics.addQueue(admission);
  const outputs = new StructuredOutputs(service.engine.runner);
  outputs.warm();
  const app = express();
  app.disable('x-powered-by');
  const onDone = (m: string, route: string, status: number, s: number) => metrics.httpRequest(m, route, status, s);
  // Probes and shed queries are answered before express (front-door.ts says why); the rest goes on.
  const front = frontDoor({ service, admission, lifecycle, log, onDone });
  // Ahead of express's own handling: the app function (what app.listen and supertest call) calls
  // app.handle, express's entry since 3.x, left out of its typings.
  const entry = app as unknown as { handle(req: Request, res: Response, next?: NextFunction): void };
  const handle = entry.handle.bind(app);
  entry.handle = (req, res, next) => front(req, res, () => handle(req, res, next));
  app.use(requestLogger(log, onDone));
  // RAGGUARD_KEYS_FILE read again on SIGHUP and when it changes (key-reload.ts); authenticate reads the keys per request.
  reloadKeysOnChange(cfg, (m, error) => (error ? log.error(m) : log.info(m)));
  app.use(cors(cfg), authenticate(cfg), limitKeys(limitsFor(service)));
  app.use(lifecycle.middleware());
  // Shed load before reading the body or tokenizing anything: a full server answers 503 at once. The
  // front door did this for POST /query; here for what it left to express.
  app.post('/query', (_req, res, next) => {
    if (res.locals['admission'] !== undefined) return next();
    const shed = letIn(admission, res);
    // Answered here, not through the error middleware: walking the rest of the routes to it is work
    // every shed request of a burst did before the next one was read.
    if (shed) return replyError(res, shed);
    next();
  });
  // Files as base64 in JSON, and multipart uploads, go to the document routes under their own limit (document-intake.ts).
  app.post('/documents', uploadJson(cfg), multipartUpload(cfg));
  app.put('/documents/:id', uploadJson(cfg));
  app.use(jsonBody(cfg.maxDocumentBytes));

  // Also answered at the front door (front-door.ts); here for the paths it leaves to express ('/healthz/').
  const caller = healthCaller(cfg);
  app.get('/healthz', async (req, res) => {
    res.json(await healthReport(service, admission, caller(req.get('authorization'))));
  });

  // Admin routes (auth.ts); a collection-scoped admin key sees its own figures (tenant-views.ts).
  app.get('/metrics', metricsHandler(metrics, () => cfg.keys));
  app.get(['/debug/memory', '/debug/memory.html'], dashboardIfHtml);
  app.get('/debug/memory', async (_req, res) => {
    res.json(await scopedMemory(memorySnapshot(service, admission, service.gpu.latest()), service, tenantOf(res)));
  });

  app.post('/query', async (req, res) => {
    await nextTurn(); // one request's preparation per turn of the event loop (turns.ts)
    const q = parseQuery(req.body, cfg, tenantOf(res));
    // The key's right to its adapter, as to its collection, is decided first (403 before 429, before the files).
    if (q.adapter !== undefined) checkAdapter(tenantOf(res), q.adapter);
    // None named: the server's query adapter (RAGGUARD_QUERY_ADAPTER), a policy of the server's, not the key's.
    q.adapter = service.queryAdapterFor(q.baseModel ? null : q.adapter);
    checkTokenBudget(res);
    // response_format: the answer generated under its grammar (json_object or a schema).
    if (q.responseFormat) q.sampling = { ...q.sampling, grammar: await outputs.forFormat(q.responseFormat) };
    checkQueryShape(q, service);
    // Whether the adapter fits the decoder and its slots, from its files, before anything runs.
    if (q.adapter !== undefined) await inspectAdapter(service, q.adapter);
    if (q.stream) return streamQuery(service, admission, q, res);
    // The guard decides, the query runs under the ticket the front door gave it (service/guarded-run.ts).
    const { result: { shape: _shape, ...result }, guard } = await guardedQuery(service, admission, q, runOptions(res));
    chargeTokens(res, result.usage.prompt_tokens + result.usage.completion_tokens);
    res.json({ ...result, guard });
  });

  app.post('/documents', (req, res) => postDocuments(service, req, res));

  app.use(documentsRouter(service));
  app.use(openaiRoutes(service, admission, outputs));

  app.use((req, _res, next) => next(new HttpError(404, 'not_found', `no route ${req.method} ${req.path}`)));

  app.use((err: unknown, _req: Request, res: Response, _next: NextFunction) => replyError(res, err));
  return app;
}

function replyError(res: Response, err: unknown): void {
  const e = toHttpError(err);
  // On the request's one log line: code and message; the stack too for a 500.
  noteError(res, e.status, e.body(), err);
  res.status(e.status).set(e.headers).json(e.body());
}

async function inspectAdapter(service: RagService, name: string): Promise<void> {
  try {
    await service.adapters.inspect(name);
  } catch (e) {
    if (e instanceof AdapterNotFoundError) throw new HttpError(400, 'adapter_not_found', e.message, { adapter: name });
    if (e instanceof AdapterInvalidError) throw new HttpError(422, 'adapter_invalid', e.message, { adapter: name });
    throw e;
  }
}
