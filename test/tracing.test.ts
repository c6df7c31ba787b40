/**
 * OpenTelemetry traces (src/runtime/tracing.ts, docs/observability.md), end to end against a real
 * OpenTelemetry Collector: the one scripts/fetch-otelcol.sh builds from the Go module proxy (pinned in
 * scripts/otelcol/go.mod and go.sum; `npm run setup` builds it), with its OTLP/HTTP receiver and its file
 * exporter writing what it received as OTLP JSON lines. A server spawned with OTEL_EXPORTER_OTLP_ENDPOINT
 * pointed at it answers one POST /query and is stopped with SIGTERM; the batch processor's delay is set far
 * beyond the test, so the spans reach the collector only through the flush on shutdown. The file then
 * holds the request's trace: its root with the request id, route and status, a span per stage, each the
 * child it should be.
 *
 * The collector failing to build fails this file; only a Go module proxy that cannot be reached (or no Go)
 * skips the collector's test, saying so.
 */
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { readFile, writeFile } from 'node:fs/promises';
import http from 'node:http';
import type net from 'node:net';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { loadConfig } from '../src/config/config.js';
import { activeContext, inSpan, startSpan, startTracing, stopTracing, tracingOn } from '../src/runtime/tracing.js';
import { createApp } from '../src/server/app.js';
import { traceRequests } from '../src/server/request-trace.js';
import { RagService } from '../src/service/rag.js';
import { freePort, ROOT, smallCorpus, sseEvents, startServer, tempDir, testConfig } from './helpers.js';

describe('tracing configuration', () => {
  test('off by default: no endpoint, nothing loaded, every helper runs its work as it is', async () => {
    const cfg = loadConfig({});
    assert.equal(cfg.otlpTracesEndpoint, '');
    assert.equal(cfg.serviceName, 'ragguard');
    assert.equal(tracingOn(), false);
    assert.equal(startSpan('x'), undefined);
    assert.equal(activeContext(), undefined);
    assert.equal(await inSpan('x', (span) => (assert.equal(span, undefined), 7)), 7);
    const listener: http.RequestListener = () => {};
    assert.equal(traceRequests(listener), listener);
  });

  test('the standard variables: the base URL gets /v1/traces, the traces URL is used as it is and wins, bad URLs are refused', () => {
    assert.equal(loadConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://127.0.0.1:4318' }).otlpTracesEndpoint, 'http://127.0.0.1:4318/v1/traces');
    assert.equal(loadConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: 'https://otel.example:4318/' }).otlpTracesEndpoint, 'https://otel.example:4318/v1/traces');
    assert.equal(loadConfig({ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'http://c:4318/custom' }).otlpTracesEndpoint, 'http://c:4318/custom');
    assert.equal(loadConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://a:4318', OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'http://b:4318/v1/traces' }).otlpTracesEndpoint,
      'http://b:4318/v1/traces');
    assert.equal(loadConfig({ OTEL_SERVICE_NAME: 'rag-eu-1' }).serviceName, 'rag-eu-1');
    assert.throws(() => loadConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: 'localhost:4318' }), /OTEL_EXPORTER_OTLP_ENDPOINT: expected an http:\/\/ or https:\/\/ URL/);
    assert.throws(() => loadConfig({ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'grpc://c:4317' }), /OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: expected/);
    assert.throws(() => loadConfig({ OTEL_SERVICE_NAME: ' ' }), /OTEL_SERVICE_NAME: must not be empty/);
  });
});

/** The collector binary (scripts/fetch-otelcol.sh builds it when missing); '' with `unavailable` saying why. */
let otelcol = '';
let unavailable = '';

before(() => {
  const r = spawnSync('bash', [path.join(ROOT, 'scripts', 'fetch-otelcol.sh')], { encoding: 'utf8', timeout: 15 * 60_000 });
  if (r.status === 3) {
    unavailable = `the Go module proxy cannot be reached, the collector cannot be built: ${r.stderr.trim().split('\n').slice(-1)[0]}`;
    return;
  }
  if (r.status !== 0 && /Go not found/.test(r.stderr)) {
    unavailable = 'Go not found: the collector cannot be built';
    return;
  }
  assert.equal(r.status, 0, `scripts/fetch-otelcol.sh failed:\n${r.stderr}`);
  otelcol = /^OTELCOL=(.+)$/m.exec(r.stdout)![1]!;
});

interface Collector {
  port: number;
  file: string;
  proc: ChildProcess;
  log(): string;
}

/** The collector on a free port: OTLP/HTTP in, each batch received written to `file` as an OTLP JSON line. */
async function startCollector(): Promise<Collector> {
  const dir = await tempDir('ragguard-otelcol-');
  const port = await freePort();
  const file = path.join(dir, 'traces.jsonl');
  const config = path.join(dir, 'config.yaml');
  await writeFile(config, [
    'receivers:',
    '  otlp:',
    '    protocols:',
    '      http:',
    `        endpoint: 127.0.0.1:${port}`,
    'exporters:',
    '  file:',
    `    path: ${file}`,
    '    flush_interval: 100ms',
    'service:',
    '  telemetry:',
    '    metrics:',
    '      level: none',
    '  pipelines:',
    '    traces:',
    '      receivers: [otlp]',
    '      exporters: [file]',
    '',
  ].join('\n'));
  const proc = spawn(otelcol, [`--config=file:${config}`], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  proc.stdout!.on('data', (c: Buffer) => (out += c.toString()));
  proc.stderr!.on('data', (c: Buffer) => (out += c.toString()));
  await new Promise<void>((resolve, reject) => {
    const look = () => {
      if (out.includes('Everything is ready')) resolve();
    };
    proc.stderr!.on('data', look);
    proc.stdout!.on('data', look);
    proc.once('exit', (code) => reject(new Error(`the collector exited (${code}) before it was ready:\n${out}`)));
  });
  return { port, file, proc, log: () => out };
}

/** OTLP JSON's span, as the collector's file exporter writes it. */
interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  kind?: number;
  startTimeUnixNano: string;
  endTimeUnixNano: string;
  attributes?: { key: string; value: Record<string, unknown> }[];
  status?: { code?: number };
  service: string;
}

function readSpans(text: string): OtlpSpan[] {
  const spans: OtlpSpan[] = [];
  for (const line of text.split('\n').filter(Boolean)) {
    const batch = JSON.parse(line) as { resourceSpans: { resource: { attributes: OtlpSpan['attributes'] }; scopeSpans: { spans: Omit<OtlpSpan, 'service'>[] }[] }[] };
    for (const rs of batch.resourceSpans) {
      const service = String(rs.resource.attributes?.find((a) => a.key === 'service.name')?.value['stringValue']);
      for (const ss of rs.scopeSpans) for (const s of ss.spans) spans.push({ ...s, service });
    }
  }
  return spans;
}

/** An attribute's value as JS: OTLP JSON carries int64 as a string, arrays as {values: [...]}. */
function attr(span: OtlpSpan, key: string): unknown {
  const v = span.attributes?.find((a) => a.key === key)?.value;
  if (!v) return undefined;
  if ('stringValue' in v) return v['stringValue'];
  if ('intValue' in v) return Number(v['intValue']);
  if ('doubleValue' in v) return v['doubleValue'];
  if ('boolValue' in v) return v['boolValue'];
  if ('arrayValue' in v) return ((v['arrayValue'] as { values?: Record<string, unknown>[] }).values ?? []).map((x) => Object.values(x)[0]);
  return v;
}

function post(port: number, route: string, body: unknown, headers: Record<string, string> = {}): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: Record<string, unknown> }> {
  return postRaw(port, route, body, headers).then((r) => ({ ...r, body: JSON.parse(r.text) as Record<string, unknown> }));
}

function postRaw(port: number, route: string, body: unknown, headers: Record<string, string> = {}): Promise<{ status: number; headers: http.IncomingHttpHeaders; text: string }> {
  const data = Buffer.from(JSON.stringify(body));
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: route, headers: { 'content-type': 'application/json', 'content-length': data.length, ...headers } }, (res) => {
      let s = '';
      res.on('data', (c: Buffer) => (s += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text: s }));
    });
    req.on('error', reject);
    req.end(data);
  });
}

/** The spans the collector wrote, once one carries `requestId` (a minute at most, a loaded machine): all of them, and that root. */
async function traceOf(collector: Collector, requestId: string): Promise<{ spans: OtlpSpan[]; root: OtlpSpan }> {
  let spans: OtlpSpan[] = [];
  for (const t0 = Date.now(); Date.now() - t0 < 60_000; await new Promise((r) => setTimeout(r, 100))) {
    spans = readSpans(await readFile(collector.file, 'utf8').catch(() => ''));
    const root = spans.find((s) => attr(s, 'ragguard.request_id') === requestId);
    if (root) return { spans, root };
  }
  assert.fail(`no span with the request id ${requestId} reached the collector; it holds ${spans.map((s) => s.name).join(', ') || 'nothing'}\n${collector.log()}`);
}

describe('traces in a real OpenTelemetry Collector', () => {
  let collector: Collector | undefined;
  after(() => {
    collector?.proc.kill('SIGTERM');
  });

  test('one POST /query: a root span with the request id, route and status, and a child span per stage', async (t) => {
    if (unavailable) return t.skip(unavailable);
    collector = await startCollector();
    const server = await startServer({
      RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(3),
      OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${collector.port}`, OTEL_SERVICE_NAME: 'ragguard-trace-test',
      // Far beyond the test: the spans can only reach the collector through the flush on shutdown.
      OTEL_BSP_SCHEDULE_DELAY: '600000',
    });
    let code: number | null;
    let reply: Awaited<ReturnType<typeof post>>;
    try {
      assert.match(server.log(), /OpenTelemetry traces on/);
      reply = await post(server.port, '/query', { query: 'How do I set disk quotas for a user?', max_new_tokens: 8, seed: 1 }, { 'X-Request-Id': 'trace-test-1' });
      assert.equal(reply.status, 200, JSON.stringify(reply.body));
      assert.equal(reply.headers['x-request-id'], 'trace-test-1');
    } finally {
      server.proc.kill('SIGTERM');
      code = await server.exited;
    }
    assert.equal(code, 0, server.log());
    assert.doesNotMatch(server.log(), /could not export the last spans/);

    // The file exporter writes every 100 ms.
    const { spans, root } = await traceOf(collector, 'trace-test-1');
    assert.equal(root.name, 'POST /query');
    assert.equal(root.parentSpanId ?? '', '', 'the request span is a root');
    assert.equal(root.kind, 2, 'SERVER');
    assert.equal(root.service, 'ragguard-trace-test');
    assert.equal(attr(root, 'http.request.method'), 'POST');
    assert.equal(attr(root, 'http.route'), '/query');
    assert.equal(attr(root, 'http.response.status_code'), 200);

    const trace = spans.filter((s) => s.traceId === root.traceId);
    const one = (name: string) => {
      const found = trace.filter((s) => s.name === name);
      assert.equal(found.length, 1, `spans named ${name} in the request's trace: ${trace.map((s) => s.name).join(', ')}`);
      return found[0]!;
    };
    const stages = ['admission', 'embed', 'search', 'rerank', 'prompt', 'generate'].map(one);
    for (const s of stages) assert.equal(s.parentSpanId, root.spanId, `${s.name} is a child of the request`);
    const [admission, embed, search, rerank, prompt, generate] = stages as [OtlpSpan, OtlpSpan, OtlpSpan, OtlpSpan, OtlpSpan, OtlpSpan];
    const prefill = one('prefill');
    const decode = one('decode');
    assert.equal(prefill.parentSpanId, generate.spanId, 'prefill is a child of generate');
    assert.equal(decode.parentSpanId, generate.spanId, 'decode is a child of generate');
    assert.equal(trace.length, 9, `the request's trace: ${trace.map((s) => s.name).join(', ')}`);

    // The guard's decision and what it reshaped (nothing, at this size).
    assert.ok(['admit', 'queue'].includes(String(attr(admission, 'ragguard.guard.decision'))));
    assert.deepEqual(attr(admission, 'ragguard.guard.reshaped'), []);
    assert.ok(Number(attr(admission, 'ragguard.guard.predicted_bytes')) > 0);
    // What the stages did, as the reply says it.
    const retrieval = reply.body['retrieval'] as { hits: number; reranked: number; in_prompt: number };
    const usage = reply.body['usage'] as { prompt_tokens: number; completion_tokens: number };
    assert.equal(attr(search, 'ragguard.hits'), retrieval.hits);
    assert.equal(attr(prompt, 'ragguard.prompt.tokens'), usage.prompt_tokens);
    assert.equal(attr(prompt, 'ragguard.prompt.chunks'), retrieval.in_prompt);
    assert.equal(attr(prefill, 'gen_ai.usage.input_tokens'), usage.prompt_tokens);
    assert.equal(attr(decode, 'gen_ai.usage.output_tokens'), usage.completion_tokens);
    assert.deepEqual(attr(decode, 'gen_ai.response.finish_reasons'), [reply.body['finish_reason']]);
    assert.ok(Number(attr(rerank, 'ragguard.rerank.pairs')) > 0);

    // In order, inside the request: admission, then embed, search, rerank, prompt, generate (prefill, then decode).
    // Within 2 ms: the SDK takes a span's start from Date.now() (whole milliseconds) and its end from the
    // monotonic clock after it, so two spans' times may differ from their true order by under a millisecond.
    const SLACK = 2_000_000n;
    const at = (s: OtlpSpan, end = false) => BigInt(end ? s.endTimeUnixNano : s.startTimeUnixNano);
    const notAfter = (a: bigint, b: bigint) => a <= b + SLACK;
    const inOrder = [admission, embed, search, rerank, prompt, generate];
    for (let i = 1; i < inOrder.length; i++) assert.ok(notAfter(at(inOrder[i - 1]!, true), at(inOrder[i]!)), `${inOrder[i - 1]!.name} ends before ${inOrder[i]!.name} starts`);
    assert.ok(notAfter(at(generate), at(prefill)) && notAfter(at(prefill, true), at(decode)) && notAfter(at(decode, true), at(generate, true)), 'prefill then decode, inside generate');
    assert.ok(notAfter(at(root), at(admission)) && notAfter(at(generate, true), at(root, true)), 'every stage inside the request');
    for (const s of trace) assert.notEqual(s.status?.code, 2, `${s.name} is not an error`);
  });

  test('in process, a reshaped and streamed query: the admission span names what the guard reshaped; the stream has the same spans', async (t) => {
    if (unavailable) return t.skip(unavailable);
    collector ??= await startCollector();
    const service = await RagService.start(testConfig({ RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, ['apt-cache', 'quotas', 'ipv6']) }));
    // The same models and index under a budget whose workspace fits the reranker only in batches of 4 (guard.test.ts).
    const asked = { query: 'How do I set disk quotas for a user?', top_k: 40, rerank_top_n: 2, max_new_tokens: 8, stream: true };
    const shape = { ...service.requestShape({ query: asked.query, topK: 40, rerankTopN: 2, maxNewTokens: 8, temperature: 0 }), promptTokens: 128 };
    const room = service.guard.model.predict({ ...shape, rerankBatch: 4 }).reserveBytes;
    const fixed = service.weightBytes + service.adapterSlotBytes + service.store.indexBytes + service.engine.pool.bytes + service.allocatorWarmBytes;
    const cfg = { ...service.cfg, memoryBudget: { bytes: fixed + room }, kvCacheBytes: service.engine.pool.bytes, promptBudgetTokens: 128 };
    const tight = new RagService(cfg, service.models, service.store);
    tight.guard.model.calibrate(service.guard.model.calibration, service.guard.model.headroom);

    assert.equal(await startTracing({ otlpTracesEndpoint: `http://127.0.0.1:${collector.port}/v1/traces`, serviceName: 'ragguard-in-process' }), true);
    const server = http.createServer(traceRequests(createApp(tight)));
    try {
      await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
      const reply = await postRaw((server.address() as net.AddressInfo).port, '/query', asked, { 'X-Request-Id': 'trace-test-2' });
      assert.equal(reply.status, 200, reply.text);
      const done = JSON.parse(sseEvents(reply.text).find(([e]) => e === 'done')![1]) as { guard: { reshaped: unknown }; usage: { completion_tokens: number } };
      assert.deepEqual(done.guard.reshaped, [{ field: 'rerank_batch', from: 16, to: 4 }]);
      // A generation without retrieval (an OpenAI route): admission, then the engine's spans under the request.
      const completion = await post((server.address() as net.AddressInfo).port, '/v1/completions', { model: 'decoder-gqa', prompt: 'apt-get', max_tokens: 4 },
        // A caller's W3C trace context: the request's span continues its trace.
        { 'X-Request-Id': 'trace-test-3', traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01' });
      assert.equal(completion.status, 200, JSON.stringify(completion.body));
      await new Promise((r) => server.close(r));
      await stopTracing();
      assert.equal(tracingOn(), false);

      const { spans, root } = await traceOf(collector, 'trace-test-2');
      assert.equal(root.name, 'POST /query');
      assert.equal(root.service, 'ragguard-in-process');
      assert.equal(attr(root, 'http.response.status_code'), 200);
      const trace = spans.filter((s) => s.traceId === root.traceId);
      assert.deepEqual(trace.map((s) => s.name).sort(), ['POST /query', 'admission', 'decode', 'embed', 'generate', 'prefill', 'prompt', 'rerank', 'search']);
      const named = (n: string) => trace.find((s) => s.name === n)!;
      for (const n of ['admission', 'embed', 'search', 'rerank', 'prompt', 'generate']) assert.equal(named(n).parentSpanId, root.spanId, n);
      for (const n of ['prefill', 'decode']) assert.equal(named(n).parentSpanId, named('generate').spanId, n);
      assert.equal(attr(named('admission'), 'ragguard.guard.decision'), 'admit');
      assert.deepEqual(attr(named('admission'), 'ragguard.guard.reshaped'), ['rerank_batch:16->4']);
      assert.equal(attr(named('rerank'), 'ragguard.rerank.batch'), 4);
      assert.equal(attr(named('decode'), 'gen_ai.usage.output_tokens'), done.usage.completion_tokens);

      const v1 = await traceOf(collector, 'trace-test-3');
      assert.equal(v1.root.name, 'POST /v1/completions');
      assert.equal(v1.root.traceId, '0af7651916cd43dd8448eb211c80319c');
      assert.equal(v1.root.parentSpanId, 'b7ad6b7169203331');
      assert.equal(v1.root.kind, 2, 'SERVER');
      const v1Trace = v1.spans.filter((x) => x.traceId === v1.root.traceId);
      assert.deepEqual(v1Trace.map((x) => x.name).sort(), ['POST /v1/completions', 'admission', 'decode', 'prefill']);
      for (const x of v1Trace.filter((y) => y !== v1.root)) assert.equal(x.parentSpanId, v1.root.spanId, x.name);
      const usage = completion.body['usage'] as { completion_tokens: number };
      assert.equal(attr(v1Trace.find((x) => x.name === 'decode')!, 'gen_ai.usage.output_tokens'), usage.completion_tokens);
    } finally {
      server.close();
      await stopTracing();
      await service.close();
    }
  });
});
