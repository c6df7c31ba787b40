/**
 * OpenTelemetry traces: the one module that owns the SDK (the official JS SDK, spans exported by OTLP over
 * HTTP in its JSON encoding). Off unless an endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT or
 * OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, config.ts): without one nothing of the SDK is loaded, `tracingOn()` is
 * false and every helper here runs its work as it is, creating no span and no context (the callers pay a
 * branch); the API's tracer, asked by anyone else, is its no-op.
 *
 * On (startTracing, at the server's start): a BasicTracerProvider with a batch span processor and the
 * OTLP/HTTP exporter, registered as the global provider with an AsyncLocalStorage context manager, so
 * that a span started inside another's callback (the request's, server/request-trace.ts) is its child
 * across awaits. stopTracing flushes what is buffered and shuts the exporter down (the server's drain).
 *
 * The spans of a request (docs/observability.md): the request (root, server/request-trace.ts), admission
 * (the guard's decision, service/guarded-run.ts), embed, search, rerank, prompt, generate
 * (service/query-pipeline.ts), prefill and decode (generate/engine.ts). Every layer may import this one.
 */
import { context, propagation, ProxyTracerProvider, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, type Attributes, type Context, type Span } from '@opentelemetry/api';

export type { Attributes, Context, Span } from '@opentelemetry/api';
/** The parent that makes a span a root (a trace of its own): a context with no span in it. */
export { ROOT_CONTEXT } from '@opentelemetry/api';

/** The instrumentation scope of every span ragguard makes. */
export const TRACER_NAME = 'ragguard';

export interface TracingConfig {
  /** Where spans are POSTed (OTLP/HTTP); '' = off. */
  otlpTracesEndpoint: string;
  /** The resource's service.name. */
  serviceName: string;
}

interface Provider {
  forceFlush(): Promise<void>;
  shutdown(): Promise<void>;
}

let provider: Provider | undefined;
let on = false;

/** Whether spans are recorded and exported (an endpoint was set and startTracing ran). */
export function tracingOn(): boolean {
  return on;
}

/**
 * Loads the SDK and registers it globally when `cfg` names an endpoint; nothing otherwise. Returns
 * whether tracing is on. Once per process: a second call keeps the first's provider.
 */
export async function startTracing(cfg: TracingConfig): Promise<boolean> {
  if (on || cfg.otlpTracesEndpoint === '') return on;
  const [{ BasicTracerProvider, BatchSpanProcessor }, { OTLPTraceExporter }, { resourceFromAttributes }, { AsyncLocalStorageContextManager }, { W3CTraceContextPropagator }] =
    await Promise.all([
      import('@opentelemetry/sdk-trace-base'), import('@opentelemetry/exporter-trace-otlp-http'),
      import('@opentelemetry/resources'), import('@opentelemetry/context-async-hooks'), import('@opentelemetry/core'),
    ]);
  const exporter = new OTLPTraceExporter({ url: cfg.otlpTracesEndpoint });
  const p = new BasicTracerProvider({
    resource: resourceFromAttributes({ 'service.name': cfg.serviceName, 'telemetry.sdk.language': 'nodejs' }),
    // Batched: a request's spans leave together, off the request's path (every 5 s or 512 spans by
    // default; OTEL_BSP_* tune it).
    spanProcessors: [new BatchSpanProcessor(exporter)],
  });
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  // A caller's W3C traceparent continues its trace (remoteParent).
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  trace.setGlobalTracerProvider(p);
  provider = p;
  on = true;
  return true;
}

/**
 * Spans into the application's own OpenTelemetry SDK: where ragguard is a library (src/index.ts) and
 * started no SDK of its own, an application that registered a tracer provider globally (OpenTelemetry's
 * convention: libraries use the API, applications install the SDK) gets ragguard's spans through it, as
 * children of its own active span. True when tracing is on after the call: on already, or a provider other
 * than the API's no-op is registered now. The application flushes and shuts its provider down, not ragguard.
 */
export function followGlobalTracing(): boolean {
  if (on) return true;
  const registered = trace.getTracerProvider();
  const delegate = registered instanceof ProxyTracerProvider ? registered.getDelegate() : registered;
  // A fresh proxy's delegate is the API's no-op provider: the same object when nothing is registered.
  if (delegate === new ProxyTracerProvider().getDelegate()) return false;
  on = true;
  return true;
}

/**
 * Exports what is buffered and shuts the exporter down, within `timeoutMs` (a collector that does not
 * answer must not hold the exit: rejects then); later spans are not recorded. Nothing when off.
 */
export async function stopTracing(timeoutMs = 5000): Promise<void> {
  const p = provider;
  if (!p) return;
  on = false;
  provider = undefined;
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`the span exporter did not finish within ${timeoutMs} ms`)), timeoutMs);
    timer.unref();
  });
  try {
    await Promise.race([(async () => {
      try {
        await p.forceFlush();
      } finally {
        await p.shutdown();
      }
    })(), late]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * The parent a request's span starts under: the caller's span where its headers carry a W3C traceparent
 * (a gateway's trace continues here), else none (the request's span is a root, a trace of its own).
 */
export function remoteParent(headers: Readonly<Record<string, string | string[] | undefined>>): Context {
  return on ? propagation.extract(ROOT_CONTEXT, headers) : ROOT_CONTEXT;
}

/** Exports what is buffered now (a test, or before a pause). */
export async function flushTracing(): Promise<void> {
  await provider?.forceFlush();
}

const tracer = () => trace.getTracer(TRACER_NAME);

/** The context spans started now would be children of; undefined when off. */
export function activeContext(): Context | undefined {
  return on ? context.active() : undefined;
}

/**
 * A span started now, a child of `parent` (default: the active context's span), not made active: the
 * caller ends it (endSpan). `server`: the span of a request the process serves (kind SERVER). undefined when off.
 */
export function startSpan(name: string, attributes?: Attributes, parent?: Context, server = false): Span | undefined {
  if (!on) return undefined;
  return tracer().startSpan(name, { ...(attributes ? { attributes } : {}), ...(server ? { kind: SpanKind.SERVER } : {}) }, parent ?? context.active());
}

/** Ends `span`, with `error` recorded as its exception and status where given. */
export function endSpan(span: Span | undefined, error?: unknown, attributes?: Attributes): void {
  if (!span) return;
  if (attributes) span.setAttributes(attributes);
  if (error !== undefined) failSpan(span, error);
  span.end();
}

function failSpan(span: Span, error: unknown): void {
  const e = error instanceof Error ? error : new Error(String(error));
  span.recordException(e);
  span.setStatus({ code: SpanStatusCode.ERROR, message: e.message });
}

/**
 * Runs `work` inside a span named `name`, a child of the active one and active itself while `work` runs
 * (the spans `work` starts are its children); ended when `work` settles, a failure recorded on it. Off:
 * `work(undefined)` alone.
 */
export async function inSpan<T>(name: string, work: (span: Span | undefined) => T | Promise<T>, attributes?: Attributes): Promise<T> {
  if (!on) return work(undefined);
  return tracer().startActiveSpan(name, attributes ? { attributes } : {}, async (span) => {
    try {
      return await work(span);
    } catch (e) {
      failSpan(span, e);
      throw e;
    } finally {
      span.end();
    }
  });
}

/** Runs `fn` with `span` as the active span (its children start under it). Off, or no span: `fn()` alone. */
export function withSpan<T>(span: Span | undefined, fn: () => T): T {
  if (!on || !span) return fn();
  return context.with(trace.setSpan(context.active(), span), fn);
}

/**
 * `fn` bound to the context active now: called later from another's callback (a queue handing a slot
 * on), its spans are still children of this one's. Off: `fn` itself.
 */
export function bindActive<F extends (...args: never[]) => unknown>(fn: F): F {
  return on ? context.bind(context.active(), fn) : fn;
}

/**
 * Binds an event emitter's listeners (a request, its response) to the context with `span` active, so
 * that what they run (a body read, a reply's 'finish') stays under it. Off: nothing.
 */
export function bindEmitters(span: Span | undefined, ...emitters: NodeJS.EventEmitter[]): void {
  if (!on || !span) return;
  const ctx = trace.setSpan(context.active(), span);
  for (const e of emitters) context.bind(ctx, e);
}
