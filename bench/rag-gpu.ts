/**
 * bench:rag-gpu (on the GPU host): the whole server on the GPU, end to end, against llama.cpp's llama-server
 * (CUDA build) on the same GGUF file and the same card, in one run. scripts/gpu/run-rag-gpu.sh runs it there
 * (step raggpu) after building what it needs.
 *
 *   LLAMA_BIN=<dir of llama-server> RAGGUARD_DECODER=<the default GGUF> npm run bench:rag-gpu
 *
 * 1. ragguard: src/cli/serve.ts as its own process (bench/server-process.ts: scripts/tuned.sh, as npm start),
 *    RAGGUARD_DECODER (default: Qwen2.5-Coder-0.5B-Instruct Q4_K_M) with RAGGUARD_DECODER_EP=cuda, embedder
 *    and reranker on the CUDA encoder (RAGGUARD_EMBEDDER_EP / RAGGUARD_RERANKER_EP=cuda, RAGGUARD_RERANK=true:
 *    the reranker runs on every query), a fresh temporary index (data/corpus ingested at start; or
 *    BENCH_RAG_GPU_INDEX_DIR, kept, so that a second run restores the calibration), RAGGUARD_MAX_NUM_SEQS and
 *    RAGGUARD_MAX_CONCURRENT at the highest concurrency (the peer's -np). Any RAGGUARD_* set in the
 *    environment wins. Ready: its "ready on" log line, then GET /readyz 200.
 * 2. The question set: every question of BENCH_RAG_GPU_SPLIT (all: tune and heldout; or tune, heldout) of
 *    data/questions.json (bench/questions.ts) once through POST /query (streamed, the server's defaults) at
 *    the lowest concurrency: the warm-up and its own TTFT / latency figures.
 * 3. Bursts: BENCH_RAG_GPU_REQUESTS (256) streamed /query requests at each of BENCH_RAG_GPU_CONCURRENCY
 *    (32,64; each its own burst), closed loop (each of c clients sends its next request when its last has
 *    ended). Mixed lengths, the same list at every level (seeded): questions of the split, rerank_top_n from
 *    BENCH_RAG_GPU_TOP_N (1,3,5,8: prompts of one to eight chunks), max_new_tokens from
 *    BENCH_RAG_GPU_NEW_TOKENS (16,32,64,128,256), temperature 0. Per level: requests/s (200 replies over the
 *    burst's wall time), completion tokens/s, TTFT (request made -> first `event: token`) and latency
 *    (-> end of stream) p50/p95 of the 200 replies, statuses by code, error codes.
 *    The guard: its decisions over the burst (/metrics guard_admissions_total{decision} and
 *    guard_reshapes_total{field}, after minus before) and the replies' own `guard` reports (decision, reshaped);
 *    out-of-memory errors (a reply's or error event's message, or a server log line, naming out of memory /
 *    cudaErrorMemoryAllocation / CUBLAS_STATUS_ALLOC_FAILED); refusals (413, 429, 503). A refusal "of a
 *    request that would have fit" is one whose request, sent again alone to the idle server after the
 *    bursts, is answered 200: the guard refused under load what it admits alone (a 413 the guard calls
 *    never-fitting stays refused alone and is not counted). Goal: 0 of both.
 * 4. Memory: NVML used bytes of GPU 0 (src/guards/nvml.ts, read by this process) once ready (start-up),
 *    before each burst, every 50 ms during it (peak), and after it once the server is idle (GET /debug/memory:
 *    admission queue running and waiting 0, no workspace reserved; then BENCH_RAG_GPU_SETTLE_MS, 1000);
 *    after - start-up in MiB (goal: within a few MiB). /debug/memory's device figures (budget, KV pool,
 *    components, its own NVML reading) at start-up and at the end. Where NVML cannot be read (no driver),
 *    every NVML figure is null and `nvml_unavailable` says why.
 * 5. The peer, after ragguard is stopped (the card to itself; NVML then reads the peer alone): llama-server
 *    from LLAMA_BIN on the same GGUF file, `-ngl 99 -np <highest level> -c <np x BENCH_RAG_GPU_LLAMA_CTX
 *    (2048)>` (continuous batching is its default), POST /v1/chat/completions streamed. Its prompts are
 *    ragguard's own: each burst request's chat rebuilt from the citations it streamed (the chunks placed in
 *    the prompt, in order) by the server's own code (chat-prompt.ts with the default template: the
 *    instruction and the numbered chunks as a system message, the question as the user's), so the same
 *    text through the same chat template (prompt tokens, median, on both sides show it); max_tokens = the
 *    completion tokens ragguard generated for that request, with ignore_eos (the same tokens of work).
 *    Same levels, same closed loop; requests/s, TTFT and latency p50/p95, and NVML before / peak.
 *    Ratio: ragguard's requests/s over the peer's; goal at 64: >= 1.5 with p95 no worse. The sides do not
 *    do the same work in the peer's favour: ragguard's figures include embedding the query, the search,
 *    reranking (the cross-encoder on every candidate) and assembling the prompt; the peer is handed the
 *    assembled chat.
 *
 * Every figure is of the card nvidia-smi names (`card`, in the summary and on each level's line).
 * BENCH_RAG_GPU_STANDIN=1: a dry run of the plumbing on a machine without a GPU: the decoder and encoders on
 * the CPU (RAGGUARD_*_EP=cpu), the profile run off (RAGGUARD_PROFILE_RUN=false, unless set), NVML absent
 * (null, with the reason), LLAMA_BIN pointing at scripts/gpu/llama-standin.sh's stand-ins (made in a
 * temporary directory where LLAMA_BIN is not set), a small burst (8 requests at 2 concurrent, 4 questions,
 * 4-8 new tokens): no figure of it is a result.
 * BENCH_RAG_GPU_SERVER_LOG=file keeps the server's log (stdout and stderr) there; otherwise it is read for
 * out-of-memory lines and removed.
 * Bounded: every request times out (BENCH_RAG_GPU_REQUEST_TIMEOUT_MS, 120 s), every wait has a limit, and
 * BENCH_RAG_GPU_DEADLINE_S (540: one 600-s device call with its start; 1800 stand-in) stops the whole run
 * (servers killed, the summary so far with an error); the servers are killed at the end and the process
 * exits. Each level prints a JSON line; the last line is the summary.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { chatContextPrompt } from '../src/generate/chat-prompt.js';
import type { ChatMessage, ChatTemplate } from '../src/generate/chat-template.js';
import { DEFAULT_TEMPLATE } from '../src/generate/prompt.js';
import { seededRandom } from '../src/generate/sampler.js';
import { gpuName } from './gpu-common.js';
import { gpuZero } from './gpu-usage.js';
import { closedLoop, freePort, getJson, post, type SseEvent, type StreamReply } from './http-client.js';
import { deviceFigures, diff, guardCounts, metrics, waitIdle } from './server-reports.js';
import { parseQuestions, type Question } from './questions.js';
import { startServerProcess, type ServerProcess } from './server-process.js';

const ROOT = path.resolve(import.meta.dirname, '..');
const env = process.env;
const STANDIN = env['BENCH_RAG_GPU_STANDIN'] === '1';
const list = (v: string) => v.split(',').map((s) => Number(s.trim())).filter((n) => Number.isFinite(n) && n > 0);
const LEVELS = list(env['BENCH_RAG_GPU_CONCURRENCY'] ?? (STANDIN ? '2' : '32,64'));
const REQUESTS = Number(env['BENCH_RAG_GPU_REQUESTS'] ?? (STANDIN ? 8 : 256));
const NEW_TOKENS = list(env['BENCH_RAG_GPU_NEW_TOKENS'] ?? (STANDIN ? '4,8' : '16,32,64,128,256'));
const TOP_N = list(env['BENCH_RAG_GPU_TOP_N'] ?? '1,3,5,8');
const SPLIT = env['BENCH_RAG_GPU_SPLIT'] ?? 'all';
const QUESTION_LIMIT = Number(env['BENCH_RAG_GPU_QUESTIONS'] ?? (STANDIN ? 4 : Infinity));
const SETTLE_MS = Number(env['BENCH_RAG_GPU_SETTLE_MS'] ?? 1000);
const SAMPLE_MS = 50;
const REQUEST_TIMEOUT_MS = Number(env['BENCH_RAG_GPU_REQUEST_TIMEOUT_MS'] ?? 120_000);
const DEADLINE_S = Number(env['BENCH_RAG_GPU_DEADLINE_S'] ?? (STANDIN ? 1800 : 540));
/** The stand-in run makes its own stand-ins (scripts/gpu/llama-standin.sh) where LLAMA_BIN is not given. */
const LLAMA_BIN = env['LLAMA_BIN'] ?? (STANDIN ? standIns() : '');
const LLAMA_CTX = Number(env['BENCH_RAG_GPU_LLAMA_CTX'] ?? 2048);
const GGUF = path.resolve(ROOT, env['RAGGUARD_DECODER'] ?? 'models/pretrained/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf');
const MAX_LEVEL = Math.max(...LEVELS);
/** What an out-of-memory failure says, on the device or the host. */
const OOM = /out of memory|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|CUBLAS_STATUS_ALLOC_FAILED|std::bad_alloc|\bOOM\b/i;
const REFUSALS = new Set([413, 429, 503]);

if (LEVELS.length === 0 || !(REQUESTS > 0) || NEW_TOKENS.length === 0 || TOP_N.length === 0) {
  throw new Error('BENCH_RAG_GPU_CONCURRENCY, _REQUESTS, _NEW_TOKENS and _TOP_N must name positive numbers');
}
if (SPLIT !== 'all' && SPLIT !== 'tune' && SPLIT !== 'heldout') throw new Error(`BENCH_RAG_GPU_SPLIT must be all, tune or heldout, not '${SPLIT}'`);

function standIns(): string {
  const dir = path.join(tmpdir(), `ragguard-llama-standin-${process.pid}`);
  execFileSync('bash', [path.join(ROOT, 'scripts/gpu/llama-standin.sh'), dir], { stdio: 'ignore' });
  return dir;
}
const r1 = (x: number) => Math.round(x * 10) / 10;
const MiB = 2 ** 20;
const mib = (b: number | null) => (b === null ? null : r1(b / MiB));
function quantile(xs: readonly number[], q: number): number | null {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)]!;
}
const q50 = (xs: readonly number[]) => { const v = quantile(xs, 0.5); return v === null ? null : r1(v); };
const q95 = (xs: readonly number[]) => { const v = quantile(xs, 0.95); return v === null ? null : r1(v); };
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

// ---------------------------------------------------------------- children and the deadline
const children: ChildProcess[] = [];
let rg: ServerProcess | undefined;
function killAll(): void {
  rg?.proc.kill('SIGKILL');
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
}
/** The summary as far as it got (printed with the error where the deadline or a failure stops the run). */
const summary: Record<string, unknown> = { bench: 'rag-gpu' };
const deadline = setTimeout(() => {
  killAll();
  console.log(JSON.stringify({ ...summary, error: `deadline: BENCH_RAG_GPU_DEADLINE_S=${DEADLINE_S} s passed; servers killed` }));
  process.exit(3);
}, DEADLINE_S * 1000);
deadline.unref();

// ---------------------------------------------------------------- NVML (this process reads GPU 0)
const gpu0 = gpuZero(SAMPLE_MS);
const gpuUsed = gpu0.used;
const peakSampler = gpu0.peakSampler;

// ---------------------------------------------------------------- the requests
interface Spec { i: number; q: Question; rerankTopN: number | undefined; maxNewTokens: number | undefined }
interface Citation { title: string; text: string }
interface OurReply {
  status: number; ms: number; ttftMs: number | null; error?: string;
  code?: string; message?: string; citations?: Citation[];
  promptTokens?: number; completionTokens?: number; guard?: { decision?: string; reshaped?: unknown[] }; errorDetails?: Record<string, unknown>;
}

function queryBody(s: Spec, stream = true): Record<string, unknown> {
  return {
    query: s.q.question, temperature: 0, stream,
    ...(s.rerankTopN !== undefined ? { rerank_top_n: s.rerankTopN } : {}),
    ...(s.maxNewTokens !== undefined ? { max_new_tokens: s.maxNewTokens } : {}),
  };
}

function parseOurs(r: StreamReply): OurReply {
  const out: OurReply = { status: r.status, ms: r.ms, ttftMs: r.ttftMs, ...(r.error ? { error: r.error } : {}) };
  const json = (s: string): Record<string, unknown> => { try { return JSON.parse(s) as Record<string, unknown>; } catch { return {}; } };
  const take = (body: Record<string, unknown>) => {
    const usage = body['usage'] as { prompt_tokens?: number; completion_tokens?: number } | undefined;
    if (usage) {
      out.promptTokens = usage.prompt_tokens;
      out.completionTokens = usage.completion_tokens;
    }
    if (body['guard']) out.guard = body['guard'] as OurReply['guard'];
    if (body['citations']) out.citations = body['citations'] as Citation[];
    const err = body['error'] as Record<string, unknown> | undefined;
    if (err) {
      const { code, message, ...details } = err;
      out.code = String(code);
      out.message = String(message);
      out.errorDetails = details;
    }
  };
  if (r.body) take(json(r.body));
  for (const e of r.events) if (e.event !== 'token') take(json(e.data));
  return out;
}

const ourToken = (e: SseEvent) => e.event === 'token';

/** Chat messages as the server assembles them for these chunks (chat-prompt.ts, the default template). */
async function chatFor(question: string, chunks: readonly Citation[]): Promise<ChatMessage[]> {
  let messages: ChatMessage[] = [];
  const capture = { encode: (m: ChatMessage[]) => { messages = m; return []; } } as unknown as ChatTemplate;
  await chatContextPrompt(capture, DEFAULT_TEMPLATE, [{ role: 'user', content: question }], chunks.map((c) => ({ title: c.title, text: c.text })), Infinity);
  return messages;
}

/** The figures of one side's burst. */
function summarise(replies: { status: number; ms: number; ttftMs: number | null; completionTokens?: number; promptTokens?: number }[], seconds: number) {
  const ok = replies.filter((r) => r.status === 200);
  const statuses: Record<string, number> = {};
  for (const r of replies) statuses[r.status === 0 ? 'no_reply' : String(r.status)] = (statuses[r.status === 0 ? 'no_reply' : String(r.status)] ?? 0) + 1;
  const tokens = ok.reduce((s, r) => s + (r.completionTokens ?? 0), 0);
  return {
    requests: replies.length, ok: ok.length, seconds: r1(seconds),
    requests_per_s: r1(ok.length / seconds), completion_tokens_per_s: r1(tokens / seconds), completion_tokens: tokens,
    ttft_p50_ms: q50(ok.flatMap((r) => (r.ttftMs === null ? [] : [r.ttftMs]))), ttft_p95_ms: q95(ok.flatMap((r) => (r.ttftMs === null ? [] : [r.ttftMs]))),
    latency_p50_ms: q50(ok.map((r) => r.ms)), latency_p95_ms: q95(ok.map((r) => r.ms)),
    prompt_tokens_p50: q50(ok.flatMap((r) => (r.promptTokens === undefined ? [] : [r.promptTokens]))),
    statuses,
  };
}

// ---------------------------------------------------------------- the run
function commit(): string {
  try {
    return execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  } catch {
    return 'unknown';
  }
}

async function main(): Promise<number> {
  const card = STANDIN ? `${gpuName()} (stand-in: no GPU used)` : gpuName();
  const all = parseQuestions(JSON.parse(readFileSync(path.join(ROOT, 'data', 'questions.json'), 'utf8')));
  const questions = (SPLIT === 'all' ? all : all.filter((q) => q.split === SPLIT)).slice(0, QUESTION_LIMIT);
  const rand = seededRandom(38);
  const pick = <T>(xs: readonly T[]) => xs[Math.floor(rand() * xs.length)]!;
  const specs: Spec[] = Array.from({ length: REQUESTS }, (_, i) => ({ i, q: pick(questions), rerankTopN: pick(TOP_N), maxNewTokens: pick(NEW_TOKENS) }));
  const serverEnv: Record<string, string> = {};
  const def = (k: string, v: string) => { serverEnv[k] = env[k] ?? v; };
  def('RAGGUARD_DECODER', GGUF);
  def('RAGGUARD_DECODER_EP', STANDIN ? 'cpu' : 'cuda');
  def('RAGGUARD_EMBEDDER_EP', STANDIN ? 'cpu' : 'cuda');
  def('RAGGUARD_RERANKER_EP', STANDIN ? 'cpu' : 'cuda');
  def('RAGGUARD_RERANK', 'true');
  def('RAGGUARD_MAX_NUM_SEQS', String(MAX_LEVEL));
  def('RAGGUARD_MAX_CONCURRENT', String(MAX_LEVEL));
  def('RAGGUARD_CORPUS_DIR', 'data/corpus');
  if (STANDIN) def('RAGGUARD_PROFILE_RUN', 'false');
  const keptIndex = env['BENCH_RAG_GPU_INDEX_DIR'];
  const indexDir = keptIndex ?? await mkdtemp(path.join(tmpdir(), 'ragguard-bench-rag-gpu-'));
  serverEnv['RAGGUARD_INDEX_DIR'] = indexDir;
  const keptLog = env['BENCH_RAG_GPU_SERVER_LOG'];
  const logFile = keptLog ?? path.join(tmpdir(), `ragguard-bench-rag-gpu-${process.pid}.log`);
  const settings = {
    decoder: path.basename(GGUF), embedder: env['RAGGUARD_EMBEDDER'] ?? 'models/pretrained/all-minilm-l6-v2 (default)',
    ...Object.fromEntries(Object.entries(serverEnv).filter(([k]) => k !== 'RAGGUARD_DECODER' && k !== 'RAGGUARD_INDEX_DIR').map(([k, v]) => [k.replace(/^RAGGUARD_/, '').toLowerCase(), v])),
  };
  console.error(`bench:rag-gpu: ${card}; ${JSON.stringify(settings)}; ${questions.length} questions (${SPLIT}); bursts of ${REQUESTS} at ${LEVELS.join(', ')}`);

  Object.assign(summary, {
    bench: 'rag-gpu', date: new Date().toISOString(), commit: commit(), card, standin: STANDIN, settings,
    split: SPLIT, questions: questions.length, requests: REQUESTS, concurrency: LEVELS, new_tokens_mix: NEW_TOKENS, rerank_top_n_mix: TOP_N,
  });
  const levels: Record<string, unknown>[] = [];
  const ourReplies = new Map<number, OurReply[]>();
  try {
    // ---- ragguard
    const t0 = performance.now();
    rg = await startServerProcess(serverEnv, { outFile: logFile });
    const port = rg.port;
    const ready = await fetch(`http://127.0.0.1:${port}/readyz`, { signal: AbortSignal.timeout(10_000) }).then((r) => r.status, () => 0);
    if (ready !== 200) throw new Error(`/readyz answered ${ready} after "ready on"`);
    const health = await getJson<Record<string, unknown>>(port, '/healthz').catch((): Record<string, unknown> => ({}));
    const startS = (performance.now() - t0) / 1000;
    const startup = gpuUsed();
    const startupDevice = await deviceFigures(port);
    summary['server'] = { start_s: r1(startS), providers: health['providers'], decoder: health['decoder'] };

    // The question set, once, at the lowest level: the warm-up.
    const qs = await closedLoop(questions.length, Math.min(...LEVELS), async (i) =>
      parseOurs(await post(port, '/query', queryBody({ i, q: questions[i]!, rerankTopN: undefined, maxNewTokens: undefined }), ourToken, REQUEST_TIMEOUT_MS)));
    summary['question_set'] = { split: SPLIT, card, ...summarise(qs.results, qs.seconds), errors: errorCodes(qs.results) };
    console.error(`bench:rag-gpu: question set ${JSON.stringify(summary['question_set'])}`);

    const memory: Record<string, unknown>[] = [];
    let oomReplies = 0;
    for (const c of LEVELS) {
      await waitIdle(port);
      const before = gpuUsed();
      const m0 = await metrics(port);
      const sampler = peakSampler();
      const burst = await closedLoop(REQUESTS, c, async (i) => parseOurs(await post(port, '/query', queryBody(specs[i]!), ourToken, REQUEST_TIMEOUT_MS)));
      const peak = sampler.stop();
      const idle = await waitIdle(port);
      await sleep(SETTLE_MS);
      const after = gpuUsed();
      const m1 = await metrics(port);
      burst.results.forEach((r, i) => ourReplies.set(i, [...(ourReplies.get(i) ?? []), r]));
      const g0 = guardCounts(m0), g1 = guardCounts(m1);
      const oom = burst.results.filter((r) => OOM.test(`${r.message ?? ''} ${r.error ?? ''}`)).length;
      oomReplies += oom;
      const decided: Record<string, number> = {};
      let reshaped = 0;
      for (const r of burst.results) {
        if (r.guard?.decision) decided[r.guard.decision] = (decided[r.guard.decision] ?? 0) + 1;
        if ((r.guard?.reshaped?.length ?? 0) > 0) reshaped++;
      }
      const mem = {
        concurrency: c, card, nvml_before_bytes: before, nvml_peak_bytes: peak, nvml_after_bytes: after,
        peak_minus_before_mib: before !== null && peak !== null ? mib(peak - before) : null,
        after_minus_before_mib: before !== null && after !== null ? mib(after - before) : null,
        after_minus_startup_mib: startup !== null && after !== null ? mib(after - startup) : null,
        idle_after: idle,
      };
      memory.push(mem);
      const row = {
        side: 'ragguard', card, concurrency: c, ...summarise(burst.results, burst.seconds), errors: errorCodes(burst.results),
        guard: {
          metrics: { decisions: diff(g1.decisions, g0.decisions), reshapes: diff(g1.reshapes, g0.reshapes), preemptions: g1.preemptions - g0.preemptions, engine_failed: g1.engine_failed - g0.engine_failed },
          replies: { decisions: decided, reshaped },
          refused: burst.results.filter((r) => REFUSALS.has(r.status)).length,
          oom_errors: oom,
        },
        memory: mem,
      };
      levels.push({ concurrency: c, ragguard: row });
      console.log(JSON.stringify(row));
    }

    // Refusals under load, each request sent again alone to the idle server: a 200 there is a refusal of a request that would have fit.
    const refused = [...ourReplies.entries()].filter(([, rs]) => rs.some((r) => REFUSALS.has(r.status)));
    let wouldFit = 0;
    const refusedSamples: unknown[] = [];
    for (const [i, rs] of refused.slice(0, 16)) {
      await waitIdle(port);
      const alone = parseOurs(await post(port, '/query', queryBody(specs[i]!, false), () => false, REQUEST_TIMEOUT_MS));
      const n = rs.filter((r) => REFUSALS.has(r.status)).length;
      if (alone.status === 200) wouldFit += n;
      if (refusedSamples.length < 4) refusedSamples.push({ request: i, under_load: rs.filter((r) => REFUSALS.has(r.status)).map((r) => ({ status: r.status, code: r.code, ...r.errorDetails })), alone: alone.status });
    }
    await waitIdle(port);
    await sleep(SETTLE_MS);
    const final = gpuUsed();
    const finalDevice = await deviceFigures(port);
    const logText = existsSync(logFile) ? readFileSync(logFile, 'utf8') : '';
    const oomLog = logText.split('\n').filter((l) => OOM.test(l));
    summary['memory'] = {
      card, source: gpu0.unavailable() === null ? 'nvml (GPU 0, read by the bench)' : null, ...(gpu0.unavailable() !== null ? { nvml_unavailable: gpu0.unavailable() } : {}),
      nvml_startup_bytes: startup, nvml_final_bytes: final, final_minus_startup_mib: startup !== null && final !== null ? mib(final - startup) : null,
      bursts: memory, debug_memory_startup: startupDevice, debug_memory_final: finalDevice,
    };
    summary['guard'] = {
      refused_requests: refused.reduce((s, [, rs]) => s + rs.filter((r) => REFUSALS.has(r.status)).length, 0),
      refused_checked_alone: Math.min(refused.length, 16), refused_that_would_have_fit: wouldFit,
      refused_definition: 'a 413/429/503 under load whose request, sent again alone to the idle server, is answered 200',
      refused_samples: refusedSamples,
      oom_errors: oomReplies + oomLog.length, oom_log_lines: oomLog.slice(0, 3).map((l) => l.slice(0, 300)),
    };
    await rg.stop(true);
    rg = undefined;

    // ---- the peer: the same chats (rebuilt from the citations ragguard streamed), the same lengths
    summary['peer'] = await peer(specs, ourReplies, levels, card);
  } finally {
    killAll();
    if (!keptIndex) await rm(indexDir, { recursive: true, force: true });
    if (!keptLog) await rm(logFile, { force: true });
    if (STANDIN && !env['LLAMA_BIN']) await rm(LLAMA_BIN, { recursive: true, force: true });
  }
  summary['levels'] = levels.map((l) => {
    const o = l['ragguard'] as ReturnType<typeof summarise>;
    const p = l['peer'] as ReturnType<typeof summarise> | undefined;
    return {
      concurrency: l['concurrency'], card,
      ragguard: { requests_per_s: o.requests_per_s, ttft_p50_ms: o.ttft_p50_ms, ttft_p95_ms: o.ttft_p95_ms, latency_p50_ms: o.latency_p50_ms, latency_p95_ms: o.latency_p95_ms, statuses: o.statuses },
      peer: p ? { requests_per_s: p.requests_per_s, ttft_p50_ms: p.ttft_p50_ms, ttft_p95_ms: p.ttft_p95_ms, latency_p50_ms: p.latency_p50_ms, latency_p95_ms: p.latency_p95_ms, statuses: p.statuses } : null,
      ratio_requests_per_s: p && p.requests_per_s > 0 ? +(o.requests_per_s / p.requests_per_s).toFixed(3) : null,
      p95_ours_over_peer: p && p.latency_p95_ms && o.latency_p95_ms !== null ? +(o.latency_p95_ms / p.latency_p95_ms).toFixed(2) : null,
    };
  });
  const at64 = (summary['levels'] as { concurrency: unknown; ratio_requests_per_s: number | null; p95_ours_over_peer: number | null }[]).find((l) => l.concurrency === 64);
  const g = summary['guard'] as { oom_errors: number; refused_that_would_have_fit: number };
  summary['goals'] = {
    at_64_ratio_ge_1_5_and_p95_no_worse: at64 && at64.ratio_requests_per_s !== null && at64.p95_ours_over_peer !== null ? at64.ratio_requests_per_s >= 1.5 && at64.p95_ours_over_peer <= 1 : null,
    oom_errors_0: g.oom_errors === 0, refused_that_would_have_fit_0: g.refused_that_would_have_fit === 0,
    memory_back_within_4_mib: ((m) => (m === null ? null : Math.abs(m) <= 4))((summary['memory'] as { final_minus_startup_mib: number | null }).final_minus_startup_mib),
  };
  console.log(JSON.stringify(summary));
  return 0;
}

function errorCodes(rs: readonly OurReply[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const r of rs) {
    const k = r.code ?? (r.error ? r.error.slice(0, 60) : undefined);
    if (k) out[k] = (out[k] ?? 0) + 1;
  }
  return out;
}

async function peer(specs: Spec[], ours: Map<number, OurReply[]>, levels: Record<string, unknown>[], card: string): Promise<Record<string, unknown>> {
  const bin = path.join(LLAMA_BIN, 'llama-server');
  if (!LLAMA_BIN || !existsSync(bin)) return { error: `${LLAMA_BIN ? bin : 'LLAMA_BIN'} is not set or not there (run-gguf.sh's llama step builds it)` };
  // Each request's chat from the citations ragguard streamed for it (any level), and ragguard's completion tokens.
  const chats: { messages: ChatMessage[]; maxTokens: number }[] = [];
  for (const s of specs) {
    const rs = ours.get(s.i) ?? [];
    const withCitations = rs.find((r) => r.status === 200 && r.citations);
    const citations = withCitations?.citations ?? rs.find((r) => r.citations)?.citations ?? [];
    chats.push({ messages: await chatFor(s.q.question, citations), maxTokens: Math.max(1, withCitations?.completionTokens ?? s.maxNewTokens ?? 64) });
  }
  const np = MAX_LEVEL;
  const args = ['-m', GGUF, '--host', '127.0.0.1', '--port', '0', '-ngl', '99', '-np', String(np), '-c', String(np * LLAMA_CTX)];
  const port = await freePort();
  args[args.indexOf('--port') + 1] = String(port);
  const before = gpuUsed();
  let log = '';
  const t0 = performance.now();
  const proc = spawn(bin, args, {
    env: { ...process.env, LD_LIBRARY_PATH: `${LLAMA_BIN}:${process.env['LD_LIBRARY_PATH'] ?? ''}` }, stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(proc);
  let spawnError: string | undefined;
  proc.on('error', (e) => (spawnError = e.message));
  proc.stdout!.on('data', (d: Buffer) => (log = (log + d.toString()).slice(-8000)));
  proc.stderr!.on('data', (d: Buffer) => (log = (log + d.toString()).slice(-8000)));
  const out: Record<string, unknown> = { binary: bin, args: args.join(' '), card };
  try {
    for (let i = 0; ; i++) {
      if (spawnError || proc.exitCode !== null || proc.signalCode !== null) return { ...out, error: `llama-server exited (${spawnError ?? proc.exitCode ?? proc.signalCode}): ${log.split('\n').slice(-6).join(' | ')}` };
      if (i > 600) return { ...out, error: 'llama-server not healthy within 5 minutes' };
      const ok = await fetch(`http://127.0.0.1:${port}/health`, { signal: AbortSignal.timeout(2000) }).then((r) => r.ok, () => false);
      if (ok) break;
      await sleep(500);
    }
    out['start_s'] = r1((performance.now() - t0) / 1000);
    out['nvml_before_start_bytes'] = before;
    out['nvml_loaded_bytes'] = gpuUsed();
    const ask = async (i: number) => {
      const chat = chats[i]!;
      const r = await post(port, '/v1/chat/completions', {
        messages: chat.messages, max_tokens: chat.maxTokens, ignore_eos: true, temperature: 0, stream: true, stream_options: { include_usage: true },
      }, (e) => {
        if (e.data === '[DONE]') return false;
        try {
          const c = (JSON.parse(e.data) as { choices?: { delta?: { content?: string } }[] }).choices?.[0]?.delta?.content;
          return typeof c === 'string' && c.length > 0;
        } catch {
          return false;
        }
      }, REQUEST_TIMEOUT_MS);
      let usage: { prompt_tokens?: number; completion_tokens?: number } | undefined;
      let pieces = 0;
      for (const e of r.events) {
        if (e.data === '[DONE]') continue;
        try {
          const chunk = JSON.parse(e.data) as { usage?: typeof usage; choices?: { delta?: { content?: string } }[] };
          if (chunk.usage) usage = chunk.usage;
          if (chunk.choices?.[0]?.delta?.content) pieces++;
        } catch { /* not JSON */ }
      }
      // Without a usage chunk (an older llama-server): each content chunk is one token as it streams them.
      return { status: r.status, ms: r.ms, ttftMs: r.ttftMs, promptTokens: usage?.prompt_tokens, completionTokens: usage?.completion_tokens ?? pieces, ...(r.error ? { error: r.error } : {}) };
    };
    await ask(0); // warm-up
    for (const l of levels) {
      const c = l['concurrency'] as number;
      const sampler = peakSampler();
      const b = await closedLoop(specs.length, c, ask);
      const peak = sampler.stop();
      const row = { side: 'llama-server', card, concurrency: c, ...summarise(b.results, b.seconds), nvml_peak_bytes: peak };
      l['peer'] = row;
      console.log(JSON.stringify(row));
    }
    out['nvml_after_bytes'] = gpuUsed();
    return out;
  } finally {
    proc.kill('SIGKILL');
  }
}

main().then((code) => {
  clearTimeout(deadline);
  process.exit(code);
}, (e: unknown) => {
  killAll();
  console.log(JSON.stringify({ ...summary, error: e instanceof Error ? e.message.slice(0, 2000) : String(e) }));
  process.exit(1);
});
