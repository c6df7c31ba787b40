/**
 * CPU decode against llama.cpp's own HTTP server built for this CPU (scripts/build-llama-server.sh:
 * -DGGML_NATIVE=ON), both over HTTP, in one run: the strongest peer a user of a GGUF on a CPU would
 * reach for.
 *
 *   ragguard      `scripts/tuned.sh node src/cli/serve.ts` (as npm start), the GGUF as its decoder, an
 *                 empty index; POST /v1/chat/completions
 *   llama-server  the same GGUF, `--parallel BENCH_LLAMA_PARALLEL` (8) slots with continuous batching,
 *                 `--threads BENCH_LLAMA_THREADS` (the core count); POST /v1/chat/completions
 *
 * Both get the same chat messages (questions of data/questions.json), temperature 0, max_tokens
 * BENCH_NEW_TOKENS (64) with `ignore_eos` (each answer exactly that long on both), at 1 and 8 concurrent
 * clients (each sends its next request when the last is answered). Tokens/s = completion tokens over the
 * wall time of the round; BENCH_ROUNDS (2) rounds, the sides interleaved, each side's best.
 *
 * RAG-shaped requests (issue 41): each a fresh retrieved-looking context of 1-2k tokens (BENCH_RAG_CONTEXT_TOKENS,
 * "1000,2000": the sources' tokens by the GGUF's own tokenizer) of real corpus text (RAGGUARD_CORPUS_DIR, default
 * data/corpus: paragraphs packed into chunks of <= 900 characters, bench/rag-contexts.ts; each chunk used once in
 * the whole run, so no context is ever sent twice and no prefix cache serves one from another; the two sides get
 * the same texts at each level), then a question of data/questions.json (the question's own document's chunks
 * first), as a chat request with temperature 0, max_tokens BENCH_RAG_NEW_TOKENS (48) with `ignore_eos`,
 * `stream: true` (TTFT = time to the first non-empty content delta, at the client) and
 * `stream_options.include_usage`. Concurrency 1, 4 and 8, closed loop, BENCH_RAG_REQUESTS ("8,16,24") requests
 * at each, one pass per level (a second would repeat contexts), the sides one after the other at each level.
 * Per side and level: TTFT p50/p95, latency p50/p95, requests/s, prefill tokens/s (prompt tokens over summed
 * TTFT at the client; llama-server's own prompt_n over prompt_ms beside it, which leaves out the tokens its
 * cache already held), completion tokens/s (over the level's wall time). Ratios ragguard/llama-server:
 * requests/s at 4 and 8 (goal >= 3x) and TTFT p50 at 1, 4, 8 (goal <= 0.33x). The physical limit beside them:
 * the int8 multiply-add peak measured on every core at once (src/backends/ort/int8-peak.c), beside the
 * nominal cores x BENCH_VNNI_PER_CYCLE (1) VPDPBUSD a cycle x 64 int8 multiply-adds x /proc/cpuinfo's
 * `cpu MHz` (the hypervisor's nominal clock), over the GGUF's multiply-adds a prompt token
 * (every 2-D weight but token_embd and output: the logits are computed for the last prompt token only):
 * a prefill tokens/s ceiling.
 *
 * llama-server gets `--ctx-size` BENCH_LLAMA_PARALLEL x BENCH_LLAMA_SLOT_CTX (2560 with RAG requests, room for a
 * slot of 2.5k tokens; 2048 for the short chats alone), its prompt cache on (its default). ragguard runs with
 * its defaults: a RAG prompt of ~2.1k tokens is within them (the decoder's 32768 positions,
 * RAGGUARD_MAX_BATCHED_TOKENS 4096; RAGGUARD_MAX_QUERY_TOKENS bounds /query's question, not a chat).
 *
 * Env: BENCH_SHAPE (chat | rag | both; default both), BENCH_GGUF (default
 * models/pretrained/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf), BENCH_REQUESTS (16 at 8 concurrent, 4 at 1),
 * BENCH_LLAMA_SERVER (the binary; default the build script's), BENCH_SIDES (default "ragguard,llama-server";
 * one alone for a trial of the code, no ratios). Last line: JSON (the short-chat fields as before, `rag` and
 * `peak` beside them).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import os, { tmpdir } from 'node:os';
import path from 'node:path';
import { GgufFile } from '../src/runtime/gguf.js';
import { ggufTextTokenizer } from '../src/backends/cuda/gguf-checkpoint.js';
import { ContextPicker, corpusChunks, percentile, ragMessages, rng } from './rag-contexts.js';
import { freePort } from './http-client.js';
import { prefillCeiling } from './prefill-ceiling.js';

const ROOT = path.resolve(import.meta.dirname, '..');
const GGUF = path.resolve(ROOT, process.env['BENCH_GGUF'] ?? 'models/pretrained/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf');
const NEW_TOKENS = Number(process.env['BENCH_NEW_TOKENS'] ?? 64);
const REQUESTS = Number(process.env['BENCH_REQUESTS'] ?? 16);
const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 2);
const PARALLEL = Number(process.env['BENCH_LLAMA_PARALLEL'] ?? 8);
const THREADS = Number(process.env['BENCH_LLAMA_THREADS'] ?? os.availableParallelism());
const LLAMA = process.env['BENCH_LLAMA_SERVER'] ?? path.join(ROOT, '.cache', 'llama-server', '11434.0.0', 'bin', 'llama-server');
const CONCURRENCY = [1, 8] as const;
const SHAPE = process.env['BENCH_SHAPE'] ?? 'both';
if (!['chat', 'rag', 'both'].includes(SHAPE)) {
  console.error(`BENCH_SHAPE=${SHAPE}: chat, rag or both`);
  process.exit(2);
}
const RUN_CHAT = SHAPE !== 'rag';
const RUN_RAG = SHAPE !== 'chat';
const SIDE_NAMES = (process.env['BENCH_SIDES'] ?? 'ragguard,llama-server').split(',').map((s) => s.trim());
const RAG_CONCURRENCY = [1, 4, 8] as const;
const RAG_REQUESTS = (process.env['BENCH_RAG_REQUESTS'] ?? '8,16,24').split(',').map(Number);
const RAG_NEW_TOKENS = Number(process.env['BENCH_RAG_NEW_TOKENS'] ?? 48);
const [RAG_MIN_TOKENS, RAG_MAX_TOKENS] = (process.env['BENCH_RAG_CONTEXT_TOKENS'] ?? '1000,2000').split(',').map(Number) as [number, number];
const CORPUS = path.resolve(ROOT, process.env['RAGGUARD_CORPUS_DIR'] || 'data/corpus');
const SLOT_CTX = Number(process.env['BENCH_LLAMA_SLOT_CTX'] ?? (RUN_RAG ? 2560 : 2048));
const VNNI_PER_CYCLE = Number(process.env['BENCH_VNNI_PER_CYCLE'] ?? 1);
if (RAG_REQUESTS.length !== RAG_CONCURRENCY.length || RAG_REQUESTS.some((n) => !(n >= 1))) {
  console.error(`BENCH_RAG_REQUESTS: ${RAG_CONCURRENCY.length} counts, one per level (${RAG_CONCURRENCY.join(', ')})`);
  process.exit(2);
}

if (!SIDE_NAMES.includes('llama-server')) {
  // Not run: nothing to check.
} else if (process.env['BENCH_LLAMA_SERVER']) {
  if (!existsSync(LLAMA)) {
    console.error(`BENCH_LLAMA_SERVER: ${LLAMA} is missing`);
    process.exit(2);
  }
} else {
  // Missing, or built on a CPU with other instruction sets (a peer that dies of SIGILL, or runs slower).
  const check = spawnSync('bash', [path.join(ROOT, 'scripts', 'build-llama-server.sh'), '--check'], { encoding: 'utf8' });
  if (check.status !== 0) {
    console.error(`${check.stderr.trim() || `${LLAMA} is not usable here`}: bash scripts/build-llama-server.sh builds it (about 25 minutes on 2 cores)`);
    process.exit(2);
  }
}
const questionSet = JSON.parse(readFileSync(path.join(ROOT, 'data', 'questions.json'), 'utf8')) as { question: string; doc_id: string }[];
const questions = questionSet.map((q) => q.question);

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

// ---- RAG-shaped requests ----

type Messages = ReturnType<typeof ragMessages>;

interface RagResult {
  ttftMs: number;
  latencyMs: number;
  promptTokens: number;
  completionTokens: number;
  /** llama-server's own timings of the request (prompt tokens it computed, not cached; their ms). */
  serverPromptN?: number;
  serverPromptMs?: number;
  serverDecodePerS?: number;
  text: string;
}

/** One streamed chat request: TTFT at the first non-empty content delta; usage from the last chunk. */
async function ragRequest(side: Side, messages: Messages): Promise<RagResult> {
  const t0 = performance.now();
  const r = await fetch(`${side.base}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: side.model, messages, max_tokens: RAG_NEW_TOKENS, temperature: 0, ignore_eos: true, stream: true,
      stream_options: { include_usage: true } }),
  });
  if (!r.ok || !r.body) throw new Error(`${side.name}: ${r.status} ${(await r.text()).slice(0, 500)}`);
  let ttft: number | undefined;
  let usage: { prompt_tokens: number; completion_tokens: number } | undefined;
  let timings: { prompt_n?: number; prompt_ms?: number; predicted_per_second?: number } | undefined;
  let text = '';
  let deltas = 0;
  let buf = '';
  const decoder = new TextDecoder();
  const onEvent = (data: string) => {
    if (data === '[DONE]') return;
    const c = JSON.parse(data) as { choices?: { delta?: { content?: string | null } }[]; usage?: typeof usage; timings?: typeof timings; error?: unknown };
    if (c.error !== undefined) throw new Error(`${side.name}: stream error ${JSON.stringify(c.error).slice(0, 300)}`);
    const content = c.choices?.[0]?.delta?.content;
    if (typeof content === 'string' && content.length > 0) {
      ttft ??= performance.now() - t0;
      text += content;
      deltas++;
    }
    if (c.usage) usage = c.usage;
    if (c.timings) timings = c.timings;
  };
  for await (const part of r.body as unknown as AsyncIterable<Uint8Array>) {
    buf += decoder.decode(part, { stream: true });
    for (let at = buf.indexOf('\n'); at >= 0; at = buf.indexOf('\n')) {
      const line = buf.slice(0, at).trim();
      buf = buf.slice(at + 1);
      if (line.startsWith('data:')) onEvent(line.slice(5).trim());
    }
  }
  if (buf.trim().startsWith('data:')) onEvent(buf.trim().slice(5).trim());
  const latencyMs = performance.now() - t0;
  if (ttft === undefined) throw new Error(`${side.name}: no content in the stream`);
  if (!usage) throw new Error(`${side.name}: no usage chunk in the stream (${deltas} content deltas)`);
  return {
    ttftMs: ttft, latencyMs, promptTokens: usage.prompt_tokens, completionTokens: usage.completion_tokens, text,
    ...(timings?.prompt_n !== undefined ? { serverPromptN: timings.prompt_n, serverPromptMs: timings.prompt_ms ?? 0, serverDecodePerS: timings.predicted_per_second ?? 0 } : {}),
  };
}

/** A closed loop of `concurrency` clients over `requests` (each sent once, in order). */
async function ragLevel(side: Side, concurrency: number, requests: readonly Messages[]): Promise<{ results: RagResult[]; seconds: number }> {
  let next = 0;
  const results: RagResult[] = [];
  const t0 = performance.now();
  const client = async () => {
    while (next < requests.length) {
      const i = next++;
      results[i] = await ragRequest(side, requests[i]!);
    }
  };
  await Promise.all(Array.from({ length: concurrency }, client));
  return { results, seconds: (performance.now() - t0) / 1000 };
}

const r1 = (x: number) => Math.round(x * 10) / 10;
const r2 = (x: number) => Math.round(x * 100) / 100;
const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);

function levelSummary(results: RagResult[], seconds: number) {
  const ttft = results.map((r) => r.ttftMs);
  const lat = results.map((r) => r.latencyMs);
  const prompt = sum(results.map((r) => r.promptTokens));
  const completion = sum(results.map((r) => r.completionTokens));
  const own = results.filter((r) => r.serverPromptN !== undefined);
  return {
    requests: results.length, seconds: r2(seconds),
    ttft_p50_ms: Math.round(percentile(ttft, 50)), ttft_p95_ms: Math.round(percentile(ttft, 95)),
    latency_p50_ms: Math.round(percentile(lat, 50)), latency_p95_ms: Math.round(percentile(lat, 95)),
    requests_per_s: +(results.length / seconds).toFixed(3),
    prompt_tokens_mean: Math.round(prompt / results.length),
    // Prompt tokens over the summed time to the first token, as each client saw it (queueing included).
    prefill_tokens_per_s: r1(prompt / (sum(ttft) / 1000)),
    completion_tokens: completion,
    completion_tokens_per_s: r1(completion / seconds),
    every_answer_full_length: results.every((r) => r.completionTokens === RAG_NEW_TOKENS),
    ...(own.length > 0 ? {
      server_prompt_tokens_computed: sum(own.map((r) => r.serverPromptN!)),
      server_prefill_tokens_per_s: r1(sum(own.map((r) => r.serverPromptN!)) / (sum(own.map((r) => r.serverPromptMs!)) / 1000)),
      server_decode_tokens_per_s_p50: r1(percentile(own.map((r) => r.serverDecodePerS!), 50)),
    } : {}),
  };
}

/** The texts of every level, the same for both sides; one more for each side's warm-up. */
async function ragRequests(): Promise<{ warmup: Messages; levels: Messages[][]; contextTokens: number[] }> {
  const chunks = corpusChunks(CORPUS);
  const f = GgufFile.open(GGUF);
  const tok = await ggufTextTokenizer(f, f.num(`${f.str('general.architecture')}.context_length`, 32768)).finally(() => f.close());
  for (const c of chunks) c.tokens = tok.encode(c.text).length;
  const picker = new ContextPicker(chunks, 41);
  const r = rng(4141);
  const contextTokens: number[] = [];
  let k = 0;
  const one = (): Messages => {
    const q = questionSet[(k++ * 37) % questionSet.length]!;
    const target = RAG_MIN_TOKENS + Math.floor(r() * (RAG_MAX_TOKENS - RAG_MIN_TOKENS) * 0.8);
    const picked = picker.take(target, RAG_MAX_TOKENS, q.doc_id);
    contextTokens.push(sum(picked.map((c) => c.tokens)));
    return ragMessages(picked, q.question);
  };
  const warmup = one();
  contextTokens.length = 0;
  const levels = RAG_REQUESTS.map((n) => Array.from({ length: n }, one));
  return { warmup, levels, contextTokens };
}

const indexDir = await mkdtemp(path.join(tmpdir(), 'ragguard-bench-llama-'));
const procs: ChildProcess[] = [];
try {
  const rag = RUN_RAG ? await ragRequests() : undefined;
  const sides: Side[] = [];
  let rgPort = 0;
  let rgLog = '';
  let rg: ChildProcess | undefined;
  if (SIDE_NAMES.includes('ragguard')) {
    rgPort = await freePort();
    rg = spawn('sh', ['scripts/tuned.sh', process.execPath, '--import', 'tsx', 'src/cli/serve.ts'], {
      cwd: ROOT, env: { ...process.env, PORT: String(rgPort), RAGGUARD_DECODER: GGUF, RAGGUARD_INDEX_DIR: indexDir, RAGGUARD_CORPUS_DIR: '' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    procs.push(rg);
    rg.stdout!.on('data', (c: Buffer) => (rgLog = (rgLog + c.toString()).slice(-20000)));
    rg.stderr!.on('data', (c: Buffer) => (rgLog = (rgLog + c.toString()).slice(-20000)));
  }
  let llamaPort = 0;
  let llamaLog = '';
  let llama: ChildProcess | undefined;
  if (SIDE_NAMES.includes('llama-server')) {
    llamaPort = await freePort();
    llama = spawn(LLAMA, ['-m', GGUF, '--host', '127.0.0.1', '--port', String(llamaPort), '--parallel', String(PARALLEL),
      '--threads', String(THREADS), '--ctx-size', String(PARALLEL * SLOT_CTX), '--no-webui'], {
      env: { ...process.env, LD_LIBRARY_PATH: `${path.dirname(LLAMA)}:${process.env['LD_LIBRARY_PATH'] ?? ''}` }, stdio: ['ignore', 'pipe', 'pipe'],
    });
    procs.push(llama);
    const l = llama;
    l.on('error', (e) => spawnErrors.set(l, e));
    l.stdout!.on('data', (c: Buffer) => (llamaLog = (llamaLog + c.toString()).slice(-20000)));
    l.stderr!.on('data', (c: Buffer) => (llamaLog = (llamaLog + c.toString()).slice(-20000)));
  }
  if (rg) {
    await waitReady(`http://127.0.0.1:${rgPort}/readyz`, rg, () => rgLog);
    const rgModel = ((await (await fetch(`http://127.0.0.1:${rgPort}/v1/models`)).json()) as { data: { id: string }[] }).data[0]!.id;
    sides.push({ name: 'ragguard', base: `http://127.0.0.1:${rgPort}`, model: rgModel });
  }
  if (llama) {
    await waitReady(`http://127.0.0.1:${llamaPort}/health`, llama, () => llamaLog);
    sides.push({ name: 'llama-server', base: `http://127.0.0.1:${llamaPort}`, model: path.basename(GGUF) });
  }
  const both = sides.length === 2;
  const out: Record<string, unknown> = {
    bench: 'llama-server', shape: SHAPE, date: new Date().toISOString(), model: path.basename(GGUF), cpus: os.availableParallelism(), load: os.loadavg().map(r1),
    sides: sides.map((s) => s.name), llama_parallel: PARALLEL, llama_threads: THREADS, llama_ctx_size: PARALLEL * SLOT_CTX,
  };

  if (RUN_CHAT) {
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
    const tps = (name: string, c: number) => (best[name]![c] !== undefined ? r1(best[name]![c]!) : null);
    Object.assign(out, {
      new_tokens: NEW_TOKENS, requests: REQUESTS, rounds: ROUNDS,
      ragguard_tokens_per_s_at_1: tps('ragguard', 1), llama_server_tokens_per_s_at_1: tps('llama-server', 1),
      ragguard_tokens_per_s_at_8: tps('ragguard', 8), llama_server_tokens_per_s_at_8: tps('llama-server', 8),
      ...(both ? {
        ratio_at_1: +(best['ragguard']![1]! / best['llama-server']![1]!).toFixed(2),
        ratio_at_8: +(best['ragguard']![8]! / best['llama-server']![8]!).toFixed(2),
        same_first_answer: answers['ragguard'] === answers['llama-server'],
      } : {}),
      // What llama-server reports of its own requests (median): its decode rate counts only the generated
      // tokens' time, where the figures above are over the wall time of whole requests (prompt included).
      llama_server_own_timings: Object.fromEntries(Object.entries(llamaTimings).map(([c, t]) => [`at_${c}`, { decode_tokens_per_s: r1(median(t.decode)), prompt_ms: r1(median(t.promptMs)) }])),
    });
  }

  if (rag) {
    for (const s of sides) await ragRequest(s, rag.warmup);
    const levels: Record<string, Record<string, ReturnType<typeof levelSummary>>> = {};
    const firstAnswers: Record<string, string> = {};
    for (const [li, c] of RAG_CONCURRENCY.entries()) {
      for (const s of sides) {
        const x = await ragLevel(s, c, rag.levels[li]!);
        const row = levelSummary(x.results, x.seconds);
        (levels[s.name] ??= {})[`at_${c}`] = row;
        if (c === 1) firstAnswers[s.name] = x.results[0]!.text;
        console.log(JSON.stringify({ shape: 'rag', side: s.name, concurrency: c, ...row }));
      }
    }
    const ct = rag.contextTokens;
    const ratio = (c: number, k: 'requests_per_s' | 'ttft_p50_ms') => r2(levels['ragguard']![`at_${c}`]![k] / levels['llama-server']![`at_${c}`]![k]);
    out['rag'] = {
      corpus: path.relative(ROOT, CORPUS) || CORPUS, new_tokens: RAG_NEW_TOKENS, requests: Object.fromEntries(RAG_CONCURRENCY.map((c, i) => [`at_${c}`, RAG_REQUESTS[i]])),
      context_tokens: { min: Math.min(...ct), p50: percentile(ct, 50), max: Math.max(...ct), every_context_distinct: true },
      ...levels,
      ...(both ? {
        ratio_requests_per_s_at_4: ratio(4, 'requests_per_s'), ratio_requests_per_s_at_8: ratio(8, 'requests_per_s'),
        ratio_ttft_p50_at_1: ratio(1, 'ttft_p50_ms'), ratio_ttft_p50_at_4: ratio(4, 'ttft_p50_ms'), ratio_ttft_p50_at_8: ratio(8, 'ttft_p50_ms'),
        goals: { requests_per_s_ratio_at_4_and_8: '>= 3', ttft_p50_ratio: '<= 0.33' },
        same_first_answer: firstAnswers['ragguard'] === firstAnswers['llama-server'],
      } : {}),
    };
    const pk = prefillCeiling(GGUF, VNNI_PER_CYCLE);
    out['peak'] = {
      ...pk,
      ...Object.fromEntries(sides.map((s) => [`${s.name.replace('-', '_')}_prefill_share_at_1`, r2(levels[s.name]!['at_1']!.prefill_tokens_per_s / pk.prefill_tokens_per_s_ceiling)])),
    };
  }
  out['load_end'] = os.loadavg().map(r1);
  console.log(JSON.stringify(out));
} finally {
  for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL');
  await rm(indexDir, { recursive: true, force: true });
}
