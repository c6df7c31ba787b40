/**
 * Overload on loopback: does the server stay responsive, shed load promptly, and stop work its
 * clients abandoned?
 *
 * The server runs as its own process (`scripts/tuned.sh node --import tsx src/cli/serve.ts`, as
 * `npm start` runs it, on a fresh index of the sample corpus), so that the clients here keep their own
 * event loop and clock. Two phases, each bounded in count and time:
 *   burst    BENCH_OVERLOAD_BURST (200) queries sent at once; meanwhile GET /healthz one after the
 *            other. Figures: /healthz latency (p50, p99, max; goal < 100 ms), the time from sending
 *            each query to its 503 queue_full reply (goal < 100 ms), statuses and error codes, and
 *            unclear replies (goal 0): a reply other than 200 with {answer}, or an error without
 *            {error: {code, message}}, a 503 without Retry-After, a reset socket or no reply by the end.
 *   hang-up  BENCH_OVERLOAD_HANGUPS (64) queries whose clients close the connection after
 *            BENCH_OVERLOAD_HANGUP_MS (300 ms). Figures: seconds from the hang-up until /healthz says
 *            the server is idle (nothing running or waiting, no KV block in use; goal < 1 s), and the
 *            server's CPU seconds over that time (/proc/<pid>/stat).
 * Queries ask BENCH_OVERLOAD_NEW_TOKENS (16) new tokens (bounded run time on 2 cores); the server's
 * admission limits are its defaults unless set in the environment. Last line: JSON.
 */
import { readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import os, { tmpdir } from 'node:os';
import path from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { r1, send as sendTo, summary, type Reply } from './burst-client.js';
import { startServerProcess, type ServerProcess } from './server-process.js';

const ROOT = path.resolve(import.meta.dirname, '..');
const BURST = Number(process.env['BENCH_OVERLOAD_BURST'] ?? 200);
const HANGUPS = Number(process.env['BENCH_OVERLOAD_HANGUPS'] ?? 64);
const HANGUP_MS = Number(process.env['BENCH_OVERLOAD_HANGUP_MS'] ?? 300);
const NEW_TOKENS = Number(process.env['BENCH_OVERLOAD_NEW_TOKENS'] ?? 16);
/** Every phase ends by this deadline whatever happens (replies still missing then count as unclear). */
const PHASE_LIMIT_MS = Number(process.env['BENCH_OVERLOAD_PHASE_LIMIT_S'] ?? 240) * 1000;

const QUESTIONS = [
  'What is the sticky bit used for on /tmp?',
  'How can I stop one particular user from scheduling cron jobs?',
  'How do I set disk quotas for a user?',
  'Where does apt keep its list of package sources?',
  'How do I configure an IPv6 address on an interface?',
  'Which daemon collects system log messages?',
  'How do I back up a Debian system?',
  'How does apt-cache search for a package?',
];

// BENCH_OVERLOAD_INDEX_DIR: an index to reuse (kept), instead of a fresh one ingested at start-up.
const keptIndex = process.env['BENCH_OVERLOAD_INDEX_DIR'];
const indexDir = keptIndex ?? await mkdtemp(path.join(tmpdir(), 'ragguard-bench-overload-'));
let port = 0;
const send = (method: string, route: string, body?: unknown, hangUpAfter?: number) => sendTo(port, method, route, body, hangUpAfter);

/** Why a reply is unclear, or '' when it is a clear one. */
function unclear(r: Reply): string {
  let b: { answer?: unknown; error?: { code?: unknown; message?: unknown } };
  try {
    b = JSON.parse(r.body) as typeof b;
  } catch {
    return `${r.status} without a JSON body`;
  }
  if (r.status === 200) return typeof b.answer === 'string' ? '' : '200 without an answer';
  if (typeof b.error?.code !== 'string' || typeof b.error?.message !== 'string' || b.error.message === '') return `${r.status} without {error: {code, message}}`;
  if (r.status === 503 && !r.headers['retry-after']) return `503 ${b.error.code} without Retry-After`;
  return '';
}

function cpuSeconds(pid: number): number {
  // utime and stime, fields 14 and 15 of /proc/<pid>/stat, in clock ticks (100 per second on Linux).
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return (Number(f[11]) + Number(f[12])) / 100;
}

interface Health {
  queue: { running: number; waiting: number };
  kv: { usedBlocks: number };
}

// --- the server, as npm start runs it ---
// BENCH_OVERLOAD_NODE_FLAGS: extra flags for the server's node (profiling: --cpu-prof --cpu-prof-dir=DIR,
// --trace-gc); the server is then stopped with SIGTERM, so that a profile is written at its exit.
// BENCH_OVERLOAD_SERVER_OUT: a file that gets the server's stdout and stderr.
const nodeFlags = (process.env['BENCH_OVERLOAD_NODE_FLAGS'] ?? '').split(' ').filter(Boolean);
let server: ServerProcess | undefined;
const cleanup = async () => {
  await server?.stop(nodeFlags.length > 0);
  if (!keptIndex) await rm(indexDir, { recursive: true, force: true });
};
try {
  const serverOut = process.env['BENCH_OVERLOAD_SERVER_OUT'];
  server = await startServerProcess({ RAGGUARD_INDEX_DIR: indexDir }, { nodeFlags, ...(serverOut ? { outFile: serverOut } : {}) });
  port = server.port;
  console.log(`server pid ${server.pid} on port ${port} (${server.startS.toFixed(1)} s to start, corpus ingested)`);
  const health = async () => JSON.parse((await send('GET', '/healthz')).body) as Health;
  const query = (i: number) => ({ query: `${QUESTIONS[i % QUESTIONS.length]} (${i})`, max_new_tokens: NEW_TOKENS });

  // --- burst ---
  const tb = performance.now();
  // CLOCK_MONOTONIC, the clock of V8's CPU profiles and of the server's own timestamps there.
  console.log(`burst starts at monotonic ${process.hrtime.bigint() / 1000n} us`);
  const healthMs: number[] = [];
  const healthCallMs: number[] = [];
  const lag = monitorEventLoopDelay({ resolution: 1 });
  lag.enable();
  const slow: string[] = [];
  let burstDone = false;
  const prober = (async () => {
    while (!burstDone) {
      const at = performance.now() - tb;
      const r = await send('GET', '/healthz');
      healthMs.push(r.ms);
      healthCallMs.push(r.callMs);
      if (r.ms > 100) slow.push(`${(at / 1000).toFixed(2)} s: ${Math.round(r.ms)} ms`);
      await new Promise((res) => setTimeout(res, 10));
    }
  })();
  const deadline = new Promise<'deadline'>((res) => setTimeout(() => res('deadline'), PHASE_LIMIT_MS).unref());
  const replies = await Promise.all(Array.from({ length: BURST }, (_, i) =>
    Promise.race([send('POST', '/query', query(i)).catch((e: Error) => e), deadline])));
  burstDone = true;
  await prober;
  lag.disable();
  const burstS = (performance.now() - tb) / 1000;
  const statuses: Record<string, number> = {};
  const codes: Record<string, number> = {};
  const queueFullMs: number[] = [];
  const queueFullCallMs: number[] = [];
  const unclearWhy: string[] = [];
  for (const r of replies) {
    if (r === 'deadline' || r instanceof Error) {
      const k = r === 'deadline' ? 'no reply' : `socket: ${r.message}`;
      statuses[k] = (statuses[k] ?? 0) + 1;
      unclearWhy.push(k);
      continue;
    }
    statuses[r.status] = (statuses[r.status] ?? 0) + 1;
    const why = unclear(r);
    if (why) unclearWhy.push(why);
    if (r.status !== 200 && !why) {
      const code = (JSON.parse(r.body) as { error: { code: string } }).error.code;
      codes[code] = (codes[code] ?? 0) + 1;
      if (code === 'queue_full') {
        queueFullMs.push(r.ms);
        queueFullCallMs.push(r.callMs);
      }
    }
  }
  console.log(`burst of ${BURST}: ${burstS.toFixed(1)} s; statuses ${JSON.stringify(statuses)}, codes ${JSON.stringify(codes)}`);
  console.log(`  /healthz during the burst (ms): ${JSON.stringify(summary(healthMs))}`);
  console.log(`  send -> 503 queue_full (ms): ${JSON.stringify(summary(queueFullMs))}; from the call: ${JSON.stringify(summary(queueFullCallMs))}`);
  console.log(`  the client's own event loop: largest delay ${r1(lag.max / 1e6)} ms`);
  if (slow.length) console.log(`  /healthz probes over 100 ms (sent at, latency): ${slow.slice(0, 12).join(', ')}${slow.length > 12 ? ', ...' : ''}`);
  if (unclearWhy.length) console.log(`  unclear: ${unclearWhy.slice(0, 5).join('; ')}`);

  // Idle before the next phase.
  for (const until = performance.now() + PHASE_LIMIT_MS; performance.now() < until;) {
    const h = await health();
    if (h.queue.running + h.queue.waiting === 0 && h.kv.usedBlocks === 0) break;
    await new Promise((res) => setTimeout(res, 50));
  }

  // --- hang-ups ---
  const cpu0 = cpuSeconds(server.pid);
  const hung = Array.from({ length: HANGUPS }, (_, i) => send('POST', '/query', query(1000 + i), HANGUP_MS).catch((e: Error) => e));
  await new Promise((res) => setTimeout(res, HANGUP_MS));
  const th = performance.now();
  const early = (await Promise.all(hung)).filter((r) => !(r instanceof Error)).length; // replied before the hang-up
  let idleS = NaN;
  for (const until = performance.now() + PHASE_LIMIT_MS; performance.now() < until;) {
    const h = await health();
    if (h.queue.running + h.queue.waiting === 0 && h.kv.usedBlocks === 0) {
      idleS = (performance.now() - th) / 1000;
      break;
    }
    await new Promise((res) => setTimeout(res, 10));
  }
  const cpuS = cpuSeconds(server.pid) - cpu0;
  console.log(`${HANGUPS} clients hung up after ${HANGUP_MS} ms (${early} had their reply before): idle ${idleS.toFixed(2)} s later, ` +
    `${cpuS.toFixed(2)} CPU-s from their sending to idle`);

  console.log(JSON.stringify({
    bench: 'overload', timing: 'from_write', cpu: os.cpus()[0]?.model, cores: os.cpus().length, new_tokens: NEW_TOKENS,
    // The machine's load average when the bench ended: on a shared machine, other processes' share of the cores.
    loadavg: os.loadavg().map(r1),
    burst: {
      queries: BURST, seconds: r1(burstS), statuses, codes, unclear: unclearWhy.length,
      healthz_ms: summary(healthMs), queue_full_ms: summary(queueFullMs),
      // The figures' definition before 2026-12-04 (burst-client.ts): from the call that made the request.
      healthz_ms_from_call: summary(healthCallMs), queue_full_ms_from_call: summary(queueFullCallMs),
      client_loop_delay_max_ms: r1(lag.max / 1e6),
    },
    hangup: { clients: HANGUPS, after_ms: HANGUP_MS, replied_before: early, idle_after_s: Math.round(idleS * 1000) / 1000, cpu_s: r1(cpuS) },
  }));
} finally {
  await cleanup();
}
