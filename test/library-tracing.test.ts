/**
 * ragguard as a library inside an application that installed its own OpenTelemetry SDK (OpenTelemetry's
 * convention: libraries use the API, the application registers the SDK): a real tracer provider of the
 * official SDK with an in-memory exporter, registered globally before createRagguard, no OTEL_* endpoint in
 * ragguard's configuration. A query made inside the application's own span leaves ragguard's spans in that
 * trace, each stage the child it should be; closing ragguard leaves the application's provider running.
 * (A file of its own: node --test runs it in its own process, so the global provider touches no other test.)
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { context, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { createRagguard, type Ragguard } from '../src/index.js';
import { tracingOn } from '../src/runtime/tracing.js';
import { smallCorpus, tempDir, TEST_ENV } from './helpers.js';

const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
let rg: Ragguard;

before(async () => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  trace.setGlobalTracerProvider(provider);
  rg = await createRagguard({ env: { ...TEST_ENV, RAGGUARD_PROFILE_RUN: 'false' }, config: { indexDir: await tempDir(), corpusDir: await smallCorpus(2) } });
});
after(async () => {
  await provider.shutdown();
});

test('a query inside the application\'s span: ragguard\'s stages are spans of the application\'s trace, under its span', async () => {
  assert.equal(rg.config.otlpTracesEndpoint, '', 'no endpoint of ragguard\'s own');
  assert.ok(tracingOn(), 'the application\'s provider is followed');
  const appTracer = trace.getTracer('the-application');
  const traceId = await appTracer.startActiveSpan('handle-request', async (span) => {
    try {
      await rg.query({ query: 'How do I schedule a job?', maxNewTokens: 4 });
      return span.spanContext().traceId;
    } finally {
      span.end();
    }
  });
  const spans = exporter.getFinishedSpans().filter((s) => s.spanContext().traceId === traceId);
  const byName = new Map(spans.map((s) => [s.name, s]));
  for (const name of ['handle-request', 'admission', 'embed', 'search', 'prompt', 'generate', 'prefill']) assert.ok(byName.has(name), `span ${name} in the trace: ${[...byName.keys()].join(', ')}`);
  const root = byName.get('handle-request')!;
  const parentOf = (name: string) => byName.get(name)!.parentSpanContext?.spanId;
  assert.equal(parentOf('admission'), root.spanContext().spanId, 'the admission span is a child of the application\'s');
  for (const stage of ['embed', 'search', 'prompt', 'generate']) {
    const ancestors: string[] = [];
    let id = parentOf(stage);
    while (id) {
      const s = spans.find((x) => x.spanContext().spanId === id);
      if (!s) break;
      ancestors.push(s.name);
      id = s.parentSpanContext?.spanId;
    }
    assert.ok(ancestors.includes('handle-request'), `${stage} descends from the application's span: ${ancestors.join(' < ')}`);
  }
});

test('closing ragguard leaves the application\'s provider to the application: its spans are still recorded', async () => {
  await rg.close();
  exporter.reset();
  trace.getTracer('the-application').startSpan('after-close').end();
  assert.deepEqual(exporter.getFinishedSpans().map((s) => s.name), ['after-close']);
});
