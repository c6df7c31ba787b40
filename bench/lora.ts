/**
 * What LoRA adapters cost the engine, in one run, on the configured decoder (RAGGUARD_DECODER: the default
 * GGUF, converted with LoRA inputs, or BENCH_LORA_DECODER=models/decoder-gqa for the small self-trained one):
 * the decode workload of bench:throughput (the questions as prompts, BENCH_LORA_NEW_TOKENS new tokens each,
 * EOS ignored) at BENCH_LORA_CONCURRENCY concurrent requests, with
 *   base     no request naming an adapter (the graph's LoRA paths at rank 0),
 *   single   every request on the first adapter that fits the decoder (one slot entry, its A and B
 *            broadcast over the batch),
 *   mixed    requests cycling over none and the first two fitting adapters, or none and the one where
 *            only one fits (the default 1.5B's coder-grounded-1.5b): each row's A and B gathered from the
 *            slots, one run per step,
 * and, for a GGUF decoder, base_plain: the base requests on the conversion without LoRA inputs (what the
 * inputs cost rows that name no adapter). The adapters are RAGGUARD_ADAPTER_DIR's (setup: coder-grounded-1.5b
 * for the default decoder, coder-grounded and coder-random-r8 for the 0.5B, demo-r8 and demo-qv-r4 for the
 * small one), or
 * BENCH_LORA_ADAPTERS=a,b.
 * Rounds interleave the modes (BENCH_ROUNDS, default 5); tokens/s is each mode's best round, a ratio the
 * median of the ratios within rounds. In the mixed runs, each request's own tokens/s (its tokens over its
 * time from submission to its last token) is averaged over the rows with an adapter and over those
 * without: mixed_adapter_rows_vs_base_rows compares the two in the same batches (goal >= 0.8). Checks that
 * a mixed batch gives every request the greedy ids it gets in a batch of its own adapter alone (base or
 * single), and that nothing stays loaded.
 * Last line: JSON.
 */
import path from 'node:path';
import { readdir, readFile } from 'node:fs/promises';
import { loadConfig } from '../src/config/config.js';
import { AdapterRegistry, type AdapterLease } from '../src/generate/adapters.js';
import { BlockManager } from '../src/generate/block-manager.js';
import { DecoderModel } from '../src/backends/ort/decoder-model.js';
import { ggufDecoderDir, ggufOptionsFor, isGguf } from '../src/backends/ort/convert/gguf-decoder.js';
import { type DecoderAdapter } from '../src/generate/lora-pool.js';
import { ortEngine } from '../src/backends/ort/ort-runner.js';

const ROOT = path.resolve(import.meta.dirname, '..');
const REQUESTS = Number(process.env['BENCH_REQUESTS'] ?? 32);
const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 5);
const CONCURRENCY = Number(process.env['BENCH_LORA_CONCURRENCY'] ?? 8);
const NEW_TOKENS = Number(process.env['BENCH_LORA_NEW_TOKENS'] ?? 128);
const BLOCK = 16;

const cfg = loadConfig({ ...process.env, ...(process.env['BENCH_LORA_DECODER'] ? { RAGGUARD_DECODER: process.env['BENCH_LORA_DECODER'] } : {}) });
const log = (m: string) => console.log(m);
const gguf = isGguf(cfg.decoderPath);
// LoRA inputs on, whatever RAGGUARD_DECODER_LORA says: the adapters are what is measured.
const decoderDir = gguf ? await ggufDecoderDir(cfg.decoderPath, { ...ggufOptionsFor(cfg, log), lora: true }) : cfg.decoderPath;
const model = await DecoderModel.load(decoderDir, 'cpu');
const plain = gguf ? await DecoderModel.load(await ggufDecoderDir(cfg.decoderPath, { ...ggufOptionsFor(cfg, log), lora: false }), 'cpu') : undefined;
const registry = new AdapterRegistry(cfg.adapterDir, model, { maxLoras: 4, maxRank: cfg.maxLoraRank, waitMs: 1000 });
const fitting: string[] = [];
for (const name of process.env['BENCH_LORA_ADAPTERS']?.split(',') ?? (await readdir(cfg.adapterDir)).sort()) {
  try {
    await registry.inspect(name);
    fitting.push(name);
  } catch (e) {
    if (process.env['BENCH_LORA_ADAPTERS']) throw e; // named: it must fit
  }
}
// Two where two fit (the 0.5B: coder-grounded, coder-random-r8); the default 1.5B has one (coder-grounded-1.5b),
// and its mixed batches then cycle over none and that one.
if (fitting.length < 1) throw new Error(`${cfg.adapterDir}: no adapter fits ${cfg.decoderPath} (npm run setup puts them in place)`);
const names = fitting.slice(0, 2);
const questions = JSON.parse(await readFile(path.join(ROOT, 'data', 'questions.json'), 'utf8')) as { question: string }[];
const prompts = questions.slice(0, REQUESTS).map((q) => [...(model.bosId === undefined ? [] : [model.bosId]), ...model.tokenizer.encode(`Question: ${q.question}\nAnswer:`)]);
const leases: AdapterLease[] = [];
for (const name of names) leases.push(await registry.acquire(name));
const first: DecoderAdapter = leases[0]!.adapter;
const second: DecoderAdapter | undefined = leases[1]?.adapter;

interface Run {
  tokensPerS: number;
  outputs: number[][];
  /** Each request's tokens over its own time. */
  rowRates: number[];
}

async function run(adapterOf: (i: number) => DecoderAdapter | undefined, on: DecoderModel = model): Promise<Run> {
  const numBlocks = Math.ceil((Math.max(...prompts.map((p) => p.length)) + NEW_TOKENS) / BLOCK) * CONCURRENCY + 8;
  const blocks = new BlockManager({ numBlocks, blockSize: BLOCK, watermark: 0.01, enablePrefixCaching: true });
  const engine = ortEngine(on, blocks, { numBlocks, blockSize: BLOCK, maxNumSeqs: CONCURRENCY, maxNumBatchedTokens: 8192 });
  const outputs: number[][] = new Array(prompts.length);
  const rowRates: number[] = new Array(prompts.length);
  let next = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    while (next < prompts.length) {
      const i = next++;
      const t = performance.now();
      outputs[i] = (await engine.generate(prompts[i]!, { maxNewTokens: NEW_TOKENS, temperature: 0, ignoreEos: true, adapter: adapterOf(i) })).ids;
      rowRates[i] = outputs[i]!.length / ((performance.now() - t) / 1000);
    }
  }));
  const seconds = (performance.now() - t0) / 1000;
  return { tokensPerS: outputs.reduce((s, o) => s + o.length, 0) / seconds, outputs, rowRates };
}

const cycle = [undefined, first, second ?? first];
const modes: Record<string, () => Promise<Run>> = {
  base: () => run(() => undefined),
  single: () => run(() => first),
  mixed: () => run((i) => cycle[i % 3]),
  // Each request's own adapter, all of one kind per run: the references for the mixed run.
  ...(second ? { second: () => run(() => second) } : {}),
  ...(plain ? { base_plain: () => run(() => undefined, plain) } : {}),
};
await modes['base']!(); // warm-up
if (plain) await modes['base_plain']!();
const runs: Record<string, Run[]> = Object.fromEntries(Object.keys(modes).map((m) => [m, []]));
for (let r = 0; r < ROUNDS; r++) for (const [name, go] of Object.entries(modes)) runs[name]!.push(await go());
for (const l of leases) l.release();

const best = (name: string) => Math.max(...runs[name]!.map((x) => x.tokensPerS));
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const ratio = (a: string, b: string) => +median(runs[a]!.map((x, i) => x.tokensPerS / runs[b]![i]!.tokensPerS)).toFixed(3);
const alone = (i: number) => runs[['base', 'single', second ? 'second' : 'single'][i % 3]!]![0]!.outputs[i]!;
const identical = runs['mixed']!.every((m) => m.outputs.every((o, i) => o.join() === alone(i).join()));
const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
// Within each mixed run: the rows with an adapter against the rows without, then the median over rounds.
const rowsRatio = median(runs['mixed']!.map((m) => mean(m.rowRates.filter((_, i) => i % 3 !== 0)) / mean(m.rowRates.filter((_, i) => i % 3 === 0))));

console.log(`${path.relative(ROOT, decoderDir)}: adapters ${names.join(', ')}`);
console.log(`${REQUESTS} requests x ${NEW_TOKENS} tokens at ${CONCURRENCY} concurrent, best of ${ROUNDS} (tokens/s)`);
for (const name of ['base', ...(plain ? ['base_plain'] : []), 'single', 'mixed']) console.log(`  ${name.padEnd(10)} ${best(name).toFixed(1).padStart(8)}`);
console.log(`  mixed batches: adapter rows at ${rowsRatio.toFixed(3)} of base rows' tokens/s`);
console.log(JSON.stringify({
  decoder: path.relative(ROOT, cfg.decoderPath), adapters: names,
  requests: REQUESTS, new_tokens: NEW_TOKENS, concurrency: CONCURRENCY, rounds: ROUNDS,
  base_tokens_per_s: +best('base').toFixed(1),
  ...(plain ? { base_without_lora_inputs_tokens_per_s: +best('base_plain').toFixed(1), base_vs_without_lora_inputs: ratio('base', 'base_plain') } : {}),
  single_adapter_tokens_per_s: +best('single').toFixed(1),
  mixed_adapters_tokens_per_s: +best('mixed').toFixed(1),
  single_vs_base: ratio('single', 'base'),
  mixed_vs_base: ratio('mixed', 'base'),
  mixed_adapter_rows_vs_base_rows: +rowsRatio.toFixed(3),
  mixed_greedy_identical_to_alone: identical,
  adapters_loaded_after: registry.stats().loaded.length,
  where: model.provider,
}));
