/**
 * How an engine's wall time at N concurrent clients splits between prefill runs and decode runs, on
 * bench/gguf.ts's workload (chat-formatted questions, BENCH_GGUF_NEW_TOKENS greedy tokens, EOS ignored):
 * the run observer (run-meter.ts) times every prefill and decode run of the runner.
 *   flock /work/wt/_bench.lock sh scripts/tuned.sh tsx scripts/profile-prefill-share.ts
 * Env: BENCH_GGUF, BENCH_GGUF_NEW_TOKENS (64), BENCH_REQUESTS (16), PROFILE_CONCURRENCY (8), BENCH_ROUNDS (2).
 */
import { createHash } from 'node:crypto';
import { loadavg } from 'node:os';
import path from 'node:path';
import { BlockManager } from '../src/generate/block-manager.js';
import { Engine } from '../src/generate/engine.js';
import { ggufWorkload } from '../bench/gguf-workload.js';
import { timeStages, type RunStage } from '../src/runtime/run-meter.js';
import { ortEngine } from '../src/backends/ort/ort-runner.js';

const ROOT = path.resolve(import.meta.dirname, '..');
const GGUF = path.resolve(ROOT, process.env['BENCH_GGUF'] ?? 'models/pretrained/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf');
const NEW_TOKENS = Number(process.env['BENCH_GGUF_NEW_TOKENS'] ?? 64);
const REQUESTS = Number(process.env['BENCH_REQUESTS'] ?? 16);
const C = Number(process.env['PROFILE_CONCURRENCY'] ?? 8);
const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 2);
const BLOCK = 16;

const { model, prompts, maxPrompt } = await ggufWorkload(ROOT, GGUF, REQUESTS);

const { spent, clear } = timeStages();

async function round(requests: number, newTokens: number): Promise<{ seconds: number; tokens: number; outputs: number[][]; stats: Engine['stats'] }> {
  const numBlocks = Math.ceil((maxPrompt + newTokens) / BLOCK) * C + 8;
  const blocks = new BlockManager({ numBlocks, blockSize: BLOCK, watermark: 0.01, enablePrefixCaching: false });
  const engine = ortEngine(model, blocks, { numBlocks, blockSize: BLOCK, maxNumSeqs: C, maxNumBatchedTokens: 8192 });
  let next = 0;
  let tokens = 0;
  const outputs: number[][] = [];
  const t0 = performance.now();
  await Promise.all(Array.from({ length: C }, async () => {
    while (next < requests) {
      const i = next++;
      const out = await engine.generate(prompts[i]!, { maxNewTokens: newTokens, temperature: 0, ignoreEos: true });
      tokens += out.ids.length; // after the await: `tokens += await ...` would add to a stale total
      outputs[i] = out.ids;
    }
  }));
  return { seconds: (performance.now() - t0) / 1000, tokens, outputs, stats: engine.stats };
}

await round(1, 4);
for (let r = 0; r < ROUNDS; r++) {
  clear();
  const { seconds, tokens, outputs, stats } = await round(REQUESTS, NEW_TOKENS);
  const wall = seconds * 1000;
  const share = (k: RunStage) => +(((spent[k]?.ms ?? 0) / wall) * 100).toFixed(1);
  console.log(JSON.stringify({
    profile: 'prefill-share', concurrency: C, requests: REQUESTS, new_tokens: NEW_TOKENS, prompt_tokens: prompts.map((p) => p.length),
    wall_ms: Math.round(wall), tokens_per_s: +(tokens / seconds).toFixed(1),
    prefill_ms: Math.round(spent['prefill']?.ms ?? 0), prefill_runs: spent['prefill']?.runs ?? 0, prefill_pct: share('prefill'),
    decode_ms: Math.round(spent['decode']?.ms ?? 0), decode_runs: spent['decode']?.runs ?? 0, decode_pct: share('decode'),
    padded_prefill_runs: (stats as { paddedPrefills?: number }).paddedPrefills ?? 0,
    // The greedy outputs' digest: equal across code versions where batching changed no token.
    outputs_sha256: createHash('sha256').update(JSON.stringify(outputs)).digest('hex').slice(0, 16),
    load_average: +(loadavg()[0]!).toFixed(1),
  }));
}
