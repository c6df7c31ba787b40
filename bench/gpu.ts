/**
 * bench:gpu (on the GPU host): the CUDA backend through the engine (scheduler, block manager, paged KV
 * pool, device sampling) against transformers on torch, eager and static cache + torch.compile, on the
 * same Hugging Face checkpoint and the same GPU, in one run.
 *
 *   BENCH_GPU_MODELS=dir1,dir2 npm run bench:gpu        (each a checkpoint from scripts/gpu/hf_models.py)
 *
 * Per checkpoint: 32 requests x 64 new tokens (EOS ignored) from the same random 24-token prompts at 1, 8
 * and 32 concurrent (a request starts as soon as one of the c in flight ends): decode tokens/s, TTFT p50
 * (a generate of one token for c prompts at once, as the baseline measures it), greedy ids compared with
 * torch's on the same prompts; and the ratio to each baseline. BENCH_GPU_BIG=dir (a 7B checkpoint) adds
 * decode at batch 1 as a fraction of the card's peak memory bandwidth (gpu-common.ts cardPeak: the card
 * named, H100 3.35 TB/s, H200 4.8 TB/s; weights + KV read per step over the step time) and tokens/s at batch 64. BENCH_GPU_RAG=1 adds TTFT for a 2k-token prompt alone and with 32
 * in flight. Each case prints a JSON line; the last line is the summary.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { StepProfile } from '../src/backends/cuda/binding.js';
import { CudaModelRunner } from '../src/backends/cuda/cuda-runner.js';
import { BLOCK, cardPeak, engineFor, gpuName, randomPrompts } from './gpu-common.js';
import { kvBytesPerToken } from '../src/backends/cuda/step-pack.js';
import { Engine } from '../src/generate/engine.js';
import { nvmlReader, usedBytes } from '../src/guards/nvml.js';

const REQUESTS = Number(process.env.BENCH_GPU_REQUESTS ?? 32);
const NEW = Number(process.env.BENCH_GPU_NEW ?? 64);
const PROMPT = Number(process.env.BENCH_GPU_PROMPT ?? 24);
const LEVELS = (process.env.BENCH_GPU_CONCURRENCY ?? '1,8,32').split(',').map(Number);
const MODES = process.env.BENCH_GPU_TORCH_MODES ?? 'eager,compiled';
const CARD = cardPeak(gpuName());
/** BENCH_GPU_WEIGHTS=fp8: the checkpoints' matrices as FP8 made at load (RAGGUARD_CUDA_WEIGHTS=fp8). */
const WEIGHTS = process.env.BENCH_GPU_WEIGHTS === 'fp8' ? 'fp8' as const : undefined;
/** BENCH_GPU_FP8_GEMM=cublaslt (with BENCH_GPU_WEIGHTS=fp8): FP8 products of more than 8 rows through cuBLASLt (cuda-runner.ts fp8Gemm). */
const FP8_GEMM = process.env.BENCH_GPU_FP8_GEMM === 'cublaslt' ? 'cublaslt' as const : undefined;

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}



/** `requests` generations with at most `c` in flight; returns tokens/s and the outputs. */
async function closedLoop(engine: Engine, prompts: number[][], c: number, maxNewTokens: number): Promise<{ tokensPerS: number; outputs: number[][]; seconds: number }> {
  const outputs: number[][] = new Array(prompts.length);
  let next = 0;
  const t0 = performance.now();
  const worker = async () => {
    while (next < prompts.length) {
      const i = next++;
      outputs[i] = (await engine.generate(prompts[i]!, { maxNewTokens, temperature: 0, ignoreEos: true })).ids;
    }
  };
  await Promise.all(Array.from({ length: c }, worker));
  const seconds = (performance.now() - t0) / 1000;
  return { tokensPerS: (prompts.length * maxNewTokens) / seconds, outputs, seconds };
}

async function ttft(engine: Engine, prompts: number[][]): Promise<number> {
  const t0 = performance.now();
  await Promise.all(prompts.map((p) => engine.generate(p, { maxNewTokens: 1, temperature: 0, ignoreEos: true })));
  return performance.now() - t0;
}

interface TorchCase { engine: string; dtype: string; concurrency: number; tokens_per_s?: number; ttft_ms_p50?: number; greedy_ids?: number[][]; margins?: number[][]; error?: string }

/** torch's top-2 margin (relative to the logit scale) under which two engines' greedy choices may part. */
const NEAR_TIE = 0.02;

/**
 * Our greedy ids against torch's, row by row: equal in full, parted where torch's own top-1/top-2 margin was
 * under NEAR_TIE (float16/bfloat16 rounding decides those), or parted elsewhere (a real difference).
 */
function compareGreedy(theirs: readonly number[][], margins: readonly number[][] | undefined, ours: readonly (number[] | undefined)[]) {
  let equal = 0, nearTie = 0;
  const elsewhere: { row: number; position: number; margin: number | null }[] = [];
  theirs.forEach((ids, r) => {
    const mine = ours[r] ?? [];
    const at = ids.findIndex((id, i) => id !== mine[i]);
    if (at < 0) { equal++; return; }
    const margin = margins?.[r]?.[at] ?? null;
    if (margin !== null && margin < NEAR_TIE) nearTie++;
    else elsewhere.push({ row: r, position: at, margin });
  });
  return { greedy_equal: `${equal}/${theirs.length}`, parted_at_near_tie: nearTie, parted_elsewhere: elsewhere };
}

function torchBaseline(dir: string, prompts: number[][]): TorchCase[] {
  if (!MODES) return []; // BENCH_GPU_TORCH_MODES='' : this backend alone
  const file = path.join(mkdtempSync(path.join(tmpdir(), 'bench-gpu-')), 'prompts.json');
  writeFileSync(file, JSON.stringify(prompts));
  const out = execFileSync('python3', ['scripts/gpu/torch_decode.py', '--model', dir, '--prompts', file, '--new', String(NEW),
    '--concurrency', LEVELS.join(','), '--modes', MODES], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'], maxBuffer: 1 << 28 });
  return out.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as TorchCase);
}

let current: Engine | undefined;
process.on('exit', (code) => {
  // A generation that never settles empties the event loop (exit 13): say where the engine stood.
  const s = current?.scheduler;
  console.error(`bench:gpu exits with ${code}${s ? `; engine: ${s.waiting.length} waiting, ${s.running.length} running, stats ${JSON.stringify(current!.stats)}` : ''}`);
});

async function benchModel(dir: string): Promise<Record<string, unknown>> {
  const maxSeqs = Math.max(...LEVELS);
  console.error(`bench:gpu: loading ${dir}`);
  const runner = await CudaModelRunner.load(dir, { numBlocks: 4096, blockSize: BLOCK, maxBatchedTokens: 4096, maxSeqs, weights: WEIGHTS, ...(FP8_GEMM ? { fp8Gemm: FP8_GEMM } : {}) });
  const prompts = randomPrompts(REQUESTS, PROMPT, runner.shape.vocabSize, 11);
  const ours: Record<number, { tokens_per_s: number; ttft_ms_p50: number; outputs: number[][] }> = {};
  let breakdown: Record<string, unknown> | undefined;
  for (const c of LEVELS) {
    const engine = (current = engineFor(runner, c));
    console.error(`bench:gpu: ${c} concurrent`);
    await closedLoop(engine, prompts.slice(0, c), c, 4); // warm-up
    const run = await closedLoop(engine, prompts, c, NEW);
    const t: number[] = [];
    for (let i = 0; i + c <= prompts.length && t.length < 4; i += c) t.push(await ttft(engine, prompts.slice(i, i + c)));
    ours[c] = { tokens_per_s: Math.round(run.tokensPerS), ttft_ms_p50: Number(median(t).toFixed(2)), outputs: run.outputs };
    if (c === 1) breakdown = await stepBreakdown(runner, engine, prompts[0]!, 1000 / run.tokensPerS);
    console.log(JSON.stringify({ model: path.basename(dir), engine: 'ragguard-cuda', dtype: runner.dtype, concurrency: c, tokens_per_s: ours[c]!.tokens_per_s, ttft_ms_p50: ours[c]!.ttft_ms_p50 }));
  }
  const memory = runner.memory();
  runner.close();
  const torch = torchBaseline(dir, prompts);
  const rows = LEVELS.map((c) => {
    const row: Record<string, unknown> = { concurrency: c, ragguard: { tokens_per_s: ours[c]!.tokens_per_s, ttft_ms_p50: ours[c]!.ttft_ms_p50 } };
    for (const t of torch.filter((x) => x.concurrency === c)) {
      const mode = t.engine.replace('torch-', '');
      if (t.error || t.tokens_per_s === undefined) {
        row[mode] = { error: t.error };
        continue;
      }
      // The baseline's first timed batch: prompts 0..c-1.
      row[mode] = {
        tokens_per_s: t.tokens_per_s, ttft_ms_p50: t.ttft_ms_p50, ratio: Number((ours[c]!.tokens_per_s / t.tokens_per_s).toFixed(2)),
        ...compareGreedy(t.greedy_ids ?? [], t.margins, ours[c]!.outputs),
      };
    }
    return row;
  });
  return { model: path.basename(dir), dtype: runner.dtype, device_memory: memory, rows, ...(breakdown ? { batch1_breakdown: breakdown } : {}) };
}

/**
 * Where a batch-1 decode step's time goes: the engine's step (host and device), the graph replayed alone
 * (device only; the rest is the host's share: packing, the worker-thread call, scheduling), and the
 * device time by phase over steps launched directly (no graph: each kernel's launch shows in its phase).
 */
async function stepBreakdown(runner: CudaModelRunner, engine: Engine, prompt: number[], stepMs: number): Promise<Record<string, unknown>> {
  const graphMs = runner.graphTime(1, 200);
  const steps = 32;
  const { value, profile } = await runner.profiled(() => closedLoop(engine, [prompt], 1, steps));
  // The same steps with every GEMM on cuBLAS: what the GEMV kernel changes, phase by phase.
  const cublas = await runner.profiled(() => closedLoop(engine, [prompt], 1, steps), 0);
  return {
    step_ms: Number(stepMs.toFixed(4)), graph_ms: Number(graphMs.toFixed(4)), host_ms: Number((stepMs - graphMs).toFixed(4)),
    direct_step_ms: Number(((value.seconds * 1000) / steps).toFixed(4)), direct_ms_by_phase: perStepMs(profile),
    cublas_direct_step_ms: Number(((cublas.value.seconds * 1000) / steps).toFixed(4)), cublas_direct_ms_by_phase: perStepMs(cublas.profile),
  };
}

function perStepMs(profile: StepProfile | null): Record<string, number> | null {
  return profile && profile.steps > 0
    ? Object.fromEntries(Object.entries(profile.ms).map(([k, v]) => [k, Number((v / profile.steps).toFixed(4))])) : null;
}

/** Decode at batch 1 of a big model as a fraction of the memory bandwidth, and tokens/s at batch 64. */
async function benchBig(dir: string): Promise<Record<string, unknown>> {
  const nvml = nvmlReader();
  const before = usedBytes(nvml.read());
  const runner = await CudaModelRunner.load(dir, { numBlocks: 2048, blockSize: BLOCK, maxBatchedTokens: 4096, maxSeqs: 64, weights: WEIGHTS, ...(FP8_GEMM ? { fp8Gemm: FP8_GEMM } : {}) });
  const nvmlDelta = usedBytes(nvml.read()) - before;
  const prompts = randomPrompts(64, 128, runner.shape.vocabSize, 5);
  const perToken = kvBytesPerToken(runner.checkpoint.config, runner.dtype);
  const one = engineFor(runner, 1);
  await closedLoop(one, prompts.slice(0, 1), 1, 8);
  const n = 128;
  const b1 = await closedLoop(one, prompts.slice(1, 2), 1, n);
  // Per step: every weight once, and the KV of the context so far (128 prompt tokens + the outputs). An
  // untied embedding table is not read (one row of it is): it is left out.
  const avgContext = 128 + n / 2;
  const { hiddenSize, vocabSize } = runner.shape;
  const embedSegment = runner.checkpoint.quant?.segments.find((s) => s.kind === 0);
  const embedBytes = embedSegment ? embedSegment.packedBytes : vocabSize * hiddenSize * 2;
  const unreadEmbedding = runner.checkpoint.config.tieEmbeddings ? 0 : (embedBytes * (vocabSize - 1)) / vocabSize;
  const bytesPerStep = runner.plan.weights - unreadEmbedding + avgContext * perToken;
  const stepS = b1.seconds / n; // includes the prefill: a slight under-estimate of the bandwidth
  const breakdown = await stepBreakdown(runner, one, prompts[2]!, stepS * 1000);
  const b64engine = engineFor(runner, 64);
  await closedLoop(b64engine, prompts.slice(0, 8), 8, 4);
  const b64 = await closedLoop(b64engine, prompts, 64, n);
  // Where a 64-row step's time goes: its graph replayed alone, and 32 steps launched directly, by phase
  // (what separates FP8's products from bfloat16's at this width). Prompts of 4 tokens: one short prefill step
  // among the 33 profiled.
  const b64GraphMs = runner.graphTime(64, 50);
  const b64Prof = await runner.profiled(() => closedLoop(b64engine, randomPrompts(64, 4, runner.shape.vocabSize, 17), 64, 32));
  const memory = runner.memory();
  const fp8GemmNote = FP8_GEMM ? runner.fp8GemmNote() : ''; // before close: the library's string goes with the engine
  runner.close();
  return {
    model: path.basename(dir), dtype: runner.dtype, weights: WEIGHTS ?? 'model', ...(FP8_GEMM ? { fp8_gemm: FP8_GEMM, fp8_gemm_note: fp8GemmNote } : {}), weights_bytes: runner.plan.weights,
    batch1: { tokens_per_s: Math.round(n / b1.seconds), ms_per_token: Number((stepS * 1000).toFixed(3)), bytes_per_step: bytesPerStep, card: CARD.card, peak_bytes_per_s: CARD.peak, bytes_per_s: Math.round(bytesPerStep / stepS),
      fraction_of_peak: CARD.peak ? Number((bytesPerStep / stepS / CARD.peak).toFixed(3)) : null,
      // As the H200 figures of 2026-12-03 (4bccb38) counted it (the whole embedding table too), for comparison.
      fraction_counting_embedding: CARD.peak ? Number(((bytesPerStep + unreadEmbedding) / stepS / CARD.peak).toFixed(3)) : null },
    batch64: { tokens_per_s: Math.round(b64.tokensPerS), step_ms: Number(((64 * 1000) / b64.tokensPerS).toFixed(3)), graph_ms: Number(b64GraphMs.toFixed(3)),
      direct_step_ms: Number(((b64Prof.value.seconds * 1000) / 32).toFixed(3)), direct_ms_by_phase: perStepMs(b64Prof.profile) },
    batch1_breakdown: breakdown,
    device_memory: memory, nvml_used_delta_at_load: nvmlDelta,
    // NVML sees the accountant's bytes plus the CUDA context and cuBLAS's own handle state.
    unaccounted_bytes: nvmlDelta - memory.total,
  };
}

/** TTFT of a 2k-token prompt alone and with 32 requests decoding. */
async function benchRag(dir: string): Promise<Record<string, unknown>> {
  const runner = await CudaModelRunner.load(dir, { numBlocks: 8192, blockSize: BLOCK, maxBatchedTokens: 4096, maxSeqs: 40 });
  const long = randomPrompts(3, 2048, runner.shape.vocabSize, 9);
  const engine = engineFor(runner, 40);
  await ttft(engine, [long[0]!]); // warm-up
  const alone = await ttft(engine, [long[1]!]);
  // Where a 2k prefill's time goes (the native phase marks; a timed run apart from the figure above).
  const phases = await runner.profiled(() => ttft(engine, [randomPrompts(1, 2048, runner.shape.vocabSize, 21)[0]!]));
  const background = randomPrompts(32, 24, runner.shape.vocabSize, 13).map((p) => engine.generate(p, { maxNewTokens: 256, temperature: 0, ignoreEos: true }));
  await new Promise((r) => setTimeout(r, 100)); // the 32 are decoding
  const busy = await ttft(engine, [long[2]!]);
  await Promise.all(background);
  runner.close();
  return { model: path.basename(dir), prompt_tokens: 2048, ttft_ms_alone: Number(alone.toFixed(1)), ttft_ms_with_32_in_flight: Number(busy.toFixed(1)),
    profiled_ms: Number(phases.value.toFixed(1)), prefill_ms_by_phase: perStepMs(phases.profile) };
}

const summary: Record<string, unknown> = { bench: 'gpu', requests: REQUESTS, new_tokens: NEW, prompt_tokens: PROMPT };
const models = (process.env.BENCH_GPU_MODELS ?? '').split(',').filter(Boolean);
summary.models = [];
for (const dir of models) {
  const r = await benchModel(dir);
  console.log(JSON.stringify(r));
  (summary.models as unknown[]).push(r);
}
if (process.env.BENCH_GPU_RAG && models[0]) {
  const r = await benchRag(models[0]);
  console.log(JSON.stringify(r));
  summary.rag = r;
}
if (process.env.BENCH_GPU_BIG) {
  const r = await benchBig(process.env.BENCH_GPU_BIG);
  console.log(JSON.stringify(r));
  summary.big = r;
}
console.log(JSON.stringify(summary));
