/** Shared test fixtures: configuration on a temporary index, a small slice of the shipped corpus. */
import { FaissStore } from '../src/retrieval/faiss-store.js';
import type { RetrievalStore } from '../src/retrieval/retrieval-store.js';
import { spawn, type ChildProcess } from 'node:child_process';
import { copyFile, mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after } from 'node:test';
import { loadConfig, type Config } from '../src/config/config.js';
import { createServer, type AddressInfo } from 'node:net';
import type { RagService } from '../src/service/rag.js';
import { gatedRun } from '../src/runtime/run-gate.js';

export const ROOT = path.resolve(import.meta.dirname, '..');
export const CORPUS = path.join(ROOT, 'data', 'corpus');
/** The 0.5B decoder setup fetches beside the default 1.5B: the tests written about its adapters and template name it. */
export const QWEN_05B_GGUF = path.join(ROOT, 'models', 'pretrained', 'Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf');

const dirs: string[] = [];
after(async () => {
  await Promise.all(dirs.map((d) => rm(d, { recursive: true, force: true })));
});

export async function tempDir(prefix = 'ragguard-test-'): Promise<string> {
  const d = await mkdtemp(path.join(tmpdir(), prefix));
  dirs.push(d);
  return d;
}

/** A corpus directory holding the first `n` documents of the shipped corpus (sorted by name). */
export async function smallCorpus(n: number, names?: string[]): Promise<string> {
  const dir = await tempDir('ragguard-corpus-');
  const all = (await readdir(CORPUS)).filter((f) => f.endsWith('.txt')).sort();
  const pick = names ? names.map((x) => `${x}.txt`) : all.slice(0, n);
  await Promise.all(pick.map((f) => copyFile(path.join(CORPUS, f), path.join(dir, f))));
  return dir;
}

/**
 * The tests' models, for in-process services and spawned servers alike: the small self-trained
 * embedder and decoder (fast, and in git or built from it; the default pretrained ones come with setup)
 * and the reranker on (off by default), so that the tests cover the whole pipeline and its memory guard;
 * whole chunks in /query prompts (RAGGUARD_CONTEXT_SENTENCES=0), as the tests' prompts and budgets were
 * written for (the default's 2 sentences a chunk is tuned for the default decoder: test/focus.test.ts and
 * test/default-start.test.ts cover it).
 */
export const TEST_ENV: Readonly<Record<string, string>> = {
  RAGGUARD_EMBEDDER: 'models/embedder', RAGGUARD_DECODER: 'models/decoder-gqa', RAGGUARD_RERANK: 'true', RAGGUARD_CONTEXT_SENTENCES: '0',
};

export function testConfig(env: Record<string, string> = {}): Config {
  return loadConfig({ PORT: '0', ...TEST_ENV, ...env });
}

/** One turn of the event loop (setImmediate): what a test awaits to let I/O and timers run, never a clock. */
/** A deterministic generator (xorshift32), uniform in [0, 1), so a failure repeats. */
export function xorshift(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    return s / 2 ** 32;
  };
}

export const turn = () => new Promise<void>((r) => setImmediate(r));

/** Holds the run gate until release(): every model run queued behind it waits. Resolves once held. */
export async function holdRuns(): Promise<() => void> {
  let release!: () => void;
  let held!: () => void;
  const isHeld = new Promise<void>((r) => (held = r));
  void gatedRun(() => {
    held();
    return new Promise<void>((r) => (release = r));
  });
  await isHeld;
  return release;
}

/** A spawned server, ready. */
export interface Server {
  proc: ChildProcess;
  port: number;
  /** Everything it printed so far. */
  log(): string;
  exited: Promise<number | null>;
}

/**
 * The server as a process on the test models and a free port, resolved once it reports ready:
 * src/cli/serve.ts under node, or `npm start` (`npm`: as an operator starts it, signals included).
 */
export async function startServer(env: Record<string, string>, npm = false): Promise<Server> {
  const fullEnv = { ...process.env, ...TEST_ENV, PORT: '0', RAGGUARD_PROFILE_RUN: 'false', ...env };
  const proc = npm
    ? spawn('npm', ['start', '--silent'], { cwd: ROOT, env: fullEnv, stdio: ['ignore', 'pipe', 'pipe'] })
    : spawn(process.execPath, ['--import', 'tsx', 'src/cli/serve.ts'], { cwd: ROOT, env: fullEnv, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  proc.stdout!.on('data', (c: Buffer) => (out += c.toString()));
  proc.stderr!.on('data', (c: Buffer) => (out += c.toString()));
  const exited = new Promise<number | null>((resolve) => proc.on('exit', (code) => resolve(code)));
  const port = await new Promise<number>((resolve, reject) => {
    const look = () => {
      const m = /ready on http:\/\/[^:]+:(\d+)/.exec(out);
      if (m) resolve(Number(m[1]));
    };
    proc.stdout!.on('data', look);
    void exited.then((code) => reject(new Error(`server exited (${code}) before it was ready:\n${out}`)));
  });
  return { proc, port, log: () => out, exited };
}

/** The service's store as the embedded one (what TEST_ENV's services open), for tests that read it directly. */
export function faiss(s: { store: RetrievalStore }): FaissStore {
  if (!(s.store instanceof FaissStore)) throw new Error(`the service's store is ${s.store.kind}, not faiss`);
  return s.store;
}

/** Server-sent events of a body, as [event name or undefined, data] pairs (data lines joined). */
export function sseEvents(text: string): [string | undefined, string][] {
  return text.split('\n\n').filter((b) => b.trim() !== '').map((block) => {
    let event: string | undefined;
    let data = '';
    for (const line of block.split('\n')) {
      if (line.startsWith('event: ')) event = line.slice(7);
      else if (line.startsWith('data: ')) data += line.slice(6);
    }
    return [event, data];
  });
}

/**
 * A request to a test server on loopback: `key` as a bearer token where given, `body` as JSON where given.
 * Its status, headers, text, and the text parsed as JSON ({} where it is not: a stream, Prometheus text).
 */
export async function callJson(base: string, key: string | undefined, method: string, route: string, body?: unknown) {
  const res = await fetch(`${base}${route}`, {
    method,
    headers: { ...(key ? { authorization: `Bearer ${key}` } : {}), ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const text = await res.text();
  let parsed: Record<string, any> = {};
  try {
    parsed = JSON.parse(text) as Record<string, any>;
  } catch { /* not JSON */ }
  return { status: res.status, headers: res.headers, body: parsed, text };
}

/**
 * The service's app on loopback (silent logs): its base URL, and a close that ends open connections, the
 * server and the service.
 */
export async function serveApp(service: RagService): Promise<{ base: string; close: () => Promise<void> }> {
  // Imported here: most tests that use these helpers never load the server.
  const [{ createApp }, { createLogger }] = await Promise.all([import('../src/server/app.js'), import('../src/server/logging.js')]);
  const server = createApp(service, { logger: createLogger('silent') }).listen(0, '127.0.0.1');
  await new Promise((r) => server.once('listening', r));
  return {
    base: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: async () => {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
      await service.close();
    },
  };
}

/** A port free on loopback now (the OS's pick), for a process a test starts (a collector, a pooler). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address() as AddressInfo;
      s.close(() => resolve(port));
    });
  });
}
