/**
 * bench:gpu-gguf (on the GPU host): GGUF decoders on the CUDA backend against llama.cpp's CUDA build on the
 * same file and the same GPU, in one run (scripts/gpu/run-gguf.sh builds llama.cpp and writes the files).
 *
 *   BENCH_GPU_GGUF=a.gguf,b.gguf LLAMA_BIN=<dir of llama-batched-bench, llama-server> npm run bench:gpu-gguf
 *
 * Per file and per concurrency c (BENCH_GPU_CONCURRENCY, default 1,8,32,64): c sequences of a random
 * BENCH_GPU_PROMPT-token prompt (24) generating BENCH_GPU_NEW tokens (64, EOS ignored) at once, as
 * llama-batched-bench runs them (-npp 24 -ntg 64 -npl c, all layers on the GPU): decode tokens/s counted as
 * it counts them (the tokens of the decode steps over their time: ours is the whole run less a run of the
 * same prompts that stops after the first token, i.e. c x (new - 1) tokens over the rest), and the ratio.
 * Greedy ids: the first BENCH_GPU_GREEDY prompts (4) through llama-server (greedy, the prompt as token ids,
 * the top-2 log-probabilities at each step) against ours; where they part, llama.cpp's own top-1/top-2 gap at
 * that step says whether it was a near-tie (under NEAR_TIE nats: activation quantization in llama.cpp's
 * products decides those).
 *
 * Ours is measured once per variant, the first the headline (the rest beside it as ragguard_<variant>):
 * BENCH_GPU_QGEMM (mma, int8, dequant: the products of more than 8 rows) times BENCH_GPU_QGEMV_MATH (float, half2,
 * int8: the GEMV's products; half2 with float16 activations only), e.g. BENCH_GPU_QGEMV_MATH=int8,float.
 *
 * BENCH_GPU_GGUF_STANDIN=1 runs the whole script on a machine without a GPU (the stand-in library of the
 * tests for ours, LLAMA_BIN pointing at stand-ins: scripts/gpu/llama-standin.sh): a dry run of the script's
 * plumbing, not a figure. Each case prints a JSON line; the last line is the summary.
 */
import { spawn, execFileSync } from 'node:child_process';
import path from 'node:path';
import type { CudaBackend } from '../src/backends/cuda/binding.js';
import { CudaModelRunner, type QgemvMath } from '../src/backends/cuda/cuda-runner.js';
import { GgufFile, ggmlTypeName } from '../src/runtime/gguf.js';
import { planGguf } from '../src/backends/cuda/gguf-checkpoint.js';
import { BLOCK, engineFor, randomPrompts } from './gpu-common.js';

const LEVELS = (process.env.BENCH_GPU_CONCURRENCY ?? '1,8,32,64').split(',').map(Number);
const PROMPT = Number(process.env.BENCH_GPU_PROMPT ?? 24);
const NEW = Number(process.env.BENCH_GPU_NEW ?? 64);
const GREEDY = Number(process.env.BENCH_GPU_GREEDY ?? 4);
const GREEDY_NEW = 32;
const REPS = Number(process.env.BENCH_GPU_REPS ?? 3);
const LLAMA_BIN = process.env.LLAMA_BIN ?? '';
/** Steps of up to this many rows through the quantized GEMV (cuda-runner.ts gemvRows; default the library's 8). */
const QGEMV_ROWS = process.env.BENCH_GPU_QGEMV_ROWS ? Number(process.env.BENCH_GPU_QGEMV_ROWS) : undefined;
type QuantGemm = 'mma' | 'int8' | 'dequant';
/** Our quantized products of more than 8 rows, each measured (the first is the headline): mma, int8, dequant (cuda-runner.ts quantGemm). */
const QGEMM = (process.env.BENCH_GPU_QGEMM ?? 'mma').split(',').map((m): QuantGemm => {
  if (m !== 'mma' && m !== 'int8' && m !== 'dequant') throw new Error(`BENCH_GPU_QGEMM: ${m} is none of mma, int8, dequant`);
  return m;
});
/** The GEMV's products, each measured with each QGEMM (cuda-runner.ts qgemvMath): float, half2, int8. */
const QGEMV_MATH = (process.env.BENCH_GPU_QGEMV_MATH ?? 'float').split(',').map((m): QgemvMath => {
  if (m !== 'float' && m !== 'half2' && m !== 'int8') throw new Error(`BENCH_GPU_QGEMV_MATH: ${m} is none of float, half2, int8`);
  return m;
});
interface Variant { quantGemm: QuantGemm; qgemvMath: QgemvMath }
/** Every way of ours measured, the first the headline: QGEMM x QGEMV_MATH. */
const VARIANTS: Variant[] = QGEMM.flatMap((quantGemm) => QGEMV_MATH.map((qgemvMath) => ({ quantGemm, qgemvMath })));
const label = (v: Variant) => (v.qgemvMath === 'float' ? v.quantGemm : `${v.quantGemm}+${v.qgemvMath}`);
/** llama.cpp's top-1/top-2 log-probability gap (nats) under which two engines' greedy choices may part. */
const NEAR_TIE = 0.1;

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function standIn(file: string): Promise<CudaBackend> {
  const { standInCuda } = await import('../test/cuda-standin.js');
  const f = GgufFile.open(file);
  try {
    return standInCuda(planGguf(f).config);
  } finally {
    f.close();
  }
}

/** What the file holds: its matrices' types and bytes. */
function describeFile(file: string): Record<string, unknown> {
  const f = GgufFile.open(file);
  try {
    const ck = planGguf(f);
    const types: Record<string, number> = {};
    for (const s of ck.quant!.segments) types[ggmlTypeName(s.ggmlType)] = (types[ggmlTypeName(s.ggmlType)] ?? 0) + 1;
    return { file: path.basename(file), architecture: ck.config.architecture, layers: ck.config.numLayers, hidden: ck.config.hiddenSize, file_bytes: ck.fileBytes, device_quant_bytes: ck.quant!.bytes, matrix_types: types };
  } finally {
    f.close();
  }
}

interface Ours { concurrency: number; decode_tokens_per_s: number; t_pp_s: number; t_total_s: number }

async function ours(file: string, prompts: number[][], variant: Variant): Promise<{ rows: Ours[]; greedy: number[][]; memory: unknown }> {
  const { quantGemm, qgemvMath } = variant;
  const native = process.env.BENCH_GPU_GGUF_STANDIN ? await standIn(file) : undefined;
  const maxSeqs = Math.max(...LEVELS, GREEDY);
  const numBlocks = Math.ceil((maxSeqs * (PROMPT + NEW + BLOCK)) / BLOCK) + 64;
  console.error(`bench:gpu-gguf: loading ${file} (quantized products: ${quantGemm}, GEMV products: ${qgemvMath})`);
  const runner = await CudaModelRunner.load(file, { numBlocks, blockSize: BLOCK, maxBatchedTokens: 2048, maxSeqs, quantGemm, qgemvMath, ...(QGEMV_ROWS !== undefined ? { gemvRows: QGEMV_ROWS } : {}) }, native ?? undefined);
  try {
    const rows: Ours[] = [];
    const gen = (engine: ReturnType<typeof engineFor>, ps: number[][], n: number) =>
      Promise.all(ps.map((p) => engine.generate(p, { maxNewTokens: n, temperature: 0, ignoreEos: true })));
    for (const c of LEVELS) {
      const engine = engineFor(runner, c);
      const batch = prompts.slice(0, c);
      await gen(engine, batch, 4); // warm-up: graphs, cuBLAS's kernel choice
      const pp: number[] = [], total: number[] = [];
      for (let r = 0; r < REPS; r++) {
        let t0 = performance.now();
        await gen(engine, batch, 1);
        pp.push((performance.now() - t0) / 1000);
        t0 = performance.now();
        await gen(engine, batch, NEW);
        total.push((performance.now() - t0) / 1000);
      }
      const tPp = median(pp), tTotal = median(total);
      const row = { concurrency: c, decode_tokens_per_s: Math.round((c * (NEW - 1)) / Math.max(tTotal - tPp, 1e-9)), t_pp_s: Number(tPp.toFixed(4)), t_total_s: Number(tTotal.toFixed(4)) };
      console.log(JSON.stringify({ file: path.basename(file), engine: 'ragguard-cuda', quant_gemm: quantGemm, qgemv_math: qgemvMath, qgemv_rows: QGEMV_ROWS ?? 8, ...row }));
      rows.push(row);
    }
    const greedy = (await gen(engineFor(runner, GREEDY), prompts.slice(0, GREEDY), GREEDY_NEW)).map((g) => g.ids);
    return { rows, greedy, memory: runner.memory() };
  } finally {
    runner.close();
  }
}

interface BatchedBench { pl: number; speed_tg: number; t_pp: number; t_tg: number }

/** llama-batched-bench on the file, all layers on the GPU: one JSON line per batch size. */
function batchedBench(file: string): { rows: BatchedBench[]; command: string } | { error: string } {
  const ctx = Math.max(...LEVELS) * (PROMPT + NEW) + 256;
  const args = ['-m', file, '-c', String(ctx), '-b', '2048', '-ub', '512', '-npp', String(PROMPT), '-ntg', String(NEW),
    '-npl', LEVELS.join(','), '-ngl', '99', '--output-format', 'jsonl'];
  const bin = path.join(LLAMA_BIN, 'llama-batched-bench');
  try {
    const out = execFileSync(bin, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], maxBuffer: 1 << 26 });
    const rows = out.split('\n').filter((l) => l.includes('"speed_tg"')).map((l) => JSON.parse(l.slice(l.indexOf('{'))) as BatchedBench);
    return { rows, command: [bin, ...args].join(' ') };
  } catch (e) {
    const err = e as { stderr?: string; message: string };
    return { error: `${bin}: ${(err.stderr ?? err.message).split('\n').slice(-5).join(' | ')}` };
  }
}

interface LlamaGreedy { ids: number[]; gaps: number[] }

/** Greedy ids of each prompt (as token ids) through llama-server, with llama.cpp's top-1/top-2 gap at every step. */
async function llamaGreedy(file: string, prompts: number[][]): Promise<LlamaGreedy[] | { error: string }> {
  const port = 18000 + Math.floor(Math.random() * 1000);
  const server = spawn(path.join(LLAMA_BIN, 'llama-server'), ['-m', file, '--port', String(port), '--host', '127.0.0.1', '-ngl', '99', '-c', '4096', '-np', '1'],
    { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  server.stderr.on('data', (d: Buffer) => { log = (log + d.toString()).slice(-4000); });
  const base = `http://127.0.0.1:${port}`;
  try {
    for (let i = 0; ; i++) {
      if (server.exitCode !== null) return { error: `llama-server exited ${server.exitCode}: ${log.split('\n').slice(-4).join(' | ')}` };
      if (i > 1200) return { error: 'llama-server did not become healthy in 10 minutes' };
      const ok = await fetch(`${base}/health`).then((r) => r.ok, () => false);
      if (ok) break;
      await new Promise((r) => setTimeout(r, 500));
    }
    const out: LlamaGreedy[] = [];
    for (const p of prompts) {
      const r = await fetch(`${base}/completion`, {
        method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: p, n_predict: GREEDY_NEW, temperature: 0, top_k: 1, n_probs: 2, cache_prompt: false, return_tokens: true, ignore_eos: true, post_sampling_probs: false }),
      });
      const body = (await r.json()) as { tokens?: number[]; completion_probabilities?: { id?: number; top_logprobs?: { id: number; logprob: number }[]; probs?: { tok_str?: string; prob: number }[] }[] };
      const probs = body.completion_probabilities ?? [];
      const gaps = probs.map((s) => {
        const lp = s.top_logprobs?.map((x) => x.logprob) ?? s.probs?.map((x) => Math.log(x.prob)) ?? [];
        return lp.length >= 2 ? lp[0]! - lp[1]! : Number.NaN;
      });
      out.push({ ids: body.tokens ?? probs.map((s) => s.id ?? -1), gaps });
    }
    return out;
  } finally {
    server.kill('SIGTERM');
  }
}

function compareGreedy(theirs: LlamaGreedy[], mine: number[][]) {
  let equal = 0, nearTie = 0;
  const elsewhere: { row: number; position: number; gap_nats: number | null }[] = [];
  theirs.forEach((t, r) => {
    const m = mine[r] ?? [];
    const at = t.ids.findIndex((id, i) => id !== m[i]);
    if (at < 0 && t.ids.length === m.length) { equal++; return; }
    const pos = at < 0 ? Math.min(t.ids.length, m.length) : at;
    const gap = t.gaps[pos];
    if (gap !== undefined && gap < NEAR_TIE) nearTie++;
    else elsewhere.push({ row: r, position: pos, gap_nats: gap === undefined || Number.isNaN(gap) ? null : Number(gap.toFixed(4)) });
  });
  return { greedy_equal: `${equal}/${theirs.length}`, parted_at_near_tie: nearTie, parted_elsewhere: elsewhere };
}

const files = (process.env.BENCH_GPU_GGUF ?? '').split(',').filter(Boolean);
if (files.length === 0) throw new Error('BENCH_GPU_GGUF=<file.gguf>[,...] names the files to compare');
const summary: Record<string, unknown> = { bench: 'gpu-gguf', prompt_tokens: PROMPT, new_tokens: NEW, concurrency: LEVELS, standin: Boolean(process.env.BENCH_GPU_GGUF_STANDIN) };
const results: Record<string, unknown>[] = [];
for (const file of files) {
  const info = describeFile(file);
  const f = GgufFile.open(file);
  const vocab = planGguf(f).config.vocabSize;
  f.close();
  const prompts = randomPrompts(Math.max(...LEVELS, GREEDY), PROMPT, vocab, 11);
  const all: Awaited<ReturnType<typeof ours>>[] = [];
  for (const v of VARIANTS) all.push(await ours(file, prompts, v));
  const mine = all[0]!;
  const bb = batchedBench(file);
  const greedy = !LLAMA_BIN ? { error: 'LLAMA_BIN is not set' } : GREEDY > 0 ? await llamaGreedy(file, prompts.slice(0, GREEDY)) : { error: 'BENCH_GPU_GREEDY=0' };
  const rows = LEVELS.map((c) => {
    const o = mine.rows.find((r) => r.concurrency === c)!;
    const l = 'rows' in bb ? bb.rows.find((r) => r.pl === c) : undefined;
    const others = Object.fromEntries(VARIANTS.slice(1).map((v, i) => {
      const x = all[i + 1]!.rows.find((r) => r.concurrency === c)!;
      return [`ragguard_${label(v)}`, { decode_tokens_per_s: x.decode_tokens_per_s, t_pp_s: x.t_pp_s }];
    }));
    return {
      concurrency: c,
      ragguard: { quant_gemm: VARIANTS[0]!.quantGemm, qgemv_math: VARIANTS[0]!.qgemvMath, decode_tokens_per_s: o.decode_tokens_per_s, t_pp_s: o.t_pp_s },
      ...others,
      llama_batched_bench: l ? { decode_tokens_per_s: Math.round(l.speed_tg), t_pp_s: Number(l.t_pp.toFixed(4)) } : null,
      ratio: l ? Number((o.decode_tokens_per_s / l.speed_tg).toFixed(2)) : null,
    };
  });
  const r = {
    ...info, rows,
    ...('error' in bb ? { llama_batched_bench_error: bb.error } : { llama_batched_bench_command: bb.command }),
    greedy_vs_llama_server: Array.isArray(greedy) ? compareGreedy(greedy, mine.greedy) : greedy,
    device_memory: mine.memory,
  };
  console.log(JSON.stringify(r));
  results.push(r);
}
summary.models = results;
// The goals: at least 1.0x llama.cpp at 1 concurrent, 2x at 32 and above.
summary.goals = results.map((r) => {
  const rows = r.rows as { concurrency: number; ratio: number | null }[];
  return {
    file: r.file,
    at_1: rows.find((x) => x.concurrency === 1)?.ratio ?? null,
    at_32_and_above_min: rows.filter((x) => x.concurrency >= 32 && x.ratio !== null).reduce<number | null>((m, x) => (m === null ? x.ratio : Math.min(m, x.ratio!)), null),
  };
});
console.log(JSON.stringify(summary));
