/**
 * Generation throughput: continuous batching on the paged KV cache at 1, 8 and 32 concurrent
 * requests versus sequential generation (contiguous cache, one request at a time) on the same model,
 * prompts and greedy outputs, in one run. Prompts are real RAG prompts: three corpus chunks and a
 * question from the shipped set, assembled as the server does.
 *
 * Two workloads, each measured against its own sequential baseline:
 *   rag     the server's job: ~450-token RAG prompts, answers ending at the model's own EOS (<= 32 tokens);
 *           prefill is about half the work, and batching only shares the decode half
 *   decode  decode-bound: the questions alone as prompts, exactly 128 new tokens each (EOS ignored, as
 *           vLLM's throughput benchmark does)
 *
 * The decoder: BENCH_DECODER (default models/decoder-gqa, the server's; models/decoder is the same
 * model in its Optimum layout).
 *
 * Last line of stdout: JSON with tokens/s per mode, speedup_at_8 (rag) and decode_speedup_at_8, and the
 * scheduler + block manager overhead per step in microseconds.
 */
import path from 'node:path';
import { BlockManager } from '../src/generate/block-manager.js';
import { DecoderModel } from '../src/generate/decoder-model.js';
import { Engine } from '../src/generate/engine.js';
import { generate } from '../src/generate/generator.js';
import { assemblePrompt, templateFromConfig } from '../src/generate/prompt.js';
import { readCorpus } from '../src/rag.js';
import { readFile } from 'node:fs/promises';

const ROOT = path.resolve(import.meta.dirname, '..');
const REQUESTS = Number(process.env['BENCH_REQUESTS'] ?? 32);
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
}

const tokens = (outputs: number[][]) => outputs.reduce((s, o) => s + o.length, 0);

async function sequential(w: Workload): Promise<Run> {
  const t0 = performance.now();
  const outputs: number[][] = [];
  for (const p of w.prompts) outputs.push((await generate(model, p, { maxNewTokens: w.maxNewTokens, temperature: 0, ignoreEos: w.ignoreEos })).ids);
  return { tokens: tokens(outputs), seconds: (performance.now() - t0) / 1000, outputs };
}

async function batched(w: Workload, concurrency: number): Promise<Run & { overheadUs: number }> {
  const tokensPerSeq = Math.max(...w.prompts.map((p) => p.length)) + w.maxNewTokens;
  const numBlocks = Math.ceil(tokensPerSeq / BLOCK) * concurrency + 8;
  const blocks = new BlockManager({ numBlocks, blockSize: BLOCK, watermark: 0.01, enablePrefixCaching: true });
  const engine = new Engine(model, blocks, { numBlocks, blockSize: BLOCK, maxNumSeqs: concurrency, maxNumBatchedTokens: 8192 });
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

// Warm-up: first runs pay for graph optimisation and allocator growth.
await generate(model, ragPrompts[0]!, { maxNewTokens: 4, temperature: 0 });
const result: Record<string, number | string | boolean> = { requests: REQUESTS, block_size: BLOCK };
const workloads: Workload[] = [
  { name: 'rag', prompts: ragPrompts, maxNewTokens: 32, ignoreEos: false },
  { name: 'decode', prompts: decodePrompts, maxNewTokens: 128, ignoreEos: true },
];
let outputsMatch = true;
console.log('workload  mode                     tokens  seconds  tokens/s');
for (const w of workloads) {
  const prefix = w.name === 'rag' ? '' : `${w.name}_`;
  const meanPrompt = Math.round(w.prompts.reduce((s, p) => s + p.length, 0) / w.prompts.length);
  result[`${prefix}mean_prompt_tokens`] = meanPrompt;
  const seq = await sequential(w);
  const rows: [string, Run][] = [['sequential', seq]];
  result[`${prefix}sequential_tokens_per_s`] = +(seq.tokens / seq.seconds).toFixed(1);
  for (const c of [1, 8, 32]) {
    const b = await batched(w, c);
    rows.push([`engine, ${c} concurrent`, b]);
    result[`${prefix}tokens_per_s_at_${c}`] = +(b.tokens / b.seconds).toFixed(1);
    result[`${prefix}overhead_us_per_step_at_${c}`] = +b.overheadUs.toFixed(1);
    outputsMatch &&= b.outputs.every((o, i) => o.join() === seq.outputs[i]!.join());
  }
  for (const c of [8, 32]) {
    result[`${prefix}speedup_at_${c}`] = +((result[`${prefix}tokens_per_s_at_${c}`] as number) / (result[`${prefix}sequential_tokens_per_s`] as number)).toFixed(2);
  }
  for (const [mode, r] of rows) {
    console.log(`${w.name.padEnd(9)} ${mode.padEnd(24)} ${String(r.tokens).padStart(6)}  ${r.seconds.toFixed(2).padStart(7)}  ${(r.tokens / r.seconds).toFixed(1).padStart(8)}`);
  }
}
result['greedy_outputs_identical'] = outputsMatch;
result['where'] = model.provider;
result['decoder'] = path.relative(ROOT, DECODER);
result['layout'] = model.layout;
console.log(JSON.stringify(result));
