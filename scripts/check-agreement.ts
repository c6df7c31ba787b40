/**
 * Agreement with a float32 reference over teacher-forced sequences: how close each way of running one
 * checkpoint is to the exact function (run on the GPU host by scripts/gpu/run-gguf.sh, step `agree`):
 *
 *   node --import tsx scripts/check-agreement.ts REF_DIR [ours:NAME=WEIGHTS[@fp8|@fp8lt|@dequant|@half2|@int8|@i8mma]] [file:NAME=LOGITS.f32] ...
 *
 * REF_DIR holds scripts/gpu/agreement_reference.py's output: the sequences (random prompts, each with the
 * float32 model's greedy continuation) and the float32 logits at every compared position. `ours:` loads
 * WEIGHTS (a checkpoint directory or a GGUF file; `@fp8` for RAGGUARD_CUDA_WEIGHTS=fp8, `@fp8lt` for FP8 with its wide
 * products through cuBLASLt (cuda-runner.ts fp8Gemm 'cublaslt'), `@dequant` for the quantized
 * products through dequantized tiles instead of the tensor-core kernel, `@half2` for the GEMV's products in paired half
 * arithmetic, `@int8` for them with int8 activations and dp4a, cuda-runner.ts qgemvMath; `@i8mma` that and the wider products
 * on the int8 tensor cores, quantGemm 'int8') on the CUDA backend
 * and prefills each prefix of each sequence (one engine, prefix caching on: each prefix reuses the blocks of
 * the one before) for its last position's logits; `file:` reads logits another program wrote for the same
 * positions (llama.cpp's, scripts/gpu/llama_logits.cpp; transformers' own low-precision run). For each:
 * top-1 agreement, the mean and largest KL(reference || side) in nats, the position of the largest, and
 * top-1 at each sequence's first generated token.
 *
 * The verdict: where `ours:X` and `file:llama-X` both ran, ours must be at least as close to the reference as
 * llama.cpp on the same file: mean KL <= 1.1 x llama.cpp's + 0.001, top-1 >= llama.cpp's - 0.02 (the slack is
 * the noise of 132 positions; the scale is llama.cpp's own: its perplexity README's LLaMA-3-8B scoreboard,
 * CUDA, has mean KLD against FP16 of 0.0014 for Q8_0, 0.0055 Q6_K, 0.022 Q5_0 and 0.031 Q4_K_M). The dense
 * path (`ours:dense`, the checkpoint in its own dtype) must be within 1.1 x + 0.001 of transformers' own run in
 * that dtype (`file:torch-dense`). Last line JSON; exit code 1 when a verdict fails.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { CudaModelRunner } from '../src/backends/cuda/cuda-runner.js';
import { BlockManager } from '../src/generate/block-manager.js';
import { Engine } from '../src/generate/engine.js';
import { agreementOf, prefillLogits, type Agreement } from './logit-compare.js';

interface Sequence { first: number; ids: number[] }
interface ReferenceFile { vocab: number; rows: number; sequences: Sequence[] }

const BLOCK = 16;
const NUM_BLOCKS = 256;
const KL_SLACK = { factor: 1.1, plus: 0.001 };
const TOP1_SLACK = 0.02;

/** Each sequence's prefixes ids[0..p], p from its first compared position on: the contexts whose last logits are compared. */
export function teacherForcedContexts(sequences: readonly Sequence[]): { prompt_ids: number[]; logit_scale: number }[] {
  return sequences.flatMap((s) => Array.from({ length: s.ids.length - s.first }, (_, j) => ({ prompt_ids: s.ids.slice(0, s.first + j + 1), logit_scale: 1 })));
}

/** Our logits at every compared position: one engine with prefix caching, a one-token prefill per prefix. */
export async function oursAt(runner: CudaModelRunner, sequences: readonly Sequence[], pool: { numBlocks: number; blockSize: number }): Promise<Float32Array[]> {
  const engine = new Engine(runner, new BlockManager({ ...pool, watermark: 0.01, enablePrefixCaching: true }),
    { maxNumSeqs: 4, maxNumBatchedTokens: 1024 });
  return prefillLogits(runner, teacherForcedContexts(sequences), (ids) => engine.generate(ids, { maxNewTokens: 1, temperature: 0, ignoreEos: true }));
}

/** The verdicts over the sides measured: ours against llama.cpp on the same file, the dense path against transformers'. */
export function verdicts(sides: ReadonlyMap<string, Agreement>): { pairs: Record<string, unknown>[]; failures: string[] } {
  const pairs: Record<string, unknown>[] = [];
  const failures: string[] = [];
  for (const [name, ours] of sides) {
    if (!name.startsWith('ours:')) continue;
    const q = name.slice(5);
    const peerName = q === 'dense' ? 'file:torch-dense' : `file:llama-${q.replace(/-(dequant|half2|int8)$/, '')}`;
    const peer = sides.get(peerName);
    if (!peer) continue;
    const klBound = peer.mean_kl * KL_SLACK.factor + KL_SLACK.plus;
    const ok = ours.mean_kl <= klBound && ours.top1 >= peer.top1 - TOP1_SLACK;
    pairs.push({ ours: name, peer: peerName, ours_mean_kl: ours.mean_kl, peer_mean_kl: peer.mean_kl, kl_bound: Number(klBound.toPrecision(4)), ours_top1: ours.top1, peer_top1: peer.top1, ok });
    if (!ok) failures.push(`${name} is further from the float32 reference than ${peerName}: mean KL ${ours.mean_kl} (bound ${klBound.toPrecision(4)}), top-1 ${ours.top1} against ${peer.top1}`);
  }
  return { pairs, failures };
}

async function main(): Promise<void> {
  const [refDir, ...args] = process.argv.slice(2);
  if (!refDir || args.length === 0) throw new Error('usage: check-agreement.ts REF_DIR ours:NAME=WEIGHTS[@fp8] | file:NAME=LOGITS.f32 ...');
  const ref = JSON.parse(readFileSync(path.join(refDir, 'agreement.json'), 'utf8')) as ReferenceFile;
  const reference = new Float32Array(readFileSync(path.join(refDir, 'logits-float32.f32')).buffer.slice(0));
  const V = ref.vocab;
  if (reference.length !== ref.rows * V) throw new Error(`logits-float32.f32 holds ${reference.length} values, not ${ref.rows} x ${V}`);
  const sides = new Map<string, Agreement>();
  for (const arg of args) {
    const m = /^(ours|file):([^=]+)=(.+)$/.exec(arg);
    if (!m) throw new Error(`cannot read ${arg}`);
    const [, kind, name, target] = m as unknown as [string, 'ours' | 'file', string, string];
    const t0 = performance.now();
    let a: Agreement;
    if (kind === 'file') {
      const rows = new Float32Array(readFileSync(target).buffer.slice(0));
      const vocab = rows.length / ref.rows;
      if (!Number.isInteger(vocab) || vocab < V) throw new Error(`${target}: ${rows.length} values are not ${ref.rows} rows of at least ${V}`);
      // llama.cpp's vocabulary may be padded past the checkpoint's: the extra logits are dropped.
      a = agreementOf((i) => rows.subarray(i * vocab, i * vocab + V), reference, V, ref.sequences);
    } else {
      const [weights, mode] = target.split('@') as [string, string | undefined];
      if (mode !== undefined && !['fp8', 'fp8lt', 'dequant', 'half2', 'int8', 'i8mma'].includes(mode)) throw new Error(`${arg}: @${mode} is none of @fp8, @fp8lt, @dequant, @half2, @int8, @i8mma`);
      const runner = await CudaModelRunner.load(weights, {
        numBlocks: NUM_BLOCKS, blockSize: BLOCK, maxBatchedTokens: 1024, maxSeqs: 4,
        ...(mode === 'fp8' ? { weights: 'fp8' as const } : {}), ...(mode === 'fp8lt' ? { weights: 'fp8' as const, fp8Gemm: 'cublaslt' as const } : {}), ...(mode === 'dequant' ? { quantGemm: 'dequant' as const } : {}),
        ...(mode === 'half2' ? { qgemvMath: 'half2' as const } : {}), ...(mode === 'int8' ? { qgemvMath: 'int8' as const } : {}),
        ...(mode === 'i8mma' ? { qgemvMath: 'int8' as const, quantGemm: 'int8' as const } : {}),
      });
      try {
        if (runner.shape.vocabSize !== V) throw new Error(`${weights}: vocabulary ${runner.shape.vocabSize}, the reference's ${V}`);
        const rows = await oursAt(runner, ref.sequences, { numBlocks: NUM_BLOCKS, blockSize: BLOCK });
        a = agreementOf((i) => rows[i]!, reference, V, ref.sequences);
      } finally {
        runner.close();
      }
    }
    sides.set(`${kind}:${name}`, a);
    console.log(JSON.stringify({ side: `${kind}:${name}`, source: target, ...a, seconds: Math.round((performance.now() - t0) / 100) / 10 }));
  }
  const { pairs, failures } = verdicts(sides);
  console.log(JSON.stringify({ check: 'agreement', reference: refDir, rows: ref.rows, sides: Object.fromEntries(sides), pairs, ok: failures.length === 0, failures }));
  process.exitCode = failures.length === 0 ? 0 : 1;
}

if (import.meta.url === `file://${process.argv[1]}` || process.argv[1]?.endsWith('check-agreement.ts')) await main();
