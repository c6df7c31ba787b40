/**
 * Soak: does the server's memory stay put under steady mixed load, as an operator runs it for hours?
 *
 * The server runs as its own process (`scripts/tuned.sh node --import tsx src/cli/serve.ts`, as `npm
 * start` runs it; default configuration, on a copy of BENCH_SOAK_INDEX_DIR's snapshot or a fresh index of
 * the sample corpus). For BENCH_SOAK_MINUTES (60) minutes, BENCH_SOAK_CLIENTS (4) clients send requests
 * one after another, each drawn in turn from: /query greedy, /query sampled (temperature 0.8, top_p 0.9,
 * a seed), a grounded chat (/v1/chat/completions with `rag`), and, where the server lists adapters,
 * /query naming one; meanwhile a new document is ingested every BENCH_SOAK_INGEST_S (30) seconds.
 *
 * Every minute: the server's resident memory (/proc/<pid>/status VmRSS) and /debug/memory (components,
 * native memory by holder, the expected growth, the leak checks' verdicts). At the end: the slope
 * of resident memory after the first BENCH_SOAK_SKIP_MINUTES (5) minutes, as it is and less the expected
 * growth (the store's predicted bytes, the KV pool's blocks as first used, the allocator's warm cache) (Theil-Sen over the per-minute readings; goal: under 1 MiB a minute), the components
 * at start and end, the verdicts, and the requests by status. Bounded: every request has a timeout, the
 * run stops at its deadline. Last line: JSON.
 */
import { cpSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import os, { tmpdir } from 'node:os';
import path from 'node:path';
import { theilSen } from '../src/guards/growth.js';
import { procStatusBytes } from '../src/guards/peak-meter.js';
import { startServerProcess, type ServerProcess } from './server-process.js';

const ROOT = path.resolve(import.meta.dirname, '..');
const MINUTES = Number(process.env['BENCH_SOAK_MINUTES'] ?? 60);
const CLIENTS = Number(process.env['BENCH_SOAK_CLIENTS'] ?? 4);
const INGEST_S = Number(process.env['BENCH_SOAK_INGEST_S'] ?? 30);
const SKIP = Number(process.env['BENCH_SOAK_SKIP_MINUTES'] ?? 5);
const NEW_TOKENS = Number(process.env['BENCH_SOAK_NEW_TOKENS'] ?? 32);
const MiB = 2 ** 20;

const questions = (JSON.parse(readFileSync(path.join(ROOT, 'data', 'questions.json'), 'utf8')) as { question: string }[]).map((q) => q.question);

const source = process.env['BENCH_SOAK_INDEX_DIR'];
const indexDir = await mkdtemp(path.join(tmpdir(), 'ragguard-bench-soak-'));
if (source) cpSync(source, indexDir, { recursive: true });

async function call(port: number, method: string, route: string, body?: unknown): Promise<{ status: number; json: unknown }> {
  const r = await fetch(`http://127.0.0.1:${port}${route}`, {
    method, headers: body ? { 'content-type': 'application/json' } : {}, body: body ? JSON.stringify(body) : undefined,
    signal: AbortSignal.timeout(300_000),
  });
  const text = await r.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = text;
  }
  return { status: r.status, json };
}

/** The server's own process (tuned.sh execs node, so the child's pid is the server's). */
function rssOf(pid: number): number {
  return procStatusBytes(['VmRSS'], pid).VmRSS;
}

interface Memory {
  components: { name: string; bytes: number }[];
  native: Record<string, unknown> & { store_predicted_bytes: number; expected_growth_bytes: number };
  trend: { verdict: string; flagged: boolean; rss_slope_bytes_per_min: number };
  growth: { flagged: boolean };
  process: { rss: number; heap_used: number; external: number };
}

let server: ServerProcess | undefined;
try {
  server = await startServerProcess({ RAGGUARD_INDEX_DIR: indexDir });
  const { port, startS, pid } = server;
  console.log(`server pid ${pid} on port ${port} after ${startS.toFixed(1)} s; soak of ${MINUTES} min, ${CLIENTS} clients, an ingest every ${INGEST_S} s`);
  const models = (await call(port, 'GET', '/v1/models')).json as { data: { id: string; parent: string | null }[] };
  const decoderId = models.data[0]!.id;
  // LoRA adapters are listed with the decoder as their parent (as vLLM lists them).
  const adapters = models.data.filter((m) => m.parent === decoderId).map((m) => m.id);
  const memory = async () => (await call(port, 'GET', '/debug/memory')).json as Memory;
  const first = await memory();

  const t0 = performance.now();
  const deadline = t0 + MINUTES * 60_000;
  const statuses: Record<string, number> = {};
  const kinds: Record<string, number> = {};
  let n = 0;
  const request = (i: number): [string, string, unknown] => {
    const q = questions[i % questions.length]!;
    const kind = ['greedy', 'sampled', 'chat', 'adapter'][i % (adapters.length ? 4 : 3)]!;
    kinds[kind] = (kinds[kind] ?? 0) + 1;
    switch (kind) {
      case 'greedy': return [kind, '/query', { query: q, max_new_tokens: NEW_TOKENS }];
      case 'sampled': return [kind, '/query', { query: q, max_new_tokens: NEW_TOKENS, temperature: 0.8, top_p: 0.9, seed: i }];
      case 'chat': return [kind, '/v1/chat/completions', { model: decoderId, messages: [{ role: 'user', content: q }], max_tokens: NEW_TOKENS, rag: {} }];
      default: return [kind, '/query', { query: q, max_new_tokens: NEW_TOKENS, adapter: adapters[i % adapters.length] }];
    }
  };
  const client = async () => {
    while (performance.now() < deadline) {
      const [kind, route, body] = request(n++);
      const key = await call(port, 'POST', route, body).then((r) => `${kind} ${r.status}`, (e: Error) => `${kind} ${e.name}`);
      statuses[key] = (statuses[key] ?? 0) + 1;
    }
  };
  let ingested = 0;
  const ingester = async () => {
    while (performance.now() + INGEST_S * 1000 < deadline) {
      await new Promise((r) => setTimeout(r, INGEST_S * 1000));
      const k = ingested++;
      // A unique document of about 1.5 KB: sentences that no other document shares.
      const text = Array.from({ length: 12 }, (_, j) => `Soak note ${k}.${j}: the relay station ${k * 31 + j} logs its beacon at ${(k * 7 + j) % 24}:${String((k * 13 + j) % 60).padStart(2, '0')} every day, and its keeper files report ${k}-${j} with the harbour office.`).join(' ');
      const r = await call(port, 'POST', '/documents', { documents: [{ doc_id: `soak-${k}`, title: `Soak note ${k}`, text }] }).catch((e: Error) => ({ status: e.name, json: null }));
      statuses[`ingest ${r.status}`] = (statuses[`ingest ${r.status}`] ?? 0) + 1;
    }
  };
  const minutes: { minute: number; rss_mib: number; adjusted_mib: number; expected_mib: number; store_predicted_mib: number; heap_mib: number; trend: string; requests: number }[] = [];
  const sampler = async () => {
    for (let m = 1; m <= MINUTES; m++) {
      await new Promise((r) => setTimeout(r, Math.max(0, t0 + m * 60_000 - performance.now())));
      const mem = await memory();
      const rss = rssOf(pid);
      minutes.push({
        minute: m, rss_mib: +(rss / MiB).toFixed(1), adjusted_mib: +((rss - mem.native.expected_growth_bytes) / MiB).toFixed(1),
        expected_mib: +(mem.native.expected_growth_bytes / MiB).toFixed(1),
        store_predicted_mib: +(mem.native.store_predicted_bytes / MiB).toFixed(2), heap_mib: +(mem.process.heap_used / MiB).toFixed(1),
        trend: mem.trend.verdict, requests: n,
      });
      console.log(JSON.stringify(minutes.at(-1)));
    }
  };
  await Promise.all([...Array.from({ length: CLIENTS }, client), ingester(), sampler()]);
  const last = await memory();

  const after = minutes.filter((m) => m.minute > SKIP);
  const slope = (key: 'rss_mib' | 'adjusted_mib' | 'heap_mib') => +theilSen(after.map((m) => [m.minute, m[key]] as [number, number])).toFixed(3);
  const components = (m: Memory) => Object.fromEntries(m.components.map((c) => [c.name, c.bytes]));
  const result = {
    bench: 'soak', date: new Date().toISOString(), host: os.hostname(), cpus: os.cpus().length, load: os.loadavg().map((x) => +x.toFixed(2)),
    minutes: MINUTES, clients: CLIENTS, ingest_every_s: INGEST_S, new_tokens: NEW_TOKENS, start_s: +startS.toFixed(1),
    requests: n, kinds, statuses, documents_ingested: ingested, adapters,
    slope_after_minute: SKIP,
    rss_slope_mib_per_min: slope('rss_mib'),
    // Less the expected growth: the store's documents, the KV pool's blocks as first used and the allocator's warm cache (service/rag.ts expectedGrowthBytes).
    rss_less_predicted_slope_mib_per_min: slope('adjusted_mib'),
    heap_slope_mib_per_min: slope('heap_mib'),
    goal_mib_per_min: 1,
    // The goal bounds growth: a falling slope (memory handed back, e.g. by malloc_trim) meets it.
    met: slope('adjusted_mib') < 1,
    rss_mib: { first: minutes[0]?.rss_mib, last: minutes.at(-1)?.rss_mib },
    components: { start: components(first), end: components(last) },
    native: { start: first.native, end: last.native },
    verdicts: { trend: last.trend, window_flagged: last.growth.flagged },
    per_minute: minutes,
  };
  console.log(JSON.stringify(result));
} finally {
  await server?.stop();
  await rm(indexDir, { recursive: true, force: true });
}
