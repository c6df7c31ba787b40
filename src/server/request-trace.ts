/**
 * The root span of each HTTP request, where tracing is on (runtime/tracing.ts): started as the request
 * arrives, before the front door and express (a root, or the child of the caller's span where it sends a
 * W3C traceparent), active while it is handled (its request and response
 * bound to it, so that a body read or a queue's callback stays under it) and ended when the reply is sent
 * or the client goes away. It carries the request's id (the reply's X-Request-Id, logging.ts), its
 * route and its status; the service's spans (admission, embed, search, rerank, prompt, generate, prefill,
 * decode) are its children. Probes and /metrics are not traced. Off: the listener is returned as it is.
 */
import type { IncomingMessage, RequestListener, ServerResponse } from 'node:http';
import { bindEmitters, endSpan, remoteParent, startSpan, tracingOn, withSpan } from '../runtime/tracing.js';
import { pathOf } from './shutdown.js';

/** Never traced: probes and scrapes come every few seconds and say nothing about a request's time. */
const UNTRACED = new Set(['/healthz', '/readyz', '/metrics']);

/** `listener` with a root span around each request (this module's header); `listener` itself when tracing is off. */
export function traceRequests(listener: RequestListener): RequestListener {
  if (!tracingOn()) return listener;
  return (req, res) => {
    const path = pathOf(req);
    if (UNTRACED.has(path) || !tracingOn()) return listener(req, res);
    const method = req.method ?? 'GET';
    // A root, a trace of its own, unless the caller sent a W3C traceparent: then a child of its span.
    const span = startSpan(method, { 'http.request.method': method, 'url.path': path }, remoteParent(req.headers), true);
    if (!span) return listener(req, res);
    bindEmitters(span, req, res);
    let ended = false;
    const end = () => {
      if (ended) return;
      ended = true;
      const route = routeOf(req);
      const id = res.getHeader('x-request-id');
      span.updateName(route ? `${method} ${route}` : method);
      const attrs: Record<string, string | number | boolean> = { 'http.response.status_code': res.statusCode };
      if (route) attrs['http.route'] = route;
      if (typeof id === 'string') attrs['ragguard.request_id'] = id;
      // Closed before the reply was complete: the client went away.
      if (!res.writableFinished) attrs['ragguard.client_closed'] = true;
      endSpan(span, res.statusCode >= 500 ? new Error(`answered ${res.statusCode}`) : undefined, attrs);
    };
    res.once('finish', end);
    res.once('close', end);
    withSpan(span, () => listener(req, res));
  };
}

/** The express route that answered (with its router's mount path), or the front door's for POST /query. */
function routeOf(req: IncomingMessage): string | undefined {
  const r = req as IncomingMessage & { route?: { path?: unknown }; baseUrl?: string };
  if (r.route && typeof r.route.path === 'string') return `${r.baseUrl ?? ''}${r.route.path}`;
  // Answered at the front door (a shed query never reaches express).
  if (req.method === 'POST' && pathOf(req) === '/query') return '/query';
  return undefined;
}
