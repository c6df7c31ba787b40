/**
 * Memory guards under an adversarial mix: the same server (same models, index and KV pool) at a memory
 * budget that it overflows with guards off, measured with guards on and off in one run.
 *
 * Mix: long contexts (16 chunks into a 1536-token prompt budget), top_k up to 100, max_new_tokens at
 * the limit, half of the requests naming a LoRA adapter (the sample adapters that fit the decoder), in
 * bursts of BENCH_GUARD_BURST concurrent requests over real HTTP on loopback.
 *
 * Measured (peak-meter.ts) on the host by two meters: ONNX Runtime's accounted bytes (the counting
 * allocator every CPU session allocates through: what the models asked for) and the kernel's resident
 * high-water mark (VmHWM: what the process really held, allocator scatter included; garbage collected
 * and free heap returned to the OS before each window). With the models on a GPU
 * (RAGGUARD_EXECUTION_PROVIDER=webgpu), by NVML's device memory sampled every ms:
 *   overflow            a burst whose peak growth, by either meter, exceeds the workspace the budget
 *                       leaves that server (budget - weights - adapter slots - index - the allocator's
 *                       warm cache - KV pool: RagService.workspaceBytes, its own
 *                       figures: with the CUDA decoder its device bytes are the accountant's for the pool
 *                       that server allocated, which BENCH_GUARD_WORKSPACE_MB only approximates): the
 *                       process went over its budget. Resident memory may also grow by the part of the
 *                       allocator's warm cache not resident when the burst began (not yet filled, or
 *                       blocks a run wrote only in part): the budget holds the cache at its limit
 *                       (RAGGUARD_ALLOCATOR_WARM_BYTES), as it holds the weights.
 *   prediction_error    per request run alone: |predicted - measured| / measured, where predicted is the
 *                       memory model's workspace for the request as it ran (calibrated at start-up by
 *                       the profile run, on the meter RAGGUARD_HOST_METER names: accounted bytes by
 *                       default) and measured its peak growth on that same meter. The resident meter's
 *                       error is reported beside it (prediction_error_p95_resident). The KV pool is
 *                       allocated up front, so a request's KV is not part of its growth.
 *   unclear_errors      replies other than 200, or 413/503 with {error: {code, message}} (413 and 503
 *                       memory_busy also with predicted_bytes and budget_bytes; 503 with Retry-After).
 *   served_fraction     200s / requests, guards on.
 * Last line: JSON.
 */
import { readdir, readFile } from 'node:fs/promises';
import v8 from 'node:v8';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { mkdtemp, rm } from 'node:fs/promises';
import { loadConfig, type Config } from '../src/config/config.js';
import { seededRandom } from '../src/generate/sampler.js';
import { nvmlReader, usedBytes } from '../src/guards/nvml.js';
import { gpuPeakMeter, hostMeter, hostPeakMeter, measurePeak, procStatusBytes, settledResident } from '../src/guards/peak-meter.js';
import { CudaModelRunner } from '../src/backends/cuda/cuda-runner.js';
import { loadModels, RagService } from '../src/service/rag.js';
import { setRunObserver, type RunObserver, type RunStage } from '../src/runtime/run-meter.js';
import { countingAllocator } from '../src/backends/ort/ort-allocator.js';
import { mallocStats } from '../src/runtime/malloc.js';
import { createApp } from '../src/server/app.js';

const ROOT = path.resolve(import.meta.dirname, '..');
const MB = 1 << 20;
const WORKSPACE = Number(process.env['BENCH_GUARD_WORKSPACE_MB'] ?? 112) * MB;
const KV_POOL = Number(process.env['BENCH_GUARD_KV_MB'] ?? 48) * MB;
const BURST = Number(process.env['BENCH_GUARD_BURST'] ?? 24);
const BURSTS = Number(process.env['BENCH_GUARD_BURSTS'] ?? 3);
const ALONE = Number(process.env['BENCH_GUARD_ALONE'] ?? 24);


const env: Record<string, string> = {
  PORT: '0',
  RAGGUARD_PROMPT_BUDGET: '1536',
  RAGGUARD_MAX_TOP_K: '100',
  RAGGUARD_MAX_RERANK_TOP_N: '16',
  RAGGUARD_MAX_NEW_TOKENS_LIMIT: '64',
  RAGGUARD_MAX_NUM_SEQS: '32',
  RAGGUARD_MAX_CONCURRENT: '32',
  RAGGUARD_QUEUE_LENGTH: '64',
  RAGGUARD_QUEUE_TIMEOUT_MS: '60000',
  RAGGUARD_PROFILE_RUN: 'false',
};
const indexDir = await mkdtemp(path.join(tmpdir(), 'ragguard-bench-guard-'));
const config = (extra: Record<string, string>): Config => loadConfig({ ...process.env, ...env, RAGGUARD_INDEX_DIR: indexDir, ...extra });

// Load once, ingest the corpus, then size the budget: what the server holds before its KV pool + KV pool + WORKSPACE.
const first = config({});
const models = await loadModels(first);
// Where a request's runs allocate: the encoders' provider, and the decoder's unless it is the CUDA
// backend, whose every device byte is allocated at start-up (its runs add nothing: `preallocated`).
const preallocated = models.decoder.preallocated;
const onGpu = [models.embedder, models.reranker].some((m) => m.provider !== 'cpu') || (!preallocated && models.decoder.provider !== 'cpu');
// With the CUDA decoder, NVML also watches the device throughout: it must not grow past what the accountant allocated.
const device = preallocated ? gpuPeakMeter(nvmlReader()) : undefined;
// The profile run's meter (predictions are calibrated on it) and, on the host, resident memory beside it.
const meter = onGpu ? gpuPeakMeter(nvmlReader()) : hostMeter(first);
const resident = onGpu ? meter : hostPeakMeter();
if (!meter.available) throw new Error(`bench:guard cannot measure peaks here: ${meter.reason}`);
const accounted = meter !== resident;

/**
 * Peak growth of `work` on the prediction meter (bytes) and on resident memory; `top` is the
 * prediction meter's absolute peak (accounted bytes only: their live total moves with allocations
 * alone, so peaks of successive windows compare).
 */
async function measure<T>(work: () => Promise<T>): Promise<{ value: T; bytes: number; residentBytes: number; top: number }> {
  if (!accounted) {
    const { value, bytes } = await measurePeak(meter, work);
    return { value, bytes, residentBytes: bytes, top: bytes };
  }
  const base = meter.resident();
  // The resident window inside: its garbage collection and trim change no accounted byte.
  const outer = await measurePeak(meter, () => measurePeak(resident, work));
  return { value: outer.value.value, bytes: outer.bytes, residentBytes: outer.value.bytes, top: base + outer.bytes };
}
const loader = await RagService.start(first, models);
// What the server's budget holds before its KV pool (RagService.staticBytes: weights, adapter slots, index,
// the allocator's warm cache), the same sum the server plans its own budget from.
const staticBytes = loader.staticBytes;
const budget = String(staticBytes + KV_POOL + WORKSPACE);
const budgetEnv = { RAGGUARD_MEMORY_BUDGET: budget, RAGGUARD_KV_CACHE_BYTES: String(KV_POOL), RAGGUARD_CORPUS_DIR: '' };
const guarded = new RagService(config({ ...budgetEnv, RAGGUARD_PROFILE_RUN: 'true' }), models, loader.store);
const profile = await guarded.profileMemory();
const unguarded = new RagService(config({ ...budgetEnv, RAGGUARD_GUARDS: 'false' }), models, loader.store);

interface Ask {
  query: string;
  top_k: number;
  rerank_top_n: number;
  max_new_tokens: number;
  adapter?: string;
}

// The adapters under RAGGUARD_ADAPTER_DIR this decoder can run (setup's samples include some for the
// default decoder and some for the small test one), by name.
const names = guarded.adapters.unavailable ? [] : (await readdir(guarded.adapters.dir).catch(() => [] as string[])).sort();
const usable: string[] = [];
for (const name of names) if (await guarded.adapters.inspect(name).then(() => true, () => false)) usable.push(name);

const questions = JSON.parse(await readFile(path.join(ROOT, 'data', 'questions.json'), 'utf8')) as { question: string }[];
const random = seededRandom(7);
const pick = <T>(xs: readonly T[]) => xs[Math.floor(random() * xs.length)]!;
const mix = (n: number): Ask[] => Array.from({ length: n }, () => ({
  query: pick(questions).question,
  top_k: pick([20, 50, 100, 100]),
  rerank_top_n: pick([3, 8, 16, 16, 16]),
  max_new_tokens: pick([16, 32, 64, 64]),
  ...(usable.length > 0 && random() < 0.5 ? { adapter: pick(usable) } : {}),
}));

interface Reply {
  status: number;
  clear: boolean;
  body: { guard?: { reshaped?: unknown[]; as_run?: { predicted_workspace_bytes: number; predicted_stage_bytes: Record<RunStage, number> } } };
}

async function listen(service: RagService): Promise<{ url: string; close(): Promise<void> }> {
  const server = createApp(service).listen(0, '127.0.0.1');
  await new Promise((r) => server.once('listening', r));
  const { port } = server.address() as AddressInfo;
  return { url: `http://127.0.0.1:${port}/query`, close: () => new Promise((r) => server.close(() => r())) };
}

function isClear(status: number, headers: Headers, body: unknown): boolean {
  if (status === 200) return true;
  const e = (body as { error?: Record<string, unknown> } | null)?.error;
  if ((status !== 413 && status !== 503) || typeof e?.['code'] !== 'string' || typeof e['message'] !== 'string') return false;
  if (status === 503 && !headers.get('retry-after')) return false;
  const memory = e['code'] === 'request_too_large' || e['code'] === 'memory_busy';
  return !memory || (typeof e['predicted_bytes'] === 'number' && typeof e['budget_bytes'] === 'number');
}

async function send(url: string, ask: Ask): Promise<Reply> {
  try {
    const r = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(ask) });
    const body = (await r.json()) as Reply['body'];
    return { status: r.status, clear: isClear(r.status, r.headers, body), body };
  } catch {
    return { status: 0, clear: false, body: {} }; // connection failed: the least clear reply of all
  }
}

const p95 = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.ceil(0.95 * xs.length) - 1)] ?? NaN;
const mb = (b: number) => (b / MB).toFixed(1);

// 1. Prediction error: each request alone on the guarded server, each of its model runs measured on its
//    own (the observer below). Its measured peak: by accounted bytes, the highest live total of any of
//    its runs above the live total when the request started (buffers a request holds across runs, a
//    decoder's KV batch buffer, count in every run they outlive); by resident memory or NVML, whose
//    baselines move between windows, its largest run's growth.
const runs: { stage: RunStage; bytes: number; residentBytes: number; top: number }[] = [];
const recorder: RunObserver = {
  async observe<T>(stage: RunStage, run: () => Promise<T>): Promise<T> {
    const { value, ...m } = await measure(run);
    runs.push({ stage, ...m });
    return value;
  },
};
const on = await listen(guarded);
const errors: number[] = [];
const adapterErrors: number[] = [];
const residentErrors: number[] = [];
console.log(`budget ${mb(Number(budget))} MiB: weights+adapter slots+index+warm cache ${mb(staticBytes)}, KV pool ${mb(KV_POOL)}, workspace ${mb(WORKSPACE)} ` +
  `(as the guarded server sizes it: ${mb(guarded.workspaceBytes)}; the unguarded: ${mb(unguarded.workspaceBytes)})`);
console.log(`adapters in the mix: ${usable.join(', ') || 'none (none fits this decoder)'}`);
console.log(`profile run: ${profile.source === 'profile' ? `${JSON.stringify(profile.calibration)}, headroom ${profile.headroom.toFixed(3)}` : profile.reason}`);
console.log('\nalone: predicted vs measured workspace (MiB)');
setRunObserver(recorder);
const deviceBefore = device?.available ? usedBytes(nvmlReader().read()) : 0;
const deviceAlone = await measureDevice(async () => { for (const ask of mix(ALONE)) await alone(ask); });
async function alone(ask: Ask): Promise<void> {
  runs.length = 0;
  const start = meter.resident();
  const reply = await send(on.url, ask);
  const runBytes = (r: (typeof runs)[number]) => (accounted ? Math.max(0, r.top - start) : r.bytes);
  const bytes = Math.max(0, ...runs.map(runBytes));
  const predicted = reply.body.guard?.as_run?.predicted_workspace_bytes;
  if (reply.status !== 200 || predicted === undefined || bytes === 0) return;
  errors.push(Math.abs(predicted - bytes) / bytes);
  if (ask.adapter) adapterErrors.push(errors.at(-1)!);
  const residentBytes = Math.max(0, ...runs.map((r) => r.residentBytes));
  if (residentBytes > 0) residentErrors.push(Math.abs(predicted - residentBytes) / residentBytes);
  console.log(`  ${(ask.adapter ?? 'base').padEnd(10)} top_k ${String(ask.top_k).padStart(3)} top_n ${String(ask.rerank_top_n).padStart(2)} new ${String(ask.max_new_tokens).padStart(2)}: ` +
    `predicted ${mb(predicted).padStart(6)} measured ${mb(bytes).padStart(6)} error ${errors.at(-1)!.toFixed(3)}` +
    (accounted ? ` (resident ${mb(residentBytes).padStart(5)})  ` : '  ') +
    (['embed', 'rerank', 'prefill', 'decode'] as const).map((st) =>
      `${st} ${mb(reply.body.guard!.as_run!.predicted_stage_bytes[st])}/${mb(Math.max(0, ...runs.filter((r) => r.stage === st).map(runBytes)))}`).join(' '));
}

/** NVML's peak growth over `work` where the CUDA decoder runs (0 and not measured elsewhere). */
async function measureDevice(work: () => Promise<void>): Promise<number> {
  if (!device?.available) {
    await work();
    return 0;
  }
  return (await measurePeak(device, work)).bytes;
}

setRunObserver(undefined);

// 2. Bursts, guards on then off, the same requests.
const bursts = Array.from({ length: BURSTS }, () => mix(BURST));
const warmCache = accounted ? countingAllocator() : undefined;

/**
 * Where a burst's resident memory went, on the host: the highest value of each part seen while it ran
 * (sampled every 5 ms from the event loop, so a peak inside one native run can be missed) and what each
 * part still held after it (garbage collected, free heap trimmed), as growth over the part before it.
 * Parts: anonymous and file-backed resident pages (/proc/self/status), V8's heap (physical), ONNX
 * Runtime's accounted bytes (live, and the warm cache's kept blocks: counters only, as sampling the
 * cache's resident pages (pagemap) every 5 ms would load the machine it measures), the part of them in
 * malloc's blocks (those under 2 MiB; the rest lie in the allocator's regions), and glibc's other bytes
 * in use (malloc's in-use figure less that part: ONNX Runtime's own allocations outside the allocator,
 * faiss's, V8's C++ side). Before 2026-12-07 the results' `malloc` was glibc's whole figure, the
 * accounted small blocks included.
 */
interface Parts { anon: number; file: number; v8: number; accounted: number; accounted_in_malloc: number; malloc_other: number }
function partsNow(): Parts {
  const { RssAnon, RssFile } = procStatusBytes(['RssAnon', 'RssFile']);
  const counters = countingAllocator();
  const inMalloc = counters ? counters.heapLive() : 0;
  return {
    anon: RssAnon, file: RssFile, v8: v8.getHeapStatistics().total_physical_size,
    accounted: counters ? counters.live() + counters.warm() : 0, accounted_in_malloc: inMalloc,
    malloc_other: (mallocStats()?.inUseBytes ?? 0) - inMalloc,
  };
}
const partNames = ['anon', 'file', 'v8', 'accounted', 'accounted_in_malloc', 'malloc_other'] as const;
async function watchParts<T>(work: () => Promise<T>): Promise<{ value: T; peak: Parts; kept: Parts }> {
  const settled = async () => { await settledResident(); return partsNow(); };
  const before = await settled();
  const peak = { ...before };
  const sample = () => { const now = partsNow(); for (const k of partNames) peak[k] = Math.max(peak[k], now[k]); };
  const timer = setInterval(sample, 5);
  try {
    const value = await work();
    sample();
    const after = await settled();
    const growth = (p: Parts): Parts => Object.fromEntries(partNames.map((k) => [k, p[k] - before[k]])) as unknown as Parts;
    return { value, peak: growth(peak), kept: growth(after) };
  } finally {
    clearInterval(timer);
  }
}
const partsLine = (p: Parts) => partNames.map((k) => `${k} ${mb(p[k])}`).join(', ');

async function burstPhase(url: string, workspace: number): Promise<{ overflows: number; peaks: number[]; residentPeaks: number[]; warmRooms: number[]; replies: Reply[]; parts: { peak: Parts; kept: Parts }[] }> {
  let overflows = 0;
  const peaks: number[] = [];
  const residentPeaks: number[] = [];
  const replies: Reply[] = [];
  const parts: { peak: Parts; kept: Parts }[] = [];
  const warmRooms: number[] = [];
  for (const asks of bursts) {
    // The allocator's warm cache is budgeted at its limit beside the weights (RagService.staticBytes):
    // freed run buffers it keeps may make resident memory grow by what of it is not resident yet (not
    // filled, or blocks a run wrote only in part, which fault in at their next use).
    // Read once: each read is a pagemap pass over the kept blocks, and two reads could disagree.
    let warmRoom = 0;
    if (warmCache) {
      const warmResident = warmCache.warmResident();
      warmRoom = warmCache.warmLimit() - warmResident;
      console.log(`warm cache before the burst: ${mb(warmCache.warm())} MiB kept, ${mb(warmResident)} of them resident, limit ${mb(warmCache.warmLimit())}`);
    }
    warmRooms.push(warmRoom);
    const watched = await watchParts(() => measure(() => Promise.all(asks.map((a) => send(url, a)))));
    const { value, bytes, residentBytes } = watched.value;
    if (!onGpu) parts.push({ peak: watched.peak, kept: watched.kept });
    replies.push(...value);
    peaks.push(bytes);
    residentPeaks.push(residentBytes);
    if (bytes > workspace || residentBytes > workspace + warmRoom) overflows++;
  }
  return { overflows, peaks, residentPeaks, warmRooms, replies, parts };
}
let g!: Awaited<ReturnType<typeof burstPhase>>;
let u!: Awaited<ReturnType<typeof burstPhase>>;
const deviceGuarded = await measureDevice(async () => { g = await burstPhase(on.url, guarded.workspaceBytes); });
await on.close();
const off = await listen(unguarded);
const deviceUnguarded = await measureDevice(async () => { u = await burstPhase(off.url, unguarded.workspaceBytes); });
await off.close();
const runner = guarded.engine.runner;
const deviceFigures = runner instanceof CudaModelRunner ? {
  // The decoder's device bytes by the accountant, for the guarded service's runner; NVML's used bytes grow by
  // nothing while requests run (their runs use what start-up allocated), alone and in bursts, guards on or off.
  cuda_decoder_accounted_bytes: runner.memory().total,
  nvml_growth_alone_bytes: deviceAlone,
  nvml_growth_bursts_guarded_bytes: deviceGuarded,
  nvml_growth_bursts_unguarded_bytes: deviceUnguarded,
  nvml_used_at_start_bytes: deviceBefore,
  // NVML's growth beyond the accountant's figures, relative to them: the decoder's error, where nothing
  // else of the process is on the device (with the encoders there too, their buffers grow it as well).
  device_prediction_error: onGpu ? null : +(Math.max(deviceAlone, deviceGuarded, deviceUnguarded) / runner.memory().total).toFixed(4),
} : {};

const count = (rs: Reply[], s: number) => rs.filter((r) => r.status === s).length;
const peaksOf = (r: typeof g) => r.peaks.map((b, i) => (accounted ? `${mb(b)}/${mb(r.residentPeaks[i]!)}` : mb(b))).join(', ');
console.log(`\nbursts of ${BURST}: peak workspace per burst, MiB${accounted ? ' (accounted/resident)' : ''}`);
console.log(`${' '.repeat(62)}  200   413   503  unclear  overflows`);
for (const [name, r] of [['guards on ', g], ['guards off', u]] as const) {
  console.log(`  ${name}    ${peaksOf(r).padEnd(46)} ${String(count(r.replies, 200)).padStart(5)} ${String(count(r.replies, 413)).padStart(5)} ` +
    `${String(count(r.replies, 503)).padStart(5)} ${String(r.replies.filter((x) => !x.clear).length).padStart(8)} ${String(r.overflows).padStart(10)}`);
}
if (!onGpu) {
  console.log('\nresident growth by part, MiB: the highest seen while each burst ran / what it still held after');
  for (const [name, r] of [['guards on ', g], ['guards off', u]] as const) {
    r.parts.forEach((p, i) => console.log(`  ${name} burst ${i + 1}: peak ${partsLine(p.peak)}\n${' '.repeat(22)}kept ${partsLine(p.kept)}`));
  }
}
await rm(indexDir, { recursive: true, force: true });
console.log(JSON.stringify({
  overflows: g.overflows,
  unguarded_overflows: u.overflows,
  unclear_errors: g.replies.filter((r) => !r.clear).length,
  unguarded_unclear_errors: u.replies.filter((r) => !r.clear).length,
  // null where no run was measured (a meter that sees none of the runs, e.g. WebGPU's device memory, which NVML does not show per run).
  prediction_error_p95: errors.length > 0 ? +p95(errors).toFixed(3) : null,
  prediction_error_median: errors.length > 0 ? +[...errors].sort((a, b) => a - b)[Math.floor(errors.length / 2)]!.toFixed(3) : null,
  predictions_measured: errors.length,
  adapters: usable,
  ...(adapterErrors.length > 0 ? { prediction_error_p95_with_adapter: +p95(adapterErrors).toFixed(3), predictions_with_adapter: adapterErrors.length } : {}),
  adapters_loaded_after: guarded.adapters.stats().loaded.length + unguarded.adapters.stats().loaded.length,
  ...(accounted ? { prediction_error_p95_resident: +p95(residentErrors).toFixed(3) } : {}),
  served_fraction: +(count(g.replies, 200) / g.replies.length).toFixed(3),
  headroom: profile.source === 'profile' ? +profile.headroom.toFixed(3) : 0,
  reshaped_requests: g.replies.filter((r) => (r.body.guard?.reshaped?.length ?? 0) > 0).length,
  unguarded_served_fraction: +(count(u.replies, 200) / u.replies.length).toFixed(3),
  budget_bytes: Number(budget),
  workspace_bytes: guarded.workspaceBytes,
  unguarded_workspace_bytes: unguarded.workspaceBytes,
  peak_workspace_bytes: Math.max(...g.peaks, ...g.residentPeaks),
  unguarded_peak_workspace_bytes: Math.max(...u.peaks, ...u.residentPeaks),
  // The budgeted warm cache's part not resident when each burst began: room for resident growth that is not the burst's.
  ...(warmCache ? { warm_room_mib: g.warmRooms.map((b) => +mb(b)), unguarded_warm_room_mib: u.warmRooms.map((b) => +mb(b)) } : {}),
  ...(onGpu ? {} : { burst_parts_mib: Object.fromEntries((['guarded', 'unguarded'] as const).map((side) => [side, (side === 'guarded' ? g : u).parts.map((p) => ({
    peak: Object.fromEntries(partNames.map((k) => [k, +mb(p.peak[k])])), kept: Object.fromEntries(partNames.map((k) => [k, +mb(p.kept[k])])),
  }))])) }),
  measured_by: onGpu ? 'NVML device memory used, sampled every ms'
    : accounted ? 'ONNX Runtime accounted bytes (counting allocator); overflows also by resident high-water mark (VmHWM)'
    : 'host resident high-water mark (VmHWM)',
  where: guarded.models.decoder.provider,
  encoders_on: guarded.models.embedder.provider,
  ...deviceFigures,
}));
process.exit(0);
