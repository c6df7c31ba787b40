/**
 * Start-up as a user sees it: `npm start` on a fresh index directory (models loaded, the profile run,
 * the sample corpus ingested), then the same server stopped (SIGTERM) and started again on the index it
 * built (the calibration restored from its cache). For each start, seconds from the spawn to the first
 * GET /healthz answered 200, to the first GET /readyz answered 200, and to the first POST /query
 * answered 200: three clients polling from the spawn on, each sending its next request BENCH_STARTUP_POLL_MS
 * (100) after the last reply (or refused connection).
 *
 * The server's settings are its defaults (the default models, RAGGUARD_CORPUS_DIR=data/corpus) unless
 * set in the environment; the index directory is a fresh temporary one (BENCH_STARTUP_INDEX_DIR: a
 * directory to use instead, emptied of nothing: a built index there makes the first start a restart
 * too). A fresh clone also reads its models from a cold disk; here they are in the page cache after
 * the first start (and usually before). No peer is measured: the figures are this server's against its
 * goals (the first /healthz within 5 s of every start; a restart ready within 15 s).
 *
 *   npm run bench:startup            last line: JSON
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import http from 'node:http';
import os, { tmpdir } from 'node:os';
import path from 'node:path';
import { freePort } from './http-client.js';

const ROOT = path.resolve(import.meta.dirname, '..');
const POLL_MS = Number(process.env['BENCH_STARTUP_POLL_MS'] ?? 100);
/** A start that is not ready by then is reported as such (the server is stopped). */
const LIMIT_MS = Number(process.env['BENCH_STARTUP_LIMIT_S'] ?? 3600) * 1000;
const QUERY = { query: 'What is the sticky bit used for on /tmp?', max_new_tokens: 8 };

const keptIndex = process.env['BENCH_STARTUP_INDEX_DIR'];
const work = await mkdtemp(path.join(tmpdir(), 'ragguard-bench-startup-'));
const indexDir = keptIndex ?? path.join(work, 'index');

/** One request; its status, or 0 when no reply came (connection refused, reset). */
function status(port: number, method: string, route: string, body?: unknown): Promise<number> {
  const data = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
  return new Promise((resolve) => {
    const req = http.request({
      host: '127.0.0.1', port, method, path: route, agent: false,
      headers: data ? { 'content-type': 'application/json', 'content-length': data.length } : {},
    }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
      res.on('error', () => resolve(0));
    });
    req.on('error', () => resolve(0));
    req.end(data);
  });
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Seconds from t0 to the first 200 of the request, polled until `stop()` says to give up (then null). */
async function firstOk(t0: number, send: () => Promise<number>, stop: () => boolean): Promise<number | null> {
  while (!stop()) {
    if ((await send()) === 200) return Math.round((performance.now() - t0) / 10) / 100;
    await sleep(POLL_MS);
  }
  return null;
}

interface StartFigures {
  healthz_s: number | null;
  readyz_s: number | null;
  first_query_s: number | null;
  /** What the server's log says each phase took (its "ready" line), in ms. */
  phases_ms?: Record<string, number>;
  calibration?: string;
  documents?: number;
  exit_code: number | null;
}

async function measureStart(label: string): Promise<StartFigures> {
  const port = await freePort();
  const logFile = path.join(work, `${label}.log`);
  const log = createWriteStream(logFile);
  const t0 = performance.now();
  const proc: ChildProcess = spawn('npm', ['start', '--silent'], {
    cwd: ROOT, detached: true, stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, PORT: String(port), HOST: '127.0.0.1', RAGGUARD_INDEX_DIR: indexDir },
  });
  proc.stdout!.pipe(log);
  proc.stderr!.pipe(log);
  let exited = false;
  const exit = new Promise<number | null>((resolve) => proc.on('exit', (code) => {
    exited = true;
    resolve(code);
  }));
  const over = () => exited || performance.now() - t0 > LIMIT_MS;
  const [healthz, readyz, query] = await Promise.all([
    firstOk(t0, () => status(port, 'GET', '/healthz'), over),
    firstOk(t0, () => status(port, 'GET', '/readyz'), over),
    firstOk(t0, () => status(port, 'POST', '/query', QUERY), over),
  ]);
  if (!exited) proc.kill('SIGTERM');
  const killer = setTimeout(() => {
    if (!exited) process.kill(-proc.pid!, 'SIGKILL');
  }, 30_000);
  const code = await exit;
  clearTimeout(killer);
  await new Promise((r) => log.end(r));
  const lines = readFileSync(logFile, 'utf8').split('\n').filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Record<string, unknown>);
  const ready = lines.find((l) => String(l['msg']).startsWith('ragguard ready'));
  const calibration = lines.find((l) => l['cache'] !== undefined || String(l['msg']).startsWith('profile run done'));
  const figures: StartFigures = {
    healthz_s: healthz, readyz_s: readyz, first_query_s: query,
    ...(ready ? { phases_ms: ready['phases_ms'] as Record<string, number>, documents: Number(ready['documents']) } : {}),
    ...(calibration ? { calibration: String(calibration['msg']).slice(0, 160) } : {}),
    exit_code: code,
  };
  console.log(`${label}: ${JSON.stringify(figures)}`);
  if (readyz === null) console.log(`${label}: not ready; the server's log ends:\n${lines.slice(-15).map((l) => JSON.stringify(l).slice(0, 300)).join('\n')}`);
  return figures;
}

const load = os.loadavg();
try {
  const fresh = await measureStart('fresh');
  const restart = await measureStart('restart');
  const goals = {
    healthz_within_5s: [fresh, restart].every((f) => f.healthz_s !== null && f.healthz_s <= 5),
    restart_ready_within_15s: restart.readyz_s !== null && restart.readyz_s <= 15,
  };
  console.log(JSON.stringify({
    bench: 'startup', date: new Date().toISOString(), fresh, restart, goals,
    machine: { cpus: os.cpus().length, cpu: os.cpus()[0]?.model, load_before: load.map((x) => Math.round(x * 100) / 100), load_after: os.loadavg().map((x) => Math.round(x * 100) / 100) },
    settings: Object.fromEntries(Object.entries(process.env).filter(([k]) => k.startsWith('RAGGUARD_'))),
  }));
} finally {
  await rm(work, { recursive: true, force: true });
}
