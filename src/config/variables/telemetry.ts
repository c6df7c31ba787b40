/** OpenTelemetry traces (config.ts: VARIABLES, in the README's order). */
import { str, httpUrl, type Variable } from './parse.js';

export const TELEMETRY_VARIABLES: readonly Variable[] = [
  {
    name: 'OTEL_EXPORTER_OTLP_ENDPOINT', default: '',
    doc: "OpenTelemetry traces (runtime/tracing.ts, docs/observability.md): the OTLP/HTTP base URL of a collector (e.g. http://127.0.0.1:4318); spans are POSTed to its /v1/traces in OTLP/HTTP's JSON encoding (the SDK's @opentelemetry/exporter-trace-otlp-http). A span per request (its id, route and status) and one per stage: admission (the guard's decision), embed, search, rerank, prompt, generate, prefill and decode. '' with OTEL_EXPORTER_OTLP_TRACES_ENDPOINT '' = tracing off: the SDK is not loaded and every span is the API's no-op. The exporter's other OTEL_EXPORTER_OTLP_* variables (headers, timeout, compression) are read by the SDK itself.",
    apply: (c, raw) => {
      c.otlpEndpoint = raw === '' ? '' : httpUrl(raw);
      c.otlpTracesEndpoint = c.otlpEndpoint === '' ? '' : `${c.otlpEndpoint.replace(/\/+$/, '')}/v1/traces`;
    },
  },
  {
    name: 'OTEL_EXPORTER_OTLP_TRACES_ENDPOINT', default: '',
    doc: "The OTLP/HTTP URL spans are POSTed to, as it is (e.g. http://127.0.0.1:4318/v1/traces); set, it wins over OTEL_EXPORTER_OTLP_ENDPOINT, and turns tracing on by itself.",
    apply: (c, raw) => {
      if (raw !== '') c.otlpTracesEndpoint = httpUrl(raw);
    },
  },
  {
    name: 'OTEL_SERVICE_NAME', default: 'ragguard',
    doc: "The service.name of the spans' resource (where tracing is on): what a trace viewer lists them under.",
    apply: str((c, v) => (c.serviceName = v.trim())),
  },
];
