/**
 * CPU decode against llama.cpp's own HTTP server built for this CPU (scripts/build-llama-server.sh:
 * -DGGML_NATIVE=ON), both over HTTP, in one run: the strongest peer a user of a GGUF on a CPU would
 * reach for.
 *
 *   ragguard      `scripts/tuned.sh node src/server/main.ts` (as npm start), the GGUF as its decoder, an
 *                 empty index; POST /v1/chat/completions
 *   llama-server  the same GGUF, `--parallel BENCH_LLAMA_PARALLEL` (8) slots with continuous batching,
 *                 `--threads BENCH_LLAMA_THREADS` (the core count); POST /v1/chat/completions
 *
 * Both get the same chat messages (questions of data/questions.json), temperature 0, max_tokens
 * BENCH_NEW_TOKENS (64) with `ignore_eos` (each answer exactly that long on both), at 1 and 8 concurrent
 * clients (each sends its next request when the last is answered). Tokens/s = completion tokens over the
 * wall time of the round; BENCH_ROUNDS (2) rounds, the sides interleaved, each side's best.
 *
 * Env: BENCH_GGUF (default models/pretrained/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf), BENCH_REQUESTS
 * (16 at 8 concurrent, 4 at 1), BENCH_LLAMA_SERVER (the binary; default the build script's). Last line:
 * JSON.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import os, { tmpdir } from 'node:os';
import path from 'node:path';

const ROOT = path.resolve(import.meta.dirname, '..');
const GGUF = path.resolve(ROOT, process.env['BENCH_GGUF'] ?? 'models/pretrained/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf');
const NEW_TOKENS = Number(process.env['BENCH_NEW_TOKENS'] ?? 64);
const REQUESTS = Number(process.env['BENCH_REQUESTS'] ?? 16);
const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 2);
const PARALLEL = Number(process.env['BENCH_LLAMA_PARALLEL'] ?? 8);
const THREADS = Number(process.env['BENCH_LLAMA_THREADS'] ?? os.availableParallelism());
const LLAMA = process.env['BENCH_LLAMA_SERVER'] ?? path.join(ROOT, '.cache', 'llama-server', '11434.0.0', 'bin', 'llama-server');
const CONCURRENCY = [1, 8] as const;

if (!existsSync(LLAMA)) {
  console.error(`${LLAMA} is missing: bash scripts/build-llama-server.sh builds it (about 25 minutes on 2 cores)`);
  process.exit(2);
}
const questions = (JSON.parse(readFileSync(path.join(ROOT, 'data', 'questions.json'), 'utf8')) as { question: string }[]).map((q) => q.question);

function freePort(): Promise<number> {
  return new Promise((resolve) => {
    import('node:net').then(({ createServer }) => {
      const s = createServer().listen(0, '127.0.0.1', () => {
        const port = (s.address() as { port: number }).port;
        s.close(() => resolve(port));
      });
    });
  });
}

const spawnErrors = new Map<ChildProcess, Error>();

async function waitReady(url: string, proc: ChildProcess, log: () => string): Promise<void> {
  for (;;) {
    // A process killed by a signal has signalCode set and exitCode null; one that never started, neither (its 'error' event says so).
    if (proc.exitCode !== null || proc.signalCode !== null || spawnErrors.has(proc)) {
      throw new Error(`${url}: exited (${proc.exitCode ?? proc.signalCode ?? spawnErrors.get(proc)?.message}):\n${log().slice(-4000)}`);
    }
    const ok = await fetch(url).then((r) => r.ok, () => false);
    if (ok) return;
    await new Promise((r) => setTimeout(r, 500));
  }
}

interface Side {
  name: 'ragguard' | 'llama-server';
  base: string;
  model: string;
}

/** llama-server's own per-request timings (its `timings` field): decode tokens/s and prompt ms, by concurrency. */
const llamaTimings: Record<number, { decode: number[]; promptMs: number[] }> = {};

async function round(side: Side, concurrency: number): Promise<{ tokens: number; seconds: number; firstAnswer: string }> {
  const n = concurrency === 1 ? Math.max(1, REQUESTS >> 2) : REQUESTS;
  let next = 0;
  let tokens = 0;
  let firstAnswer = '';
  const t0 = performance.now();
  const client = async () => {
    while (next < n) {
      const i = next++;
      const r = await fetch(`${side.base}/v1/chat/completions`, {
        method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: side.model, messages: [{ role: 'user', content: questions[i % questions.length] }], max_tokens: NEW_TOKENS, temperature: 0, ignore_eos: true }),
      });
      const body = await r.json() as { usage?: { completion_tokens: number }; choices?: { message: { content: string } }[]; error?: unknown;
        timings?: { predicted_per_second?: number; prompt_ms?: number } };
      if (!r.ok || !body.usage) throw new Error(`${side.name}: ${r.status} ${JSON.stringify(body).slice(0, 300)}`);
      tokens += body.usage.completion_tokens;
      if (body.timings?.predicted_per_second !== undefined) {
        const t = (llamaTimings[concurrency] ??= { decode: [], promptMs: [] });
        t.decode.push(body.timings.predicted_per_second);
        t.promptMs.push(body.timings.prompt_ms ?? 0);
      }
      if (i === 0) firstAnswer = body.choices?.[0]?.message.content ?? '';
    }
  };
  await Promise.all(Array.from({ length: concurrency }, client));
  return { tokens, seconds: (performance.now() - t0) / 1000, firstAnswer };
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[s.length >> 1]!;
};

const indexDir = await mkdtemp(path.join(tmpdir(), 'ragguard-bench-llama-'));
const procs: ChildProcess[] = [];
try {
  const rgPort = await freePort();
  let rgLog = '';
  const rg = spawn('sh', ['scripts/tuned.sh', process.execPath, '--import', 'tsx', 'src/server/main.ts'], {
    cwd: ROOT, env: { ...process.env, PORT: String(rgPort), RAGGUARD_DECODER: GGUF, RAGGUARD_INDEX_DIR: indexDir, RAGGUARD_CORPUS_DIR: '' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  procs.push(rg);
  rg.stdout!.on('data', (c: Buffer) => (rgLog = (rgLog + c.toString()).slice(-20000)));
  rg.stderr!.on('data', (c: Buffer) => (rgLog = (rgLog + c.toString()).slice(-20000)));
  const llamaPort = await freePort();
  let llamaLog = '';
  const llama = spawn(LLAMA, ['-m', GGUF, '--host', '127.0.0.1', '--port', String(llamaPort), '--parallel', String(PARALLEL),
    '--threads', String(THREADS), '--ctx-size', String(PARALLEL * 2048), '--no-webui'], {
    env: { ...process.env, LD_LIBRARY_PATH: `${path.dirname(LLAMA)}:${process.env['LD_LIBRARY_PATH'] ?? ''}` }, stdio: ['ignore', 'pipe', 'pipe'],
  });
  procs.push(llama);
  llama.on('error', (e) => spawnErrors.set(llama, e));
  llama.stdout!.on('data', (c: Buffer) => (llamaLog = (llamaLog + c.toString()).slice(-20000)));
  llama.stderr!.on('data', (c: Buffer) => (llamaLog = (llamaLog + c.toString()).slice(-20000)));
  await waitReady(`http://127.0.0.1:${rgPort}/readyz`, rg, () => rgLog);
  await waitReady(`http://127.0.0.1:${llamaPort}/health`, llama, () => llamaLog);
  const rgModel = ((await (await fetch(`http://127.0.0.1:${rgPort}/v1/models`)).json()) as { data: { id: string }[] }).data[0]!.id;
  const sides: Side[] = [
    { name: 'ragguard', base: `http://127.0.0.1:${rgPort}`, model: rgModel },
    { name: 'llama-server', base: `http://127.0.0.1:${llamaPort}`, model: path.basename(GGUF) },
  ];
  // One warm-up request each (first-run allocations, lazily loaded pages of the model).
  for (const s of sides) await round(s, 1);
  const best: Record<string, Record<number, number>> = { ragguard: {}, 'llama-server': {} };
  const answers: Record<string, string> = {};
  for (let r = 0; r < ROUNDS; r++) {
    for (const c of CONCURRENCY) {
      for (const s of sides) {
        const x = await round(s, c);
        const tps = x.tokens / x.seconds;
        best[s.name]![c] = Math.max(best[s.name]![c] ?? 0, tps);
        answers[s.name] ??= x.firstAnswer;
        console.log(JSON.stringify({ round: r + 1, side: s.name, concurrency: c, tokens: x.tokens, seconds: +x.seconds.toFixed(2), tokens_per_s: +tps.toFixed(1) }));
      }
    }
  }
  const r1 = (x: number) => Math.round(x * 10) / 10;
  console.log(JSON.stringify({
    bench: 'llama-server', date: new Date().toISOString(), model: path.basename(GGUF), cpus: os.availableParallelism(), load: os.loadavg().map(r1),
    new_tokens: NEW_TOKENS, requests: REQUESTS, rounds: ROUNDS, llama_parallel: PARALLEL, llama_threads: THREADS,
    ragguard_tokens_per_s_at_1: r1(best['ragguard']![1]!), llama_server_tokens_per_s_at_1: r1(best['llama-server']![1]!),
    ragguard_tokens_per_s_at_8: r1(best['ragguard']![8]!), llama_server_tokens_per_s_at_8: r1(best['llama-server']![8]!),
    ratio_at_1: +(best['ragguard']![1]! / best['llama-server']![1]!).toFixed(2),
    ratio_at_8: +(best['ragguard']![8]! / best['llama-server']![8]!).toFixed(2),
    same_first_answer: answers['ragguard'] === answers['llama-server'],
    // What llama-server reports of its own requests (median): its decode rate counts only the generated
    // tokens' time, where the figures above are over the wall time of whole requests (prompt included).
    llama_server_own_timings: Object.fromEntries(Object.entries(llamaTimings).map(([c, t]) => [`at_${c}`, { decode_tokens_per_s: r1(median(t.decode)), prompt_ms: r1(median(t.promptMs)) }])),
  }));
} finally {
  for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL');
  await rm(indexDir, { recursive: true, force: true });
}
