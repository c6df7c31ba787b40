/**
 * Prefill on the CPU (issue 41): the default decoder's prefill of one prompt of 256, 1024 and 2048 tokens
 * through the runner the server uses (ortEngine over the direct ONNX Runtime session, the server's session
 * settings), timed by the run observer (run-meter.ts: the prefill run itself) and end to end (the
 * request's first token: TTFT); then where the time goes, from ONNX Runtime's profiler on a second,
 * profiled copy of the model running the same prefills (summed by op type: ragguard's QMatMul8 and
 * QMatMul4, the attention, the rest).
 *
 *   flock /tmp/ragguard-bench.lock npm run bench:prefill-cpu
 *
 * Besides the wall times (median and best of the repetitions) it reports the process's CPU time a request,
 * which other processes on a shared machine move less, and the physical limit (prefill-ceiling.ts: the
 * int8 multiply-add peak measured on every core, over the weights' multiply-adds a token): each length's
 * share of that ceiling, and the block products' share of the peak in the profiled run.
 *
 * Env: BENCH_GGUF (the default decoder), BENCH_PREFILL_LENGTHS (256,1024,2048), BENCH_PREFILL_REPS (3),
 * BENCH_PREFILL_PROFILE (1; 0: no profile pass). Prints one JSON line per length, then a summary JSON
 * line last.
 */
import { execSync } from 'node:child_process';
import { readdir, readFile, rm } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { loadConfig } from '../src/config/config.js';
import { BlockManager } from '../src/generate/block-manager.js';
import { ortEngine } from '../src/backends/ort/ort-runner.js';
import { DecoderModel } from '../src/backends/ort/decoder-model.js';
import { ggufDecoderDir, ggufOptionsFor } from '../src/backends/ort/convert/gguf-decoder.js';
import { applySessionSettings, ragguardOpsVnni, type DirectSession } from '../src/backends/ort/ort-direct.js';
import { timeStages } from '../src/runtime/run-meter.js';
import { installCountingAllocator } from '../src/backends/ort/ort-allocator.js';
import { prefillCeiling } from './prefill-ceiling.js';

const ROOT = path.resolve(import.meta.dirname, '..');
const GGUF = path.resolve(ROOT, process.env['BENCH_GGUF'] ?? 'models/pretrained/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf');
const LENGTHS = (process.env['BENCH_PREFILL_LENGTHS'] ?? '256,1024,2048').split(',').map(Number);
const REPS = Number(process.env['BENCH_PREFILL_REPS'] ?? 3);
const PROFILE = process.env['BENCH_PREFILL_PROFILE'] !== '0';
const BLOCK = 16;

// ONNX Runtime's allocations counted (as the server counts them), installed before the first session:
// each prefill's accounted peak over what was live before it.
const counters = installCountingAllocator();
const cfg = loadConfig(process.env);
applySessionSettings(cfg);
const dir = await ggufDecoderDir(GGUF, ggufOptionsFor(cfg, (m) => console.error(m)));

// Prompt text: the sample corpus (retrieved context is what RAG prompts are made of), tokenized once.
const corpus = path.join(ROOT, 'data', 'corpus');
const files = (await readdir(corpus)).filter((f) => f.endsWith('.txt')).sort();
let text = '';
for (const f of files) {
  text += await readFile(path.join(corpus, f), 'utf8');
  if (text.length > 40_000) break;
}

const times = timeStages();

interface Timed { prefillMs: number[]; ttftMs: number[]; cpuMs: number[]; peakBytes: number[]; runs: number }

async function prefills(model: DecoderModel, reps: number): Promise<Map<number, Timed>> {
  const ids = model.tokenizer.encode(text);
  const out = new Map<number, Timed>();
  const maxLen = Math.max(...LENGTHS);
  if (ids.length < maxLen) throw new Error(`corpus text gives ${ids.length} tokens, fewer than ${maxLen}`);
  const numBlocks = Math.ceil((maxLen + 8) / BLOCK) + 8;
  for (const len of LENGTHS) {
    const r: Timed = { prefillMs: [], ttftMs: [], cpuMs: [], peakBytes: [], runs: 0 };
    for (let i = 0; i <= reps; i++) {
      // A fresh engine and block pool a request, prefix caching off: every request prefills its whole prompt.
      const blocks = new BlockManager({ numBlocks, blockSize: BLOCK, watermark: 0.01, enablePrefixCaching: false });
      const engine = ortEngine(model, blocks, { numBlocks, blockSize: BLOCK, maxNumSeqs: cfg.maxNumSeqs, maxNumBatchedTokens: Math.max(cfg.maxNumBatchedTokens, maxLen) });
      // A different slice each time (the same length): nothing is reused between requests.
      const prompt = ids.slice(i * 7, i * 7 + len);
      times.clear();
      const live0 = counters?.live() ?? 0;
      counters?.resetPeak();
      const t0 = performance.now();
      const c0 = process.cpuUsage();
      await engine.generate(prompt, { maxNewTokens: 1, temperature: 0, ignoreEos: true });
      const ttft = performance.now() - t0;
      const c = process.cpuUsage(c0);
      if (i === 0) continue; // warm-up at this shape
      r.cpuMs.push((c.user + c.system) / 1000);
      if (counters) r.peakBytes.push(counters.peak() - live0);
      r.prefillMs.push(times.spent.prefill?.ms ?? 0);
      r.ttftMs.push(ttft);
      r.runs = times.spent.prefill?.runs ?? 0;
    }
    out.set(len, r);
  }
  return out;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

const model = await DecoderModel.load(dir, 'cpu');
const timed = await prefills(model, REPS);

// The profile: a second copy of the model with ONNX Runtime's profiler on, one prefill per length
// after a warm-up (the profiler's own cost per node inflates the total a little; the shares are what it is for).
type Split = Record<string, number>;
const splits = new Map<number, { totalMs: number; byOp: Split; byNode: Split }>();
if (PROFILE) {
  const prefix = path.join(tmpdir(), `ragguard-prefill-profile-${process.pid}`);
  const profiled = await DecoderModel.load(dir, 'cpu', { directOptions: { profilePrefix: prefix } });
  const marks: { len: number; from: number; to: number }[] = [];
  const ids = profiled.tokenizer.encode(text);
  const numBlocks = Math.ceil((Math.max(...LENGTHS) + 8) / BLOCK) + 8;
  for (const len of LENGTHS) {
    for (let i = 0; i < 2; i++) {
      const blocks = new BlockManager({ numBlocks, blockSize: BLOCK, watermark: 0.01, enablePrefixCaching: false });
      const engine = ortEngine(profiled, blocks, { numBlocks, blockSize: BLOCK, maxNumSeqs: cfg.maxNumSeqs, maxNumBatchedTokens: Math.max(cfg.maxNumBatchedTokens, len) });
      const from = Date.now() * 1000;
      await engine.generate(ids.slice(i * 5, i * 5 + len), { maxNewTokens: 1, temperature: 0, ignoreEos: true });
      if (i === 1) marks.push({ len, from, to: Date.now() * 1000 });
    }
  }
  // The direct session writes its profile when released (DecoderModel keeps it private: a bench's reach-in).
  (profiled as unknown as { direct: DirectSession }).direct.dispose();
  const name = (await readdir(tmpdir())).filter((f) => f.startsWith(path.basename(prefix))).sort().at(-1);
  if (!name) throw new Error('no profile written');
  const file = path.join(tmpdir(), name);
  interface Event { cat: string; name: string; dur: number; ts: number; args?: { op_name?: string; input_type_shape?: Record<string, number[]>[]; output_type_shape?: Record<string, number[]>[] } }
  const events = JSON.parse(await readFile(file, 'utf8')) as Event[];
  await rm(file, { force: true });
  // Profile timestamps are microseconds from the session's start: place the runs by their order instead.
  const runs = events.filter((e) => e.cat === 'Session' && e.name === 'model_run');
  // Each length: 2 prefill runs (warm-up, measured); a prefill of 1 new token is 1 run (no decode step).
  const perLen = runs.length / LENGTHS.length;
  LENGTHS.forEach((len, idx) => {
    const run = runs[idx * perLen + perLen - 1]!;
    const nodes = events.filter((e) => e.cat === 'Node' && e.name.endsWith('_kernel_time') && e.ts >= run.ts && e.ts <= run.ts + run.dur);
    const byOp: Split = {};
    // By op and shapes, summed over the layers (the graph's nodes are mostly unnamed): which of an op
    // type's nodes take its time (the LoRA terms' MatMuls against the lm_head's, say).
    const byNode: Split = {};
    for (const e of nodes) {
      const op = e.args?.op_name ?? '?';
      byOp[op] = (byOp[op] ?? 0) + e.dur / 1000;
      const dims = (shapes?: Record<string, number[]>[]) => (shapes ?? []).map((t) => Object.values(t)[0]?.join('x') ?? '').join(',');
      const node = `${op} ${dims(e.args?.input_type_shape)} -> ${dims(e.args?.output_type_shape)}`;
      byNode[node] = (byNode[node] ?? 0) + e.dur / 1000;
    }
    splits.set(len, { totalMs: run.dur / 1000, byOp, byNode });
  });
  void marks;
}

const groups = (byOp: Split) => {
  const g: Split = { qmatmul: 0, attention: 0, rest: 0 };
  for (const [op, ms] of Object.entries(byOp)) {
    if (op.startsWith('QMatMul') || op === 'MatMulNBits') g['qmatmul']! += ms;
    else if (op === 'GroupQueryAttention' || op === 'Attention' || op === 'MultiHeadAttention' || op.startsWith('CausalAttention')) g['attention']! += ms;
    else g['rest']! += ms;
  }
  return Object.fromEntries(Object.entries(g).map(([k, v]) => [k, +v.toFixed(1)]));
};

// The physical limit beside the figures: the int8 multiply-add peak, measured now (nothing else runs).
const ceiling = prefillCeiling(GGUF);
const macs = ceiling.model_multiply_adds_per_token;
const summary: Record<string, unknown> = {};
for (const len of LENGTHS) {
  const t = timed.get(len)!;
  const prefillMs = median(t.prefillMs);
  // The profiled run, where there was one: its groups and the block products' own rate.
  const profiled = (() => {
    const s = splits.get(len);
    if (!s) return undefined;
    const split = groups(s.byOp);
    return { s, split, qmatmulRate: (macs * len) / (split['qmatmul']! / 1000) };
  })();
  const line = {
    bench: 'prefill-cpu', prompt_tokens: len, runs_per_prefill: t.runs,
    prefill_ms: +prefillMs.toFixed(1), prefill_tokens_per_s: +(len / (prefillMs / 1000)).toFixed(1),
    ttft_ms: +median(t.ttftMs).toFixed(1), prefill_ms_all: t.prefillMs.map((x) => +x.toFixed(1)),
    // The process's CPU time over the request (both cores' user + system, intra-op spinning included): less
    // moved than the wall time by other processes on the machine. Half of it is the wall time the 2 cores
    // would take if nothing else ran and neither waited.
    cpu_ms: +median(t.cpuMs).toFixed(1), cpu_ms_all: t.cpuMs.map((x) => +x.toFixed(1)),
    // ONNX Runtime's accounted bytes at the prefill's peak over those live before it (the counting allocator)
    ...(t.peakBytes.length ? { peak_accounted_mib: +(median(t.peakBytes) / 2 ** 20).toFixed(1) } : {}),
    prefill_tokens_per_s_best: +(len / (Math.min(...t.prefillMs) / 1000)).toFixed(1),
    tokens_per_cpu_s: +(len / (median(t.cpuMs) / 1000)).toFixed(1),
    ...(profiled ? {
      profile_run_ms: +profiled.s.totalMs.toFixed(1), profile_split_ms: profiled.split,
      // The block products' own rate in the profiled run, against the machine's peak (their multiply-adds
      // over their time: how close the kernels come to the limit, apart from attention and the rest).
      qmatmul_multiply_adds_per_s: Math.round(profiled.qmatmulRate),
      qmatmul_share_of_peak: +(profiled.qmatmulRate / ceiling.int8_multiply_adds_per_s).toFixed(2),
      profile_by_op_ms: Object.fromEntries(Object.entries(profiled.s.byOp).sort((a, b) => b[1] - a[1]).map(([k, v]) => [k, +v.toFixed(1)])),
      profile_top_nodes_ms: Object.fromEntries(Object.entries(profiled.s.byNode).sort((a, b) => b[1] - a[1]).slice(0, 16).map(([k, v]) => [k, +v.toFixed(1)])),
    } : {}),
  };
  console.log(JSON.stringify(line));
  summary[`tokens_per_s_${len}`] = line.prefill_tokens_per_s;
  summary[`ttft_ms_${len}`] = line.ttft_ms;
  summary[`tokens_per_s_best_${len}`] = line.prefill_tokens_per_s_best;
  summary[`tokens_per_cpu_s_${len}`] = line.tokens_per_cpu_s;
  summary[`share_of_ceiling_${len}`] = +(line.prefill_tokens_per_s / ceiling.prefill_tokens_per_s_ceiling).toFixed(2);
  if (profiled) {
    summary[`qmatmul_share_of_peak_${len}`] = line.qmatmul_share_of_peak;
    summary[`split_ms_${len}`] = profiled.split;
  }
}
let commit = '?';
try {
  commit = execSync('git rev-parse --short HEAD', { cwd: ROOT }).toString().trim();
} catch { /* not a checkout */ }
console.log(JSON.stringify({
  bench: 'prefill-cpu', summary: true, commit, gguf: path.basename(GGUF), vnni: ragguardOpsVnni(), reps: REPS,
  intra_op_threads: cfg.intraOpThreads ?? null, load_average: +(loadavg()[0]!).toFixed(2), ...summary, ceiling,
}));
