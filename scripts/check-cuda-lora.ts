/**
 * The CUDA backend's LoRA slots checked against transformers + peft on the same weights (part of
 * scripts/check-cuda.ts, for a checkpoint whose directory holds adapters/lora from scripts/gpu/hf_models.py:
 * a PEFT adapter on every projection and peft's reference outputs with it, plus a byte-equal copy,
 * adapters/lora-copy, so that a batch holds two entries).
 *
 * Through the adapter registry (which loads the PEFT files into the device slots as the server does):
 * the prompt's last-position logits with the adapter against peft's (the base check's tolerance), greedy
 * ids with the adapter alone, and one mixed batch of every prompt three times (the base model, the
 * adapter at entry 1, its copy at entry 2) where each row must match its own reference; a prefix-cache
 * hit within the adapter, none across adapter and base. The adapter must change torch's greedy ids,
 * else the check would prove nothing.
 */
import { logitsAgainst, prefillLogits } from './logit-compare.js';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import type { CudaModelRunner } from '../src/backends/cuda/cuda-runner.js';
import { AdapterRegistry } from '../src/generate/adapters.js';
import { BlockManager } from '../src/generate/block-manager.js';
import { Engine } from '../src/generate/engine.js';
import type { SamplingParams } from '../src/generate/sequence.js';

export interface LoraCase { prompt_ids: number[]; greedy_ids: number[]; margins: number[]; logit_scale: number }
type Verdict = 'equal' | 'near_tie' | 'differ';

/** The slots the check loads the runner with: two entries (the adapter and its copy) of rank 8 (hf_models.py LORA r). */
export const LORA_SLOTS = { maxLoras: 2, maxLoraRank: 8 } as const;

export function hasLoraReference(dir: string): boolean {
  return existsSync(path.join(dir, 'adapters', 'lora', 'reference.json'));
}

export interface LoraCheckInput {
  runner: CudaModelRunner;
  dir: string;
  numBlocks: number;
  blockSize: number;
  /** The base model's reference cases (the mixed batch's base rows compare against them). */
  baseCases: readonly LoraCase[];
  /** Our ids against a case's: equal, parted where the reference's own top-2 margin was under `nearTie` of the logit scale, or differ. */
  compare: (ours: number[], c: LoraCase, nearTie?: number) => Verdict;
  logitTolerance: number;
}

export async function checkLora(x: LoraCheckInput): Promise<{ result: Record<string, unknown>; failures: string[] }> {
  const { runner, dir } = x;
  const adapters = path.join(dir, 'adapters');
  const ref = JSON.parse(readFileSync(path.join(adapters, 'lora', 'reference.json'), 'utf8')) as { max_new_tokens: number; cases: LoraCase[] };
  const torchLogits = readFloats(path.join(adapters, 'lora', 'logits.f32'));
  const exactFile = path.join(adapters, 'lora', 'logits-float32.f32');
  const exactLogits = existsSync(exactFile) ? readFloats(exactFile) : null;
  const V = runner.shape.vocabSize;
  const result: Record<string, unknown> = {};
  const failures: string[] = [];
  const registry = new AdapterRegistry(adapters, runner, { maxLoras: LORA_SLOTS.maxLoras, maxRank: LORA_SLOTS.maxLoraRank, waitMs: 600_000 });
  const lora = await registry.acquire('lora');
  const copy = await registry.acquire('lora-copy');
  result.entries = [lora.adapter.entry, copy.adapter.entry];
  const engineWith = (blocks: number) => {
    const bm = new BlockManager({ numBlocks: blocks, blockSize: x.blockSize, watermark: 0.01, enablePrefixCaching: true });
    return new Engine(runner, bm, { numBlocks: blocks, blockSize: x.blockSize, maxNumSeqs: 16, maxNumBatchedTokens: 1024 });
  };
  const greedy: SamplingParams = { maxNewTokens: ref.max_new_tokens, temperature: 0, ignoreEos: true };
  const withLora: SamplingParams = { ...greedy, adapter: lora.adapter };
  const withCopy: SamplingParams = { ...greedy, adapter: copy.adapter };

  const changed = ref.cases.filter((c, i) => c.greedy_ids.join() !== x.baseCases[i]?.greedy_ids.join()).length;
  result.changes_torch_greedy = `${changed}/${ref.cases.length}`;
  if (changed === 0) failures.push('lora: the adapter leaves torch\'s greedy ids as the base model\'s (the check would prove nothing)');

  // Prefill logits with the adapter against peft's.
  const ours = await prefillLogits(runner, ref.cases, (ids) => engineWith(x.numBlocks).generate(ids, { ...withLora, maxNewTokens: 1 }));
  const { worst, argmaxEqual } = logitsAgainst(ours, ref.cases, torchLogits, V);
  result.logits = { max_rel_diff: Number(worst.toExponential(3)), argmax_equal: argmaxEqual, cases: ref.cases.length };
  // Where the float32 reference exists, peft in the model's dtype is one approximation of it and this
  // engine another: the engine must be within tolerance of the exact result, or within twice peft's own
  // distance from it (measured on the H200, 7 prompts' worst case: float16 0.011 against peft's 0.007,
  // bfloat16 0.065 against 0.057; rounding in a 24-layer random-weight model is amplified differently
  // by the two engines' different rounding points). peft's distance also bounds the margins at which its
  // greedy choice can be trusted.
  let nearTie: number | undefined;
  if (exactLogits) {
    const exact = logitsAgainst(ours, ref.cases, exactLogits, V);
    const peft = logitsAgainst(ref.cases.map((_, i) => torchLogits.subarray(i * V, (i + 1) * V)), ref.cases, exactLogits, V).worst;
    result.logits_vs_float32 = { ours: Number(exact.worst.toExponential(3)), peft: Number(peft.toExponential(3)), ours_argmax_equal: exact.argmaxEqual };
    if (exact.worst > Math.max(x.logitTolerance, 2 * peft)) failures.push(`lora: prefill logits differ from the float32 reference's by ${exact.worst} of the logit scale (peft in the model's dtype: ${peft})`);
    nearTie = 2 * peft;
  } else if (worst > x.logitTolerance) {
    failures.push(`lora: prefill logits differ from peft's by ${worst} of the logit scale`);
  }

  const tally = (name: string, results: number[][], cases: readonly LoraCase[]) => {
    const verdicts = results.map((ids, i) => x.compare(ids, cases[i]!, cases === x.baseCases ? undefined : nearTie));
    const t = { equal: verdicts.filter((v) => v === 'equal').length, near_tie: verdicts.filter((v) => v === 'near_tie').length, differ: verdicts.filter((v) => v === 'differ').length };
    result[name] = t;
    if (t.differ > 0) failures.push(`lora ${name}: ${t.differ} sequences differ from the reference's greedy ids away from a near-tie`);
  };
  const alone: number[][] = [];
  for (const c of ref.cases) alone.push((await engineWith(x.numBlocks).generate(c.prompt_ids, withLora)).ids);
  tally('alone', alone, ref.cases);

  // Every prompt as the base model, with the adapter (entry 1) and with its copy (entry 2), all at once.
  const mixedEngine = engineWith(x.numBlocks);
  const [base, one, two] = await Promise.all([greedy, withLora, withCopy].map((p) =>
    Promise.all(ref.cases.map((c) => mixedEngine.generate(c.prompt_ids, p)))));
  tally('mixed_base_rows', base!.map((g) => g.ids), x.baseCases);
  tally('mixed_adapter_rows', [...one!, ...two!].map((g) => g.ids), [...ref.cases, ...ref.cases]);

  // The last two prompts share 64 tokens: a hit within the adapter; the base model's blocks are not its.
  const shared = engineWith(x.numBlocks);
  const [a, b] = ref.cases.slice(-2) as [LoraCase, LoraCase];
  await shared.generate(a.prompt_ids, greedy);
  const ga = await shared.generate(a.prompt_ids, withLora);
  const gb = await shared.generate(b.prompt_ids, withLora);
  result.prefix = { across_base_cached: ga.cachedTokens ?? 0, within_adapter_cached: gb.cachedTokens ?? 0, b: x.compare(gb.ids, b, nearTie) };
  if ((ga.cachedTokens ?? 0) > 0) failures.push(`lora prefix: the adapter reused ${ga.cachedTokens} tokens of the base model's KV`);
  if ((gb.cachedTokens ?? 0) < 64) failures.push(`lora prefix: ${gb.cachedTokens} cached tokens within the adapter, 64 expected`);
  if (x.compare(gb.ids, b, nearTie) === 'differ') failures.push('lora prefix: ids after the hit differ from peft');

  lora.release();
  copy.release();
  result.free_after = registry.stats().slots.free;
  if (registry.stats().slots.free !== LORA_SLOTS.maxLoras) failures.push('lora: the entries did not free');
  return { result, failures };
}

function readFloats(file: string): Float32Array {
  const raw = readFileSync(file);
  return new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength)); // a small file's Buffer is a slice of a pool
}
