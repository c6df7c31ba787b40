/**
 * The CUDA backend checked against torch/transformers on the same weights (run on the GPU host through
 * scripts/gpu/run-cuda.sh; the checkpoints and references come from scripts/gpu/hf_models.py):
 *
 *   node --import tsx scripts/check-cuda.ts DIR[=FILE.gguf] [...]
 *
 * DIR=FILE.gguf checks a GGUF file holding DIR's weights (llama.cpp's convert_hf_to_gguf.py of DIR,
 * scripts/gpu/run-gguf.sh) against DIR's torch references: the GGUF path on the device, end to end.
 * For each checkpoint: the prompt's last-position logits against torch's (max |diff| relative to the
 * largest logit, argmax equal), and greedy ids through the engine, the block manager and the scheduler:
 * each prompt alone, all in one mixed batch, a prompt after another that shares its first 64 tokens (a
 * prefix-cache hit: blocks reused, not recomputed), and all with a pool so small that the scheduler
 * preempts. Greedy ids must equal torch's; where they part, torch's own top-1/top-2 margin at that step
 * must be a near-tie (rounding, not a bug), and such cases are counted. Seeded sampling must repeat
 * itself in any batch. Penalties (repetition, presence, frequency) applied on the device choose what the
 * CPU sampler chooses from the same context's logits. Also: the accountant's device total against NVML's used bytes. Where the
 * checkpoint has a LoRA adapter (adapters/lora), the runner gets LoRA slots and scripts/check-cuda-lora.ts
 * checks them against transformers + peft (alone, mixed with base rows and a second entry, prefix hits).
 * Last line JSON; exit code 1 on any failure.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { CudaModelRunner } from '../src/backends/cuda/cuda-runner.js';
import { BlockManager } from '../src/generate/block-manager.js';
import { Engine } from '../src/generate/engine.js';
import { applyPenalties, argmax, type SamplerSettings } from '../src/generate/sampler.js';
import type { SamplingParams } from '../src/generate/sequence.js';
import { nvmlReader, usedBytes } from '../src/guards/nvml.js';
import { checkLora, hasLoraReference, LORA_SLOTS } from './check-cuda-lora.js';
import { logitsAgainst, prefillLogits } from './logit-compare.js';

interface Case { prompt_ids: number[]; greedy_ids: number[]; margins: number[]; logit_scale: number }
interface Reference { max_new_tokens: number; cases: Case[] }

const BLOCK = 16;
/** A divergence where torch's own top-2 margin was below this fraction of the logit scale is a near-tie. */
const NEAR_TIE = 0.02;
/**
 * Prefill logits: max |ours - torch| relative to torch's largest |logit|. bfloat16 keeps 8 bits of
 * mantissa (float16 11): the two implementations' roundings part about 8 times further.
 */
const LOGIT_TOL = { float16: 0.01, bfloat16: 0.05 } as const;

/** `nearTie`: a wider near-tie for a reference known to be further from the exact result (check-cuda-lora.ts). */
function compare(ours: number[], c: Case, nearTie?: number): 'equal' | 'near_tie' | 'differ' {
  const tie = Math.max(NEAR_TIE, nearTie ?? 0);
  for (let i = 0; i < c.greedy_ids.length; i++) {
    if (ours[i] === c.greedy_ids[i]) continue;
    return c.margins[i]! < tie * c.logit_scale ? 'near_tie' : 'differ';
  }
  return ours.length === c.greedy_ids.length ? 'equal' : 'differ';
}

async function checkModel(arg: string): Promise<Record<string, unknown>> {
  const [dir, weights] = arg.split('=') as [string, string | undefined];
  const ref = JSON.parse(readFileSync(path.join(dir, 'reference.json'), 'utf8')) as Reference;
  const nvml = nvmlReader();
  const before = usedBytes(nvml.read());
  const numBlocks = 512;
  const runner = await CudaModelRunner.load(weights ?? dir, { numBlocks, blockSize: BLOCK, maxBatchedTokens: 1024, maxSeqs: 16, ...(hasLoraReference(dir) ? LORA_SLOTS : {}) });
  const nvmlAfter = usedBytes(nvml.read());
  const V = runner.shape.vocabSize;
  const torchLogits = new Float32Array(readFileSync(path.join(dir, 'logits.f32')).buffer.slice(0));
  const out: Record<string, unknown> = { model: path.basename(weights ?? dir), dtype: runner.dtype, accountant: runner.memory(), nvml_used_delta: nvmlAfter - before };
  const failures: string[] = [];
  const greedy: SamplingParams = { maxNewTokens: ref.max_new_tokens, temperature: 0, ignoreEos: true };
  const engineWith = (blocks: number, maxNumSeqs = 16) => {
    const bm = new BlockManager({ numBlocks: blocks, blockSize: BLOCK, watermark: 0.01, enablePrefixCaching: true });
    // The block manager may hand out fewer blocks than the runner's pool holds (the tight pool below).
    return new Engine(runner, bm, { maxNumSeqs, maxNumBatchedTokens: 1024 });
  };

  // 1. Logits of each prompt's prefill against torch's.
  const ours = await prefillLogits(runner, ref.cases, (ids) => engineWith(numBlocks).generate(ids, { ...greedy, maxNewTokens: 1 }));
  const { worst, argmaxEqual } = logitsAgainst(ours, ref.cases, torchLogits, V);
  out.logits = { max_rel_diff: Number(worst.toExponential(3)), argmax_equal: argmaxEqual, cases: ref.cases.length };
  if (worst > LOGIT_TOL[runner.dtype]) failures.push(`prefill logits differ from torch's by ${worst} of the logit scale`);

  // 2. Greedy ids: alone, mixed, prefix hit, preemption.
  const tally = (name: string, results: number[][], cases: Case[]) => {
    const verdicts = results.map((ids, i) => compare(ids, cases[i]!));
    const t = { equal: verdicts.filter((v) => v === 'equal').length, near_tie: verdicts.filter((v) => v === 'near_tie').length, differ: verdicts.filter((v) => v === 'differ').length };
    out[name] = t;
    if (t.differ > 0) failures.push(`${name}: ${t.differ} sequences differ from torch's greedy ids away from a near-tie`);
  };
  const alone: number[][] = [];
  for (const c of ref.cases) alone.push((await engineWith(numBlocks).generate(c.prompt_ids, greedy)).ids);
  tally('alone', alone, ref.cases);
  const mixedEngine = engineWith(numBlocks);
  const mixed = await Promise.all(ref.cases.map((c) => mixedEngine.generate(c.prompt_ids, greedy)));
  tally('mixed_batch', mixed.map((g) => g.ids), ref.cases);
  // The last two prompts share their first 64 tokens (4 blocks): the second reuses the first's blocks.
  const shared = engineWith(numBlocks);
  const [a, b] = ref.cases.slice(-2) as [Case, Case];
  const ga = await shared.generate(a.prompt_ids, greedy);
  const gb = await shared.generate(b.prompt_ids, greedy);
  out.prefix_hit = { cached_tokens: gb.cachedTokens, ...Object.fromEntries([['a', compare(ga.ids, a)], ['b', compare(gb.ids, b)]]) };
  if ((gb.cachedTokens ?? 0) < 64) failures.push(`prefix hit: ${gb.cachedTokens} cached tokens, 64 expected`);
  if (compare(gb.ids, b) === 'differ') failures.push('prefix hit: ids differ from torch');
  // Prompts of 5, 17, 40 and 100 tokens take 13 blocks when admitted and 17 once generated: a pool of
  // 14 admits them all, then the scheduler must preempt and recompute.
  const tight = engineWith(14);
  const pre = await Promise.all(ref.cases.slice(0, 4).map((c) => tight.generate(c.prompt_ids, greedy)));
  tally('preempted', pre.map((g) => g.ids), ref.cases.slice(0, 4));
  (out.preempted as Record<string, number>).preemptions = tight.stats.preemptions;
  if (tight.stats.preemptions === 0) failures.push('the tight pool did not preempt');

  // 3. Seeded sampling repeats itself alone and in a batch.
  const sampled: SamplingParams & { topP: number; topK: number } = { maxNewTokens: 16, temperature: 0.8, seed: 1234, ignoreEos: true, topP: 0.9, topK: 50 };
  const s1 = await engineWith(numBlocks).generate(ref.cases[1]!.prompt_ids, sampled);
  const batchEngine = engineWith(numBlocks);
  const s2 = (await Promise.all([ref.cases[0]!, ref.cases[1]!, ref.cases[2]!].map((c) => batchEngine.generate(c.prompt_ids, sampled))))[1]!;
  out.sampling = { repeatable: s1.ids.join() === s2.ids.join(), differs_from_greedy: s1.ids.join() !== alone[1]!.join() };
  if (s1.ids.join() !== s2.ids.join()) failures.push('seeded sampling differs between alone and batched');
  // 4. Penalties, applied by the device sampler: each penalized greedy token must be the CPU sampler's
  //    choice (sampler.ts applyPenalties, then argmax) from the unpenalized logits of the same context,
  //    computed apart (teacher-forced prefills), or a near-tie there. Three rows in one batch: two with
  //    different penalties and one without, which must stay the plain greedy ids.
  // Presence and frequency scaled to the checkpoint's logits (random weights' margins are wide), so that
  // they change choices.
  const penCases = [ref.cases[1]!, ref.cases[2]!];
  const sc = (k: number) => penCases[k]!.logit_scale;
  const penalties: SamplerSettings[] = [
    { temperature: 0, repetitionPenalty: 1.3, presencePenalty: 0.2 * sc(0), frequencyPenalty: 0.1 * sc(0) },
    { temperature: 0, repetitionPenalty: 0.9, presencePenalty: -0.05 * sc(1), frequencyPenalty: 0.25 * sc(1) },
  ];
  const penEngine = engineWith(numBlocks);
  const [p1, p2, plain] = await Promise.all([
    penEngine.generate(penCases[0]!.prompt_ids, { ...penalties[0]!, maxNewTokens: 24, ignoreEos: true }),
    penEngine.generate(penCases[1]!.prompt_ids, { ...penalties[1]!, maxNewTokens: 24, ignoreEos: true }),
    penEngine.generate(ref.cases[0]!.prompt_ids, greedy),
  ]);
  const penResult: Record<string, unknown> = { plain_row: compare(plain!.ids, ref.cases[0]!) };
  if (penResult.plain_row === 'differ') failures.push('penalties: the unpenalized row of the batch differs from torch');
  for (const [k, g] of [p1!, p2!].entries()) {
    const c = penCases[k]!;
    const contexts = g.ids.map((_, i) => ({ prompt_ids: [...c.prompt_ids, ...g.ids.slice(0, i)], logit_scale: c.logit_scale }));
    const raw = await prefillLogits(runner, contexts, (ids) => engineWith(numBlocks).generate(ids, { ...greedy, maxNewTokens: 1 }));
    let equal = 0, nearTie = 0, differ = 0, changed = 0;
    g.ids.forEach((id, i) => {
      const l = applyPenalties(raw[i]!, penalties[k]!, c.prompt_ids, g.ids.slice(0, i));
      const cpu = argmax(l);
      if (cpu !== argmax(raw[i]!)) changed++;
      if (cpu === id) equal++;
      else if (l[cpu]! - l[id]! < NEAR_TIE * c.logit_scale) nearTie++;
      else differ++;
    });
    penResult[`row_${k}`] = { equal, near_tie: nearTie, differ, steps_the_penalty_changed: changed };
    if (differ > 0) failures.push(`penalties: row ${k}: ${differ} tokens differ from the CPU sampler's choice away from a near-tie`);
    if (changed === 0) failures.push(`penalties: row ${k}: the penalties changed no choice (the check shows nothing)`);
  }
  out.penalties = penResult;
  if (hasLoraReference(dir)) {
    const lora = await checkLora({ runner, dir, numBlocks, blockSize: BLOCK, baseCases: ref.cases, compare, logitTolerance: LOGIT_TOL[runner.dtype] });
    out.lora = lora.result;
    failures.push(...lora.failures);
  }
  runner.close();
  out.failures = failures;
  return out;
}

const dirs = process.argv.slice(2);
const results = [];
for (const d of dirs) {
  const r = await checkModel(d);
  console.log(JSON.stringify(r));
  results.push(r);
}
const failed = results.flatMap((r) => r.failures as string[]);
console.log(JSON.stringify({ check: 'cuda', models: results.map((r) => r.model), ok: failed.length === 0, failures: failed }));
process.exitCode = failed.length === 0 ? 0 : 1;
