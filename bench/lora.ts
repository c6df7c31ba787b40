/**
 * What LoRA adapters cost the engine, in one run: the decode workload of bench:throughput (the
 * questions as prompts, BENCH_LORA_NEW_TOKENS new tokens each, EOS ignored) at BENCH_LORA_CONCURRENCY
 * concurrent requests, with
 *   base     no request naming an adapter (the graph's LoRA paths at rank 0),
 *   single   every request on demo-r8 (one slot entry, its A and B broadcast over the batch),
 *   mixed    requests cycling over none, demo-r8 and demo-qv-r4 (each row's A and B gathered from the
 *            slots, one run per step).
 * Rounds interleave the modes (BENCH_ROUNDS, default 5); tokens/s is each mode's best round, a ratio the
 * median of the ratios within rounds. Checks that a mixed batch gives every request the greedy ids it
 * gets in a batch of its own adapter alone (base or single), and that nothing stays loaded.
 * Last line: JSON.
 */
import path from 'node:path';
import { readFile } from 'node:fs/promises';
import { AdapterRegistry, type AdapterLease } from '../src/generate/adapters.js';
import { BlockManager } from '../src/generate/block-manager.js';
import { DecoderModel } from '../src/backends/ort/decoder-model.js';
import { type DecoderAdapter } from '../src/generate/lora-pool.js';
import { ortEngine } from '../src/backends/ort/ort-runner.js';


const ROOT = path.resolve(import.meta.dirname, '..');
const REQUESTS = Number(process.env['BENCH_REQUESTS'] ?? 32);
const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 5);
const CONCURRENCY = Number(process.env['BENCH_LORA_CONCURRENCY'] ?? 8);
const NEW_TOKENS = Number(process.env['BENCH_LORA_NEW_TOKENS'] ?? 128);
const BLOCK = 16;

const model = await DecoderModel.load(path.join(ROOT, 'models', 'decoder-gqa'), 'cpu');
const registry = new AdapterRegistry(path.join(ROOT, 'models', 'adapters'), model, { maxLoras: 4, maxRank: 16, waitMs: 1000 });
const questions = JSON.parse(await readFile(path.join(ROOT, 'data', 'questions.json'), 'utf8')) as { question: string }[];
const prompts = questions.slice(0, REQUESTS).map((q) => [model.bosId ?? 1, ...model.tokenizer.encode(`Question: ${q.question}\nAnswer:`)]);
const leases: AdapterLease[] = [await registry.acquire('demo-r8'), await registry.acquire('demo-qv-r4')];
const [r8, qv] = leases.map((l) => l.adapter) as [DecoderAdapter, DecoderAdapter];

interface Run {
  tokensPerS: number;
  outputs: number[][];
}

async function run(adapterOf: (i: number) => DecoderAdapter | undefined): Promise<Run> {
  const numBlocks = Math.ceil((Math.max(...prompts.map((p) => p.length)) + NEW_TOKENS) / BLOCK) * CONCURRENCY + 8;
  const blocks = new BlockManager({ numBlocks, blockSize: BLOCK, watermark: 0.01, enablePrefixCaching: true });
  const engine = ortEngine(model, blocks, { numBlocks, blockSize: BLOCK, maxNumSeqs: CONCURRENCY, maxNumBatchedTokens: 8192 });
  const outputs: number[][] = new Array(prompts.length);
  let next = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    while (next < prompts.length) {
      const i = next++;
      outputs[i] = (await engine.generate(prompts[i]!, { maxNewTokens: NEW_TOKENS, temperature: 0, ignoreEos: true, adapter: adapterOf(i) })).ids;
    }
  }));
  const seconds = (performance.now() - t0) / 1000;
  return { tokensPerS: outputs.reduce((s, o) => s + o.length, 0) / seconds, outputs };
}

const cycle = [undefined, r8, qv];
const modes: Record<string, (i: number) => DecoderAdapter | undefined> = {
  base: () => undefined,
  single: () => r8,
  mixed: (i) => cycle[i % 3],
  // Each request's own adapter, all of one kind per run: the references for the mixed run.
  qv: () => qv,
};
await run(() => undefined); // warm-up
const runs: Record<string, Run[]> = { base: [], single: [], mixed: [], qv: [] };
for (let r = 0; r < ROUNDS; r++) for (const [name, of] of Object.entries(modes)) runs[name]!.push(await run(of));
for (const l of leases) l.release();

const best = (name: string) => Math.max(...runs[name]!.map((x) => x.tokensPerS));
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const ratio = (a: string, b: string) => +median(runs[a]!.map((x, i) => x.tokensPerS / runs[b]![i]!.tokensPerS)).toFixed(3);
const alone = (i: number) => runs[[`base`, 'single', 'qv'][i % 3]!]![0]!.outputs[i]!;
const identical = runs['mixed']!.every((m) => m.outputs.every((o, i) => o.join() === alone(i).join()));

console.log(`${REQUESTS} requests x ${NEW_TOKENS} tokens at ${CONCURRENCY} concurrent, best of ${ROUNDS} (tokens/s)`);
for (const name of ['base', 'single', 'mixed']) console.log(`  ${name.padEnd(7)} ${best(name).toFixed(1).padStart(8)}`);
console.log(JSON.stringify({
  requests: REQUESTS, new_tokens: NEW_TOKENS, concurrency: CONCURRENCY, rounds: ROUNDS,
  base_tokens_per_s: +best('base').toFixed(1),
  single_adapter_tokens_per_s: +best('single').toFixed(1),
  mixed_adapters_tokens_per_s: +best('mixed').toFixed(1),
  single_vs_base: ratio('single', 'base'),
  mixed_vs_base: ratio('mixed', 'base'),
  mixed_greedy_identical_to_alone: identical,
  adapters_loaded_after: registry.stats().loaded.length,
  where: model.provider,
}));
