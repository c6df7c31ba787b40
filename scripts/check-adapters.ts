/**
 * Cross-checks the decoder's LoRA runs against the reference vectors scripts/gpu/build_adapters.py
 * writes with PEFT and torch (reference.json beside the adapters it saved):
 *   tsx scripts/check-adapters.ts <adapter dir> [decoder dir] [provider ...]
 * For each provider (default cpu): the last position's logits of the reference prompt, base model and
 * each adapter, against torch's (max |difference|), and 16 greedy tokens through the engine against
 * torch's generate(). Prints one JSON line per provider; exits 1 when a check fails.
 */
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import type { ExecutionProvider } from '../src/config/config.js';
import { AdapterRegistry } from '../src/generate/adapters.js';
import { BlockManager } from '../src/generate/block-manager.js';
import { DecoderModel } from '../src/backends/ort/decoder-model.js';
import { type DecoderAdapter } from '../src/generate/lora-pool.js';
import { ortEngine } from '../src/backends/ort/ort-runner.js';


interface Reference {
  prompt_ids: number[];
  base: { last_logits: number[]; greedy: number[] };
  adapters: Record<string, { last_logits: number[]; greedy: number[] }>;
}

const [dir, decoderDir = 'models/decoder-gqa', ...providers] = process.argv.slice(2);
if (!dir) {
  console.error('usage: tsx scripts/check-adapters.ts <adapter dir> [decoder dir] [provider ...]');
  process.exit(2);
}
const ref = JSON.parse(await readFile(path.join(dir, 'reference.json'), 'utf8')) as Reference;
/** float32 against torch's float32: the same sums in another order. */
const TOLERANCE = 1e-3;
let failed = false;

for (const ep of (providers.length ? providers : ['cpu']) as ExecutionProvider[]) {
  const model = await DecoderModel.load(decoderDir, ep);
  const registry = new AdapterRegistry(dir, model, { maxLoras: 4, maxRank: 16, waitMs: 1000 });
  const ids = ref.prompt_ids;
  const logitsOf = async (adapter?: DecoderAdapter) => {
    const width = model.pastWidth([0], ids.length);
    const out = await model.forward({ tokens: [ids], lengths: [0], past: model.allocPast(1, width), width, adapters: adapter && [adapter] });
    const logits = Array.from(out.lastLogits);
    for (const t of out.present) t.dispose();
    return logits;
  };
  const greedyOf = async (adapter?: DecoderAdapter) => {
    const blocks = new BlockManager({ numBlocks: 64, blockSize: 16, watermark: 0.01, enablePrefixCaching: false });
    const engine = ortEngine(model, blocks, { numBlocks: 64, blockSize: 16, maxNumSeqs: 4, maxNumBatchedTokens: 4096 });
    return (await engine.generate(ids, { maxNewTokens: 16, temperature: 0, ignoreEos: true, adapter })).ids;
  };
  const result: Record<string, unknown> = { provider: model.provider, run_path: model.runPath.path };
  const cases: [string, { last_logits: number[]; greedy: number[] }][] = [['base', ref.base], ...Object.entries(ref.adapters)];
  for (const [name, want] of cases) {
    const lease = name === 'base' ? undefined : await registry.acquire(name);
    const logits = await logitsOf(lease?.adapter);
    const maxDiff = Math.max(...logits.map((x, i) => Math.abs(x - want.last_logits[i]!)));
    const greedy = await greedyOf(lease?.adapter);
    lease?.release();
    const same = greedy.every((t, i) => t === want.greedy[i]);
    if (!(maxDiff < TOLERANCE) || !same) failed = true;
    result[name] = { max_abs_logit_diff: +maxDiff.toExponential(2), greedy_same: same, ...(same ? {} : { greedy, torch: want.greedy }) };
  }
  result['adapters_loaded_after'] = registry.stats().loaded.length;
  console.log(JSON.stringify(result));
}
process.exit(failed ? 1 : 0);
