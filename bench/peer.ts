/**
 * Peer comparison: this server's engine (continuous batching on the paged KV cache) against
 * @huggingface/transformers (transformers.js) text generation, on the same ONNX decoder file and the
 * same onnxruntime-node execution provider, in one run.
 *
 *   peer    transformers.js `model.generate`, one request at a time (its generate takes one batch and
 *           runs it to the end; it has no continuous batching), greedy
 *   engine  Engine + BlockManager with 1, 8 and 32 clients, each sending its next request when the
 *           last one is answered (as bench/throughput.ts)
 *
 * Both sides get the same token ids (the peer is given input_ids, so tokenization cannot differ) and
 * generate exactly BENCH_PEER_NEW_TOKENS tokens each: EOS is ignored by the engine (ignoreEos) and
 * disabled for the peer (eos_token_id []), so an EOS is an ordinary token on both sides. (min_new_tokens
 * would mask EOS out of the logits instead, changing the greedy choice where EOS is the argmax.)
 *
 * Env: BENCH_PEER_MODEL (decoder dir, default models/decoder), RAGGUARD_EXECUTION_PROVIDER (cpu,
 * webgpu, cuda, auto: resolved by our loader, and the peer uses the provider it resolved to),
 * BENCH_PEER_DTYPE (transformers.js dtype, default fp32; it only picks the file, see bench/PEER.md),
 * BENCH_PEER_NEW_TOKENS (64), BENCH_REQUESTS (32), BENCH_PEER_ROUNDS (3: the modes run interleaved this
 * many times, each reporting its best round).
 *
 * Last line of stdout: one JSON object (tokens/s, ratios engine / peer, TTFT p50s, equal_outputs).
 */
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { AutoModelForCausalLM, StoppingCriteria, Tensor, env, type DataType, type DeviceType } from '@huggingface/transformers';
import type { ExecutionProvider } from '../src/config/config.js';
import { BlockManager } from '../src/generate/block-manager.js';
import { DecoderModel } from '../src/backends/ort/decoder-model.js';

import { sessionOptions } from '../src/backends/ort/session.js';
import { ortEngine } from '../src/backends/ort/ort-runner.js';

const ROOT = path.resolve(import.meta.dirname, '..');
const MODEL = process.env['BENCH_PEER_MODEL'] ?? 'models/decoder';
const MODEL_DIR = path.resolve(ROOT, MODEL);
const PROVIDER = (process.env['RAGGUARD_EXECUTION_PROVIDER'] ?? 'cpu') as ExecutionProvider;
const DTYPE = (process.env['BENCH_PEER_DTYPE'] ?? 'fp32') as DataType;
const NEW_TOKENS = Number(process.env['BENCH_PEER_NEW_TOKENS'] ?? 64);
const REQUESTS = Number(process.env['BENCH_REQUESTS'] ?? 32);
const ROUNDS = Number(process.env['BENCH_PEER_ROUNDS'] ?? 3);
const CONCURRENCY = [1, 8, 32] as const;
const BLOCK = 16;

const model = await DecoderModel.load(MODEL_DIR, PROVIDER);
const questions = JSON.parse(await readFile(path.join(ROOT, 'data', 'questions.json'), 'utf8')) as { question: string }[];
const prompts = Array.from({ length: REQUESTS }, (_, i) =>
  [model.bosId ?? 1, ...model.tokenizer.encode(`Question: ${questions[i % questions.length]!.question}\nAnswer:`)]);

// transformers.js appends a dtype suffix to the file name (fp16 -> onnx/model_fp16.onnx); past KV
// tensors are typed from the graph's inputs, so fp32 loads onnx/model.onnx whatever its precision.
const suffix = DTYPE === 'fp32' ? '' : `_${DTYPE}`;
if (!existsSync(path.join(MODEL_DIR, 'onnx', `model${suffix}.onnx`))) {
  throw new Error(`BENCH_PEER_DTYPE=${DTYPE}: transformers.js would load onnx/model${suffix}.onnx, which ${MODEL_DIR} lacks; ` +
    'use fp32 to load onnx/model.onnx (the file the engine runs)');
}
env.allowRemoteModels = false;
env.allowLocalModels = true;
env.useFSCache = false;
env.localModelPath = path.dirname(MODEL_DIR);
const peer = await AutoModelForCausalLM.from_pretrained(path.basename(MODEL_DIR), {
  device: model.provider as DeviceType,
  dtype: DTYPE,
  model_file_name: 'model',
  // The engine's own session options; the provider comes from `device`.
  session_options: (({ executionProviders: _, ...rest }) => rest)(sessionOptions(model.provider)),
});

interface Run {
  outputs: number[][];
  seconds: number;
  /** Per request: submission to first token (peer), or to the answer (engine). */
  latenciesMs: number[];
}

const tokens = (r: Run) => r.outputs.reduce((s, o) => s + o.length, 0);
const tokensPerS = (r: Run) => +(tokens(r) / r.seconds).toFixed(1);

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return +(s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2).toFixed(2);
}

/**
 * Records when generate has its first new token: stopping criteria run once per step, right after
 * the step's token is sampled (and handed to any streamer). A criterion rather than a streamer
 * because the typings want a TextStreamer (with a tokenizer) there.
 */
class FirstToken extends StoppingCriteria {
  at = 0;
  override _call(inputIds: number[][]): boolean[] {
    this.at ||= performance.now();
    return inputIds.map(() => false);
  }
}

async function peerGenerate(ids: number[], maxNewTokens: number, firstToken?: FirstToken): Promise<number[]> {
  const dims = [1, ids.length];
  const out = await peer.generate({
    inputs: new Tensor('int64', BigInt64Array.from(ids, BigInt), dims),
    attention_mask: new Tensor('int64', new BigInt64Array(ids.length).fill(1n), dims),
    max_new_tokens: maxNewTokens,
    do_sample: false,
    eos_token_id: [],
    stopping_criteria: firstToken,
  });
  if (!(out instanceof Tensor)) throw new Error('transformers.js generate returned no sequences tensor');
  return (out.tolist() as bigint[][])[0]!.slice(ids.length).map(Number);
}

async function peerRun(): Promise<Run> {
  const outputs: number[][] = [];
  const latenciesMs: number[] = [];
  const t0 = performance.now();
  for (const p of prompts) {
    const first = new FirstToken();
    const start = performance.now();
    outputs.push(await peerGenerate(p, NEW_TOKENS, first));
    latenciesMs.push(first.at - start);
  }
  return { outputs, seconds: (performance.now() - t0) / 1000, latenciesMs };
}

async function engineRun(concurrency: number, maxNewTokens: number): Promise<Run> {
  const tokensPerSeq = Math.max(...prompts.map((p) => p.length)) + maxNewTokens;
  const numBlocks = Math.ceil(tokensPerSeq / BLOCK) * concurrency + 8;
  const blocks = new BlockManager({ numBlocks, blockSize: BLOCK, watermark: 0.01, enablePrefixCaching: true });
  const engine = ortEngine(model, blocks, { numBlocks, blockSize: BLOCK, maxNumSeqs: concurrency, maxNumBatchedTokens: 8192 });
  const outputs: number[][] = new Array(prompts.length);
  const latenciesMs: number[] = new Array(prompts.length);
  let next = 0;
  const t0 = performance.now();
  // `concurrency` clients, each sending its next request when the last one is answered.
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < prompts.length) {
      const i = next++;
      const start = performance.now();
      outputs[i] = (await engine.generate(prompts[i]!, { maxNewTokens, temperature: 0, ignoreEos: true })).ids;
      latenciesMs[i] = performance.now() - start;
    }
  }));
  return { outputs, seconds: (performance.now() - t0) / 1000, latenciesMs };
}

// Warm-up: first runs pay for graph optimisation and allocator growth.
await peerGenerate(prompts[0]!, 4);
await engineRun(1, 4);

// Engine has no first-token hook (generate resolves with the whole answer), so its TTFT is measured by
// a second pass of 1-token requests at the same concurrency: submission to that token, i.e. queueing
// plus prefill behind other prefills, without the decode steps that interleave in the full run.
interface Measured {
  run: Run;
  ttftMs: number;
}
const modes: [string, () => Promise<Measured>][] = [
  ['transformers.js, sequential', async () => {
    const run = await peerRun();
    return { run, ttftMs: median(run.latenciesMs) };
  }],
  ...CONCURRENCY.map((c): [string, () => Promise<Measured>] => [`engine, ${c} concurrent`, async () =>
    ({ run: await engineRun(c, NEW_TOKENS), ttftMs: median((await engineRun(c, 1)).latenciesMs) })]),
];
// Rounds interleave the modes; each keeps its best tokens/s and TTFT (timeit-style, against noise).
const best = new Map<string, Measured>();
const perRound = new Map<string, number[]>(modes.map(([name]) => [name, []]));
let reference: number[][] | undefined;
let mismatched = 0;
for (let round = 0; round < ROUNDS; round++) {
  for (const [name, measure] of modes) {
    const m = await measure();
    reference ??= m.run.outputs;
    mismatched += m.run.outputs.filter((o, i) => o.join() !== reference![i]!.join()).length;
    perRound.get(name)!.push(tokensPerS(m.run));
    const b = best.get(name);
    best.set(name, { run: b && tokensPerS(b.run) >= tokensPerS(m.run) ? b.run : m.run, ttftMs: Math.min(m.ttftMs, b?.ttftMs ?? Infinity) });
  }
}
const [peerBest, ...engineBest] = modes.map(([name]) => best.get(name)!) as [Measured, ...Measured[]];
const peerTokensPerS = tokensPerS(peerBest.run);
const result: Record<string, number | string | boolean> = { peer_tokens_per_s: peerTokensPerS, peer_ttft_ms_p50: peerBest.ttftMs };
CONCURRENCY.forEach((c, k) => {
  const { run, ttftMs } = engineBest[k]!;
  result[`tokens_per_s_at_${c}`] = tokensPerS(run);
  result[`ratio_at_${c}`] = +(tokensPerS(run) / peerTokensPerS).toFixed(2);
  result[`ttft_ms_p50_at_${c}`] = ttftMs;
});
// Where the model directory carries torch's greedy ids (scripts/gpu/build_qwen2_05b.py writes them),
// the engine's must be the same: a cross-check against the reference implementation.
const refFile = path.join(MODEL_DIR, 'reference.json');
if (existsSync(refFile)) {
  const ref = JSON.parse(await readFile(refFile, 'utf8')) as { max_new_tokens: number; cases: { prompt_ids: number[]; greedy_ids: number[] }[] };
  const blocks = new BlockManager({ numBlocks: 256, blockSize: BLOCK, watermark: 0.01, enablePrefixCaching: true });
  const engine = ortEngine(model, blocks, { numBlocks: 256, blockSize: BLOCK, maxNumSeqs: 8, maxNumBatchedTokens: 8192 });
  const ours = await Promise.all(ref.cases.map((c) => engine.generate(c.prompt_ids, { maxNewTokens: ref.max_new_tokens, temperature: 0, ignoreEos: true })));
  result['torch_reference_cases'] = ref.cases.length;
  result['torch_reference_matches'] = ours.filter((g, i) => g.ids.join() === ref.cases[i]!.greedy_ids.join()).length;
  // Leading tokens equal to torch's, per case: where float16 rounding first flips an argmax, if anywhere.
  result['torch_reference_agreeing_prefix'] = ours.map((g, i) => {
    const r = ref.cases[i]!.greedy_ids;
    let k = 0;
    while (k < r.length && g.ids[k] === r[k]) k++;
    return k;
  }).join(',');
}

// Memory traffic of decode, against the GPU's bandwidth: a step reads every weight once (the ONNX file's
// bytes) plus each row's KV over its context (mean: prompt + half the new tokens); at c concurrent a
// step yields c tokens. Prefill is counted as decode here, so the figure is a lower bound.
const meanContext = prompts.reduce((s, p) => s + p.length, 0) / prompts.length + NEW_TOKENS / 2;
const stepBytes = (rows: number) => model.files.onnxBytes + rows * meanContext * model.kvBytesPerToken;
const PEAK_BYTES_PER_S = Number(process.env['BENCH_PEER_PEAK_GBPS'] ?? 4300) * 1e9;
const bandwidth = (tokensPerSecond: number, rows: number) => (tokensPerSecond / rows) * stepBytes(rows);
result['weight_bytes'] = model.files.onnxBytes;
result['peer_bytes_per_s'] = Math.round(bandwidth(peerTokensPerS, 1));
CONCURRENCY.forEach((c) => {
  const bytesPerS = bandwidth(result[`tokens_per_s_at_${c}`] as number, c);
  result[`bytes_per_s_at_${c}`] = Math.round(bytesPerS);
  result[`fraction_of_peak_bandwidth_at_${c}`] = +(bytesPerS / PEAK_BYTES_PER_S).toFixed(4);
});
result['peak_bandwidth_bytes_per_s'] = PEAK_BYTES_PER_S;
Object.assign(result, {
  equal_outputs: mismatched === 0,
  mismatched_outputs: mismatched,
  provider: model.provider,
  model: MODEL,
  dtype: DTYPE,
  requests: REQUESTS,
  new_tokens: NEW_TOKENS,
  rounds: ROUNDS,
});

console.log(`best of ${ROUNDS} round(s)             tokens  seconds  tokens/s  ttft p50 ms  tokens/s by round`);
for (const [name] of modes) {
  const { run, ttftMs } = best.get(name)!;
  console.log(`${name.padEnd(28)} ${String(tokens(run)).padStart(7)}  ${run.seconds.toFixed(2).padStart(7)}  ${tokensPerS(run).toFixed(1).padStart(8)}  ` +
    `${ttftMs.toFixed(1).padStart(11)}  ${perRound.get(name)!.join(' ')}`);
}
console.log(JSON.stringify(result));
