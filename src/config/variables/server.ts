/** The server: concurrency and its queue, keys, CORS, logging, connections, shutdown and threads (config.ts: VARIABLES, in the README's order). */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { parseKeysFile } from '../keys-file.js';
import { int, str, bool, oneOf, rel, apiKey, type Variable } from './parse.js';

/** Where the HTTP server listens (first in the table). */
export const LISTEN_VARIABLES: readonly Variable[] = [
  { name: 'HOST', default: '127.0.0.1', doc: 'Address the HTTP server listens on.', apply: str((c, v) => (c.host = v)) },
  { name: 'PORT', default: '8080', doc: 'TCP port (0 = any free port).', apply: int(0, 65535, (c, v) => (c.port = v)) },
];

export const SERVER_VARIABLES: readonly Variable[] = [
  {
    name: 'RAGGUARD_MAX_CONCURRENT', default: '32', doc: 'Queries in flight at once; the rest wait in the queue.',
    apply: int(1, 1024, (c, v) => (c.maxConcurrentQueries = v)),
  },
  {
    name: 'RAGGUARD_QUEUE_LENGTH', default: '64', doc: 'Queries that may wait; beyond it: 503 with Retry-After.',
    apply: int(0, 100000, (c, v) => (c.maxQueueLength = v)),
  },
  {
    name: 'RAGGUARD_QUEUE_TIMEOUT_MS', default: '30000', doc: 'Longest wait in the queue before 503.',
    apply: int(1, 3600000, (c, v) => (c.queueTimeoutMs = v)),
  },
  {
    name: 'RAGGUARD_API_KEY', default: '',
    doc: "Bearer key every route but health and readiness needs (`Authorization: Bearer <key>`); '' = no key needed. At least 8 characters, no whitespace.",
    apply: str((c, v) => (c.apiKey = apiKey(v)), true),
  },
  {
    name: 'RAGGUARD_ADMIN_KEY', default: '',
    doc: "Bearer key that document writes (POST, PUT, DELETE /documents) and /debug/* need (the API key there is 403); it opens every other route too. '' = those routes take the API key.",
    apply: str((c, v) => (c.adminKey = apiKey(v)), true),
  },
  {
    name: 'RAGGUARD_KEYS_FILE', default: '',
    doc: "JSON file of API keys, each scoped to collections with its own request and token limits per minute (README: Authentication); '' = none. Read at start-up: a bad entry stops the start, naming it. Works beside RAGGUARD_API_KEY and RAGGUARD_ADMIN_KEY (both keep every collection).",
    apply: (c, raw) => {
      c.keysFile = raw.trim() === '' ? '' : rel(raw.trim());
      c.keys = [];
      if (c.keysFile === '') return;
      let text: string;
      try {
        text = readFileSync(c.keysFile, 'utf8');
      } catch (e) {
        throw new Error(`cannot read ${c.keysFile}: ${(e as Error).message}`);
      }
      try {
        c.keys = parseKeysFile(text, (k) => createHash('sha256').update(k).digest('hex'));
      } catch (e) {
        throw new Error(`${c.keysFile}: ${(e as Error).message}`);
      }
    },
  },
  {
    name: 'RAGGUARD_CORS_ORIGINS', default: '',
    doc: "Comma-separated origins (e.g. 'https://app.example.com') allowed to call from a browser, or '*'; '' = CORS off (no CORS headers).",
    apply: (c, raw) => {
      const list = raw.split(',').map((x) => x.trim()).filter(Boolean);
      const bad = list.filter((o) => o !== '*' && !/^https?:\/\/[A-Za-z0-9.-]+(:\d{1,5})?$/.test(o));
      if (bad.length) throw new Error(`expected '*' or origins like https://host[:port], got '${bad.join("', '")}'`);
      c.corsOrigins = list.includes('*') ? ['*'] : list;
    },
  },
  {
    name: 'RAGGUARD_LOG_LEVEL', default: 'info', doc: 'JSON log level (pino): fatal, error, warn, info, debug, trace or silent.',
    apply: oneOf(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const, (c, v) => (c.logLevel = v)),
  },
  {
    name: 'RAGGUARD_KEEPALIVE_TIMEOUT_MS', default: '65000',
    doc: "How long an idle keep-alive connection stays open. Longer than a router's or load balancer's own idle timeout (HAProxy's idle server connections, an ALB's 60 s), so that the router closes an idle connection first: closed by the server (Node's default is 5 s) just as the router reuses it, the request fails and is retried, with HAProxy's redispatch on another replica (its prefix cache lost).",
    apply: int(1000, 290000, (c, v) => (c.keepAliveTimeoutMs = v)),
  },
  {
    name: 'RAGGUARD_SHUTDOWN_GRACE_MS', default: '10000',
    doc: 'On SIGTERM or SIGINT the server stops admitting (503 shutting_down with Retry-After, GET /readyz 503) and gives requests in flight this long to finish; the rest are stopped at their next step and answered 503 shutting_down. Exit code 0 only when none was stopped (3 otherwise).',
    apply: int(0, 3600000, (c, v) => (c.shutdownGraceMs = v)),
  },
  {
    name: 'RAGGUARD_WORKER_NICE', default: '0',
    doc: 'Linux: the nice value (0-19) given at start-up to every thread of the server but the event loop\'s (model runs, ONNX Runtime\'s intra-op pools, libuv\'s and V8\'s helpers), so that the event loop (probes, load-shedding 503s) gets a core first when the cores are contended. 0 leaves them as they are.',
    apply: int(0, 19, (c, v) => (c.workerThreadNice = v)),
  },
  {
    name: 'RAGGUARD_INTRA_OP_THREADS', default: '0',
    doc: 'Threads each CPU model run computes with, the calling one included (ONNX Runtime\'s intra-op threads; 0 = its default, one per physical core). Fewer leave a core to the event loop while models run, at the cost of each run\'s speed.',
    apply: int(0, 256, (c, v) => (c.intraOpThreads = v)),
  },
  {
    name: 'RAGGUARD_INTRA_OP_SPIN', default: 'runs',
    doc: 'How the intra-op threads of CPU model runs (through the C API) wait for work: runs, they spin while a run goes on and sleep at its end (ONNX Runtime\'s allow_spinning with force_spinning_stop), so that a decode step does not put them to sleep and wake them between every two of its nodes; off, they always sleep. Between runs they sleep either way, leaving the core to the event loop.',
    apply: oneOf(['off', 'runs'] as const, (c, v) => (c.intraOpSpin = v)),
  },
  {
    name: 'RAGGUARD_WARMUP', default: 'true',
    doc: 'Before it reports ready (GET /readyz 200), the server sends itself one query (1 new token, request id warmup) over loopback, so that every request path\'s code is compiled before the first client: a fresh server\'s first burst was otherwise about twice as slow to shed as its second.',
    apply: bool((c, v) => (c.warmup = v)),
  },
];
