/**
 * bench:gpu-lora (on the GPU host): what LoRA adapters cost on the CUDA backend, through the engine.
 *
 *   BENCH_GPU_MODELS=dir1,dir2 npm run bench:gpu-lora     (checkpoints from scripts/gpu/hf_models.py, with adapters/lora)
 *
 * Per checkpoint: 32 requests x 64 new tokens (EOS ignored) from the same random 24-token prompts at 1, 8
 * and 32 concurrent (closed loop, as bench:gpu), decode tokens/s of
 *   no_slots  the runner loaded without LoRA slots (the backend as it was),
 *   base      the runner with slots (2 x rank 8), no request naming an adapter: its steps must replay the
 *             same graphs as no_slots (the LoRA kernels are not in them), so the same speed,
 *   adapter   every request with the adapter (every row through the shrink/expand kernels),
 *   mixed     every other request with it (steps mixing adapter and base rows).
 * The ratios to no_slots say what the slots and the adapter cost. Each case prints a JSON line; the last
 * line is the summary.
 */
import path from 'node:path';
import { CudaModelRunner } from '../src/backends/cuda/cuda-runner.js';
import { BLOCK, engineFor, randomPrompts } from './gpu-common.js';
import { AdapterRegistry } from '../src/generate/adapters.js';
import type { DecoderAdapter } from '../src/generate/lora-pool.js';
import { Engine } from '../src/generate/engine.js';

const REQUESTS = Number(process.env.BENCH_GPU_REQUESTS ?? 32);
const NEW = Number(process.env.BENCH_GPU_NEW ?? 64);
const PROMPT = Number(process.env.BENCH_GPU_PROMPT ?? 24);
const LEVELS = (process.env.BENCH_GPU_CONCURRENCY ?? '1,8,32').split(',').map(Number);
const SLOTS = { maxLoras: 2, maxLoraRank: 8 };



/** Tokens/s of `prompts` with at most `c` in flight; request i runs with adapterOf(i). */
async function closedLoop(engine: Engine, prompts: number[][], c: number, maxNewTokens: number, adapterOf: (i: number) => DecoderAdapter | undefined): Promise<number> {
  let next = 0;
  const t0 = performance.now();
  const worker = async () => {
    while (next < prompts.length) {
      const i = next++;
      const adapter = adapterOf(i);
      await engine.generate(prompts[i]!, { maxNewTokens, temperature: 0, ignoreEos: true, ...(adapter ? { adapter } : {}) });
    }
  };
  await Promise.all(Array.from({ length: c }, worker));
  return (prompts.length * maxNewTokens) / ((performance.now() - t0) / 1000);
}

async function run(runner: CudaModelRunner, prompts: number[][], adapterOf: (i: number) => DecoderAdapter | undefined): Promise<Record<number, number>> {
  const out: Record<number, number> = {};
  for (const c of LEVELS) {
    const engine = engineFor(runner, c);
    await closedLoop(engine, prompts.slice(0, c), c, 4, adapterOf); // warm-up
    out[c] = Math.round(await closedLoop(engine, prompts, c, NEW, adapterOf));
  }
  return out;
}

async function benchModel(dir: string): Promise<Record<string, unknown>> {
  const maxSeqs = Math.max(...LEVELS);
  const opts = { numBlocks: 4096, blockSize: BLOCK, maxBatchedTokens: 4096, maxSeqs };
  console.error(`bench:gpu-lora: ${dir} without slots`);
  const plain = await CudaModelRunner.load(dir, opts);
  const prompts = randomPrompts(REQUESTS, PROMPT, plain.shape.vocabSize, 11);
  const noSlots = await run(plain, prompts, () => undefined);
  plain.close();
  console.error(`bench:gpu-lora: ${dir} with ${SLOTS.maxLoras} x rank ${SLOTS.maxLoraRank} slots`);
  const runner = await CudaModelRunner.load(dir, { ...opts, ...SLOTS });
  const registry = new AdapterRegistry(path.join(dir, 'adapters'), runner, { maxLoras: SLOTS.maxLoras, maxRank: SLOTS.maxLoraRank, waitMs: 60_000 });
  const t0 = performance.now();
  const lease = await registry.acquire('lora');
  const loadMs = performance.now() - t0;
  const base = await run(runner, prompts, () => undefined);
  const adapter = await run(runner, prompts, () => lease.adapter);
  const mixed = await run(runner, prompts, (i) => (i % 2 === 0 ? lease.adapter : undefined));
  lease.release();
  const memory = runner.memory();
  runner.close();
  const rows = LEVELS.map((c) => {
    const r = (x: number) => Number((x / noSlots[c]!).toFixed(3));
    const row = { concurrency: c, tokens_per_s: { no_slots: noSlots[c], base: base[c], adapter: adapter[c], mixed: mixed[c] }, ratio_to_no_slots: { base: r(base[c]!), adapter: r(adapter[c]!), mixed: r(mixed[c]!) } };
    console.log(JSON.stringify({ model: path.basename(dir), ...row }));
    return row;
  });
  return { model: path.basename(dir), dtype: runner.dtype, slots: SLOTS, lora_slot_bytes: memory.lora, adapter_load_ms: Number(loadMs.toFixed(1)), graph_bytes_with_slots: memory.graphs, rows };
}

const summary: Record<string, unknown> = { bench: 'gpu-lora', requests: REQUESTS, new_tokens: NEW, prompt_tokens: PROMPT, models: [] as unknown[] };
for (const dir of (process.env.BENCH_GPU_MODELS ?? '').split(',').filter(Boolean)) {
  const r = await benchModel(dir);
  console.log(JSON.stringify(r));
  (summary.models as unknown[]).push(r);
}
console.log(JSON.stringify(summary));
