/**
 * Generation throughput: continuous batching on the paged KV cache at 1, 8 and 32 concurrent
 * requests versus sequential generation (contiguous cache, one request at a time) on the same model,
 * prompts and greedy outputs, in one run. Prompts are real RAG prompts: three corpus chunks and a
 * question from the shipped set, assembled as the server does.
 *
 * Two workloads, each measured against its own sequential baseline:
 *   decode  generation throughput as vLLM's throughput benchmark measures it: the questions alone as
 *           prompts, exactly 128 new tokens each (EOS ignored). Its figures are the unprefixed keys
 *           (speedup_at_8, ...).
 *   rag     the server's job: ~450-token RAG prompts, answers ending at the model's own EOS (<= 32
 *           tokens), keys prefixed rag_. Prefill is most of the work and batching shares only the decode
 *           part, so its speedup is bounded by 1 / rag_prefill_share (rag_speedup_bound: the speedup if
 *           decoding cost nothing), measured here by timing the prompts' prefills alone.
 * Each mode runs BENCH_ROUNDS times (default 3), the modes interleaved. tokens/s is each mode's best
 * round; a speedup is the median over rounds of the ratio within the round (the engine against the
 * sequential run just before it): on a small shared machine whose speed changes by phases, a paired,
 * adjacent-in-time ratio says more about the engine than two best rounds from different phases.
 *
 * The decoder: BENCH_DECODER (default models/decoder-gqa, the server's; models/decoder is the same
 * model in its Optimum layout).
 *
 * Last line of stdout: JSON with tokens/s per mode, speedup_at_8 (decode) and rag_speedup_at_8, and the
 * scheduler + block manager overhead per step in microseconds.
 */
import path from 'node:path';
import { BlockManager } from '../src/generate/block-manager.js';
import { DecoderModel } from '../src/backends/ort/decoder-model.js';

import { generate } from '../src/backends/ort/generator.js';
import { assemblePrompt, templateFromConfig } from '../src/generate/prompt.js';
import { readCorpus } from '../src/service/rag.js';
import { readFile } from 'node:fs/promises';
import { ortEngine } from '../src/backends/ort/ort-runner.js';

const ROOT = path.resolve(import.meta.dirname, '..');
const REQUESTS = Number(process.env['BENCH_REQUESTS'] ?? 32);
const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 3);
const BLOCK = 16;

const DECODER = path.resolve(ROOT, process.env['BENCH_DECODER'] ?? 'models/decoder-gqa');
const model: DecoderModel = await DecoderModel.load(DECODER, (process.env['RAGGUARD_EXECUTION_PROVIDER'] ?? 'cpu') as 'cpu');
const docs = await readCorpus(path.join(ROOT, 'data', 'corpus'));
const questions = JSON.parse(await readFile(path.join(ROOT, 'data', 'questions.json'), 'utf8')) as { question: string }[];
const template = templateFromConfig(model.tokenizer.config);
const ragPrompts = Array.from({ length: REQUESTS }, (_, i) => {
  const chunks = [0, 1, 2].map((k) => {
    const d = docs[(i * 7 + k * 13) % docs.length]!;
    const words = d.text.split(/\s+/);
    const at = (i * 31 + k * 97) % Math.max(1, words.length - 100);
    return { title: d.title ?? '', text: words.slice(at, at + 60 + ((i * k * 17) % 60)).join(' ') };
  });
  return assemblePrompt(model.tokenizer, template, model.bosId, questions[i % questions.length]!.question, chunks, 768).ids;
});

const decodePrompts = questions.slice(0, REQUESTS).map((q) => [model.bosId ?? 1, ...model.tokenizer.encode(`Question: ${q.question}\nAnswer:`)]);

interface Workload {
  name: string;
  prompts: number[][];
  maxNewTokens: number;
  ignoreEos: boolean;
}

interface Run {
  tokens: number;
  seconds: number;
  outputs: number[][];
  /** Scheduler + block manager time per step (engine runs). */
  overheadUs?: number;
}

const tokens = (outputs: number[][]) => outputs.reduce((s, o) => s + o.length, 0);

async function sequential(w: Workload): Promise<Run> {
  const t0 = performance.now();
  const outputs: number[][] = [];
  for (const p of w.prompts) outputs.push((await generate(model, p, { maxNewTokens: w.maxNewTokens, temperature: 0, ignoreEos: w.ignoreEos })).ids);
  return { tokens: tokens(outputs), seconds: (performance.now() - t0) / 1000, outputs };
}

async function batched(w: Workload, concurrency: number): Promise<Run> {
  const tokensPerSeq = Math.max(...w.prompts.map((p) => p.length)) + w.maxNewTokens;
  const numBlocks = Math.ceil(tokensPerSeq / BLOCK) * concurrency + 8;
  const blocks = new BlockManager({ numBlocks, blockSize: BLOCK, watermark: 0.01, enablePrefixCaching: true });
  const engine = ortEngine(model, blocks, { numBlocks, blockSize: BLOCK, maxNumSeqs: concurrency, maxNumBatchedTokens: 8192 });
  const outputs: number[][] = new Array(w.prompts.length);
  let next = 0;
  const t0 = performance.now();
  // `concurrency` clients, each sending its next request when the last one is answered.
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < w.prompts.length) {
      const i = next++;
      outputs[i] = (await engine.generate(w.prompts[i]!, { maxNewTokens: w.maxNewTokens, temperature: 0, ignoreEos: w.ignoreEos })).ids;
    }
  }));
  const seconds = (performance.now() - t0) / 1000;
  return { tokens: tokens(outputs), seconds, outputs, overheadUs: engine.stats.schedulerMicros / engine.stats.steps };
}

/** Time of the prompts' prefills alone (one forward each, as sequential generation starts). */
async function prefillSeconds(w: Workload): Promise<number> {
  const t0 = performance.now();
  for (const p of w.prompts) await generate(model, p, { maxNewTokens: 1, temperature: 0 });
  return (performance.now() - t0) / 1000;
}

const rate = (r: Run) => r.tokens / r.seconds;
const best = (runs: Run[]): Run => runs.reduce((a, b) => (rate(b) > rate(a) ? b : a));
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

// Warm-up: first runs pay for graph optimisation and allocator growth.
await generate(model, ragPrompts[0]!, { maxNewTokens: 4, temperature: 0 });
const result: Record<string, number | string | boolean> = { requests: REQUESTS, block_size: BLOCK, rounds: ROUNDS };
const workloads: Workload[] = [
  { name: 'decode', prompts: decodePrompts, maxNewTokens: 128, ignoreEos: true },
  { name: 'rag', prompts: ragPrompts, maxNewTokens: 32, ignoreEos: false },
];
let outputsMatch = true;
console.log(`best of ${ROUNDS} round(s)`);
console.log('workload  mode                     tokens  seconds  tokens/s');
for (const w of workloads) {
  const prefix = w.name === 'decode' ? '' : `${w.name}_`;
  const meanPrompt = Math.round(w.prompts.reduce((s, p) => s + p.length, 0) / w.prompts.length);
  result[`${prefix}mean_prompt_tokens`] = meanPrompt;
  const modes: [string, number][] = [['sequential', 0], ['engine, 1 concurrent', 1], ['engine, 8 concurrent', 8], ['engine, 32 concurrent', 32]];
  const runs = new Map<string, Run[]>(modes.map(([m]) => [m, []]));
  let prefill = Infinity;
  for (let round = 0; round < ROUNDS; round++) {
    let seq: Run | undefined;
    for (const [mode, c] of modes) {
      const r = c === 0 ? (seq = await sequential(w)) : await batched(w, c);
      runs.get(mode)!.push(r);
      if (seq && c > 0) outputsMatch &&= r.outputs.every((o, i) => o.join() === seq!.outputs[i]!.join());
    }
    if (w.name === 'rag') prefill = Math.min(prefill, await prefillSeconds(w));
  }
  const rows = modes.map(([mode, c]) => [mode, c, best(runs.get(mode)!)] as const);
  for (const [mode, c, r] of rows) {
    const tps = +rate(r).toFixed(1);
    if (c === 0) result[`${prefix}sequential_tokens_per_s`] = tps;
    else {
      result[`${prefix}tokens_per_s_at_${c}`] = tps;
      result[`${prefix}overhead_us_per_step_at_${c}`] = +(r.overheadUs ?? 0).toFixed(1);
    }
    console.log(`${w.name.padEnd(9)} ${mode.padEnd(24)} ${String(r.tokens).padStart(6)}  ${r.seconds.toFixed(2).padStart(7)}  ${rate(r).toFixed(1).padStart(8)}`);
  }
  for (const c of [8, 32]) {
    const seqRuns = runs.get('sequential')!;
    const ratios = runs.get(`engine, ${c} concurrent`)!.map((r, i) => rate(r) / rate(seqRuns[i]!));
    result[`${prefix}speedup_at_${c}`] = +median(ratios).toFixed(2);
    result[`${prefix}speedup_at_${c}_by_round`] = ratios.map((x) => x.toFixed(2)).join(' ');
  }
  if (w.name === 'rag') {
    const seqSeconds = best(runs.get('sequential')!).seconds;
    result['rag_prefill_share'] = +(prefill / seqSeconds).toFixed(2);
    result['rag_speedup_bound'] = +(seqSeconds / prefill).toFixed(2);
  }
}
result['greedy_outputs_identical'] = outputsMatch;
result['where'] = model.provider;
result['decoder'] = path.relative(ROOT, DECODER);
result['layout'] = model.layout;
result['run_path'] = model.runPath.path;
console.log(JSON.stringify(result));
