/**
 * The CUDA backend against the CPU path on the same trained model (run on the GPU host through
 * scripts/gpu/run-cuda.sh, step "parity"): the shipped decoder on ONNX Runtime's CPU provider
 * (models/decoder, float32) and the same weights as a Hugging Face checkpoint on the CUDA backend
 * (models/decoder-hf, scripts/export-hf-checkpoint.ts; float16 on the device).
 *
 *   node --import tsx scripts/check-cuda-parity.ts [ort dir] [checkpoint dir]
 *
 * For RAG-shaped prompts (a document's opening and a question from data/questions.json): the prefill's
 * last-position logits (max |diff| relative to the largest |logit|; argmax equal), and greedy ids of
 * 32 tokens through each path's engine, each prompt alone and (CUDA) all in one batch. Where ids part,
 * the CPU path's own top-1/top-2 margin at that step says whether it was a near-tie. Last line JSON;
 * exit code 1 when the logits part by more than float16's rounding or greedy ids part at a clear margin.
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { CudaModelRunner } from '../src/backends/cuda/cuda-runner.js';
import { AdapterRegistry } from '../src/generate/adapters.js';
import { BlockManager } from '../src/generate/block-manager.js';
import { bufferCapacity, DecoderModel } from '../src/backends/ort/decoder-model.js';
import { OrtModelRunner } from '../src/backends/ort/ort-runner.js';
import { type DecoderAdapter } from '../src/generate/lora-pool.js';
import { Engine } from '../src/generate/engine.js';
import type { ModelRunner } from '../src/generate/model-runner.js';

const [ortDir = 'models/decoder-gqa', hfDir = 'models/decoder-hf'] = process.argv.slice(2);
const ROOT = path.resolve(import.meta.dirname, '..');
const NEW = 32;
const BLOCK = 16;
const LOGIT_TOL = 0.01;
const NEAR_TIE = 0.02;

const ADAPTERS = process.env['PARITY_ADAPTER_DIR'] ?? path.join(ROOT, 'models', 'adapters');
const ort = await DecoderModel.load(ortDir, 'cpu');
const cuda = await CudaModelRunner.load(hfDir, { numBlocks: 1024, blockSize: BLOCK, maxBatchedTokens: 2048, maxSeqs: 16, dtype: 'float16', maxLoras: 2, maxLoraRank: 16 });

const questions = JSON.parse(readFileSync(path.join(ROOT, 'data', 'questions.json'), 'utf8')) as { question: string; doc_id?: string; doc?: string }[];
const prompts = questions.slice(0, 12).map((q) => {
  const doc = q.doc_id ?? q.doc;
  const text = doc ? readFileSync(path.join(ROOT, 'data', 'corpus', `${doc}.txt`), 'utf8').slice(0, 1200) : '';
  const ids = ort.tokenizer.encode(`Context:\n${text}\n\nQuestion: ${q.question}\nAnswer:`);
  return ort.bosId !== undefined ? [ort.bosId, ...ids] : ids;
});

function logitsOf(l: Float32Array): { argmax: number; top2: number; scale: number } {
  let a = 0, b = -1, scale = 0;
  for (let v = 0; v < l.length; v++) {
    scale = Math.max(scale, Math.abs(l[v]!));
    if (l[v]! > l[a]!) { b = a; a = v; } else if (b < 0 || l[v]! > l[b]!) b = v;
  }
  return { argmax: a, top2: l[a]! - l[b]!, scale };
}

/** The CPU path's last-position logits after `ids` (a fresh buffer: nothing cached). */
async function ortLogits(ids: readonly number[], adapter?: DecoderAdapter): Promise<Float32Array> {
  // genai: a fresh buffer of its capacity; Optimum: no past at all.
  const width = ort.layout === 'genai' ? bufferCapacity(ids.length, ort.shape.maxPositions) : 0;
  const out = await ort.forward({ tokens: [ids], lengths: [0], width, ...(adapter ? { adapters: [adapter] } : {}) });
  const l = Float32Array.from(out.lastLogits.subarray(0, ort.shape.vocabSize));
  for (const t of out.present) t.dispose();
  return l;
}

function engineOver(runner: DecoderModel | ModelRunner, seqs: number): Engine {
  const blocks = new BlockManager({ numBlocks: 1024, blockSize: BLOCK, watermark: 0.01, enablePrefixCaching: false });
  const opts = { numBlocks: 1024, blockSize: BLOCK, maxNumSeqs: seqs, maxNumBatchedTokens: 2048 };
  return new Engine(runner instanceof DecoderModel ? new OrtModelRunner(runner, opts) : runner, blocks, opts);
}

const failures: string[] = [];
// 1. Prefill logits.
cuda.keepLogits = true;
const cudaEngine1 = engineOver(cuda, 1);
let worst = 0, argmaxEqual = 0;
for (const ids of prompts) {
  await cudaEngine1.generate(ids, { maxNewTokens: 1, temperature: 0, ignoreEos: true });
  const ours = cuda.lastLogits!.subarray(0, cuda.shape.vocabSize);
  const theirs = await ortLogits(ids);
  let diff = 0;
  for (let v = 0; v < theirs.length; v++) diff = Math.max(diff, Math.abs(ours[v]! - theirs[v]!));
  const t = logitsOf(theirs);
  worst = Math.max(worst, diff / t.scale);
  if (logitsOf(ours).argmax === t.argmax) argmaxEqual++;
}
cuda.keepLogits = false;
if (worst > LOGIT_TOL) failures.push(`prefill logits part by ${worst.toFixed(4)} of the logit scale (tolerance ${LOGIT_TOL})`);

// 2. Greedy ids: the CPU path alone, the CUDA path alone and all in one batch.
const greedy = { maxNewTokens: NEW, temperature: 0, ignoreEos: true };
const ortEngine = engineOver(ort, 1);
const cpuIds: number[][] = [];
for (const ids of prompts) cpuIds.push((await ortEngine.generate(ids, greedy)).ids);
const alone: number[][] = [];
for (const ids of prompts) alone.push((await cudaEngine1.generate(ids, greedy)).ids);
const batchEngine = engineOver(cuda, 16);
const together = (await Promise.all(prompts.map((ids) => batchEngine.generate(ids, greedy)))).map((g) => g.ids);

/** Equal, or parted at a step where the CPU path's own margin was a near-tie. */
async function judge(ours: number[], i: number, theirs = cpuIds[i]!, adapter?: DecoderAdapter): Promise<'equal' | 'near_tie' | 'differ'> {
  const at = theirs.findIndex((t, k) => ours[k] !== t);
  if (at < 0) return 'equal';
  const l = logitsOf(await ortLogits([...prompts[i]!, ...theirs.slice(0, at)], adapter));
  return l.top2 < NEAR_TIE * l.scale ? 'near_tie' : 'differ';
}
const tally = async (outs: number[][]) => {
  const r = { equal: 0, near_tie: 0, differ: 0 };
  for (const [i, o] of outs.entries()) r[await judge(o, i)]++;
  return r;
};
const aloneTally = await tally(alone);
const batchTally = await tally(together);
if (aloneTally.differ > 0 || batchTally.differ > 0) failures.push(`greedy ids part at a clear margin: alone ${aloneTally.differ}, batched ${batchTally.differ}`);
const batchInvariant = together.filter((o, i) => o.join() === alone[i]!.join()).length;

// 3. LoRA: the sample adapters (trained for this decoder, scripts/build-adapters.ts) on both paths, through
//    each one's adapter registry: each adapter's requests alone, then one batch mixing both adapters and the
//    base model. Needs the genai decoder (its graph has the LoRA inputs) on the CPU side.
let lora: Record<string, unknown> = { skipped: 'no LoRA inputs in the CPU decoder, or no adapters' };
if (ort.loraSlots && existsSync(ADAPTERS)) {
  const names = readdirSync(ADAPTERS).filter((n) => existsSync(path.join(ADAPTERS, n, 'adapter_config.json'))).slice(0, 2);
  const limits = { maxLoras: 2, maxRank: 16, waitMs: 1000 };
  const ortRegistry = new AdapterRegistry(ADAPTERS, ort, limits);
  const cudaRegistry = new AdapterRegistry(ADAPTERS, cuda, limits);
  const ortLeases = await Promise.all(names.map((n) => ortRegistry.acquire(n)));
  const cudaLeases = await Promise.all(names.map((n) => cudaRegistry.acquire(n)));
  const few = prompts.slice(0, 6);
  const result: Record<string, unknown> = { adapters: names };
  let loraDiffer = 0;
  for (const [k, name] of names.entries()) {
    const cpu: number[][] = [];
    for (const ids of few) cpu.push((await ortEngine.generate(ids, { ...greedy, adapter: ortLeases[k]!.adapter })).ids);
    const gpu: number[][] = [];
    for (const ids of few) gpu.push((await cudaEngine1.generate(ids, { ...greedy, adapter: cudaLeases[k]!.adapter })).ids);
    // Mixed: every prompt three times in one batch (this adapter, the other, none); this adapter's rows compared.
    const other = cudaLeases[(k + 1) % cudaLeases.length]!.adapter;
    const mixed = await Promise.all(few.flatMap((ids) => [
      batchEngine.generate(ids, { ...greedy, adapter: cudaLeases[k]!.adapter }),
      batchEngine.generate(ids, { ...greedy, adapter: other }),
      batchEngine.generate(ids, greedy),
    ]));
    const mine = mixed.filter((_, j) => j % 3 === 0).map((g) => g.ids);
    const changed = cpu.filter((o, i) => o.join() !== cpuIds[i]!.join()).length;
    const tallyWith = async (outs: number[][]) => {
      const r = { equal: 0, near_tie: 0, differ: 0 };
      for (const [i, o] of outs.entries()) r[await judge(o, i, cpu[i]!, ortLeases[k]!.adapter)]++;
      return r;
    };
    const aloneT = await tallyWith(gpu);
    const mixedT = await tallyWith(mine);
    loraDiffer += aloneT.differ + mixedT.differ;
    result[name] = { cpu_outputs_changed_by_adapter: changed, alone: aloneT, in_mixed_batch: mixedT, of: few.length };
  }
  for (const l of [...ortLeases, ...cudaLeases]) l.release();
  result.unloaded = ortRegistry.stats().loaded.length + cudaRegistry.stats().loaded.length === 0;
  if (loraDiffer > 0) failures.push(`with adapters, ${loraDiffer} outputs part from the CPU path's at a clear margin`);
  lora = result;
}
cuda.close();
console.log(JSON.stringify({
  check: 'cuda-parity', ort: ortDir, cuda: hfDir, dtype: cuda.dtype, prompts: prompts.length, new_tokens: NEW,
  prompt_tokens: prompts.map((p) => p.length),
  logits: { max_rel_diff: Number(worst.toExponential(3)), argmax_equal: argmaxEqual },
  greedy_vs_cpu_alone: aloneTally, greedy_vs_cpu_batched: batchTally, batched_equal_to_alone: batchInvariant, lora,
  ok: failures.length === 0, failures,
}));
process.exit(failures.length === 0 ? 0 : 1);
