/**
 * Decode throughput on a GGUF decoder: this server's engine (the GGUF converted into the genai graph,
 * continuous batching on the paged KV cache) against llama.cpp itself (node-llama-cpp 3.21.1, prebuilt
 * CPU binaries) on the same file, in one run, at 1 and 8 concurrent requests.
 *
 *   engine  Engine + BlockManager; `concurrency` clients, each sending its next request when the last
 *           one is answered (as bench/peer.ts)
 *   llama   one node-llama-cpp context with `concurrency` sequences, a client per sequence doing the
 *           same; llama.cpp batches the sequences' tokens into one evaluation per step
 *
 * Both sides get the same token ids (chat-formatted questions from data/questions.json, tokenized by
 * the converted tokenizer, which matches llama.cpp's: test/gguf.test.ts) and generate exactly
 * BENCH_GGUF_NEW_TOKENS greedy tokens each, EOS ignored. ONNX Runtime's threads are the server's
 * (RAGGUARD_INTRA_OP_THREADS, default one per core; RAGGUARD_INTRA_OP_SPIN). llama.cpp runs with each thread count of BENCH_GGUF_LLAMA_THREADS (default 1 and the
 * core count) and its best is the peer's figure: its workers spin-wait for each other, and on this
 * shared 2-core machine two threads measured 3-12 tokens/s where one made 23-28.
 *
 * Env: BENCH_GGUF (default models/pretrained/SmolLM2-135M-Instruct.Q4_1.gguf), RAGGUARD_GGUF_WEIGHTS
 * (nbits|dequant, as the server), BENCH_GGUF_NEW_TOKENS (64), BENCH_REQUESTS (16 at 8 concurrent; a
 * quarter of it at 1), BENCH_ROUNDS (2: the sides interleaved, each reporting its best round).
 *
 * Last line of stdout: one JSON object (tokens/s per side and concurrency, ratios engine / llama.cpp,
 * CPU milliseconds a token per side (the process's CPU time over the run: on a machine shared with
 * other work the wall clock says as much about the neighbours), the 1-minute load average at the end,
 * and how many greedy tokens the two sides share on the first prompt).
 */
import { availableParallelism, loadavg } from 'node:os';
import path from 'node:path';
import { getLlama, type LlamaContextSequence, type Token } from 'node-llama-cpp';
import { BlockManager } from '../src/generate/block-manager.js';

import { ggufWorkload } from './gguf-workload.js';
import { ortEngine } from '../src/backends/ort/ort-runner.js';

// llama.cpp runs in this process (node-llama-cpp) on the same libuv worker threads as ragguard's ops, both on
// AMX where the CPU has it: ragguard's prefill products put back the thread's tile configuration they found
// (qmatmul.c, amx_begin / amx_end), which llama.cpp's AMX kernels load once a thread and keep. Before 3fa5fb5
// they released it, llama.cpp's next tile load died with SIGILL, and this bench set RAGGUARD_OPS_AMX=0.

const ROOT = path.resolve(import.meta.dirname, '..');
const GGUF = path.resolve(ROOT, process.env['BENCH_GGUF'] ?? 'models/pretrained/SmolLM2-135M-Instruct.Q4_1.gguf');
const NEW_TOKENS = Number(process.env['BENCH_GGUF_NEW_TOKENS'] ?? 64);
const REQUESTS = Number(process.env['BENCH_REQUESTS'] ?? 16);
const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 2);
const CONCURRENCY = [1, 8] as const;
const BLOCK = 16;
const THREADS = availableParallelism();
const LLAMA_THREADS = (process.env['BENCH_GGUF_LLAMA_THREADS'] ?? `1,${THREADS}`).split(',').map(Number).filter((n, i, a) => n > 0 && a.indexOf(n) === i);

const { cfg, model, prompts, maxPrompt } = await ggufWorkload(ROOT, GGUF, REQUESTS);

const llama = await getLlama({ gpu: false, build: 'never' });
const peer = await llama.loadModel({ modelPath: GGUF });

interface Run {
  outputs: number[][];
  seconds: number;
  /** The process's CPU seconds (user + system) over the run: what a step costs whatever else the machine runs. */
  cpuSeconds: number;
}

const count = (r: Run) => r.outputs.reduce((s, o) => s + o.length, 0);
const tokensPerS = (r: Run) => +(count(r) / r.seconds).toFixed(1);
const cpuMsPerToken = (r: Run) => +((r.cpuSeconds * 1000) / count(r)).toFixed(2);

/** `concurrency` clients over `requests` prompts, each sending its next when the last is answered. */
async function clients(concurrency: number, requests: number, one: (client: number, ids: number[]) => Promise<number[]>): Promise<Run> {
  const outputs: number[][] = new Array(requests);
  let next = 0;
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async (_, c) => {
    while (next < requests) {
      const i = next++;
      outputs[i] = await one(c, prompts[i]!);
    }
  }));
  const c = process.cpuUsage(c0);
  return { outputs, seconds: (performance.now() - t0) / 1000, cpuSeconds: (c.user + c.system) / 1e6 };
}

async function engineRun(concurrency: number, requests: number, newTokens = NEW_TOKENS): Promise<Run> {
  const numBlocks = Math.ceil((maxPrompt + newTokens) / BLOCK) * concurrency + 8;
  const blocks = new BlockManager({ numBlocks, blockSize: BLOCK, watermark: 0.01, enablePrefixCaching: false });
  const engine = ortEngine(model, blocks, { numBlocks, blockSize: BLOCK, maxNumSeqs: concurrency, maxNumBatchedTokens: 8192 });
  return clients(concurrency, requests, async (_c, ids) => (await engine.generate(ids, { maxNewTokens: newTokens, temperature: 0, ignoreEos: true })).ids);
}

async function llamaRun(concurrency: number, requests: number, threads: number, newTokens = NEW_TOKENS): Promise<Run> {
  const context = await peer.createContext({ contextSize: concurrency * (maxPrompt + newTokens + 16), sequences: concurrency, threads });
  const seqs: LlamaContextSequence[] = Array.from({ length: concurrency }, () => context.getSequence());
  try {
    return await clients(concurrency, requests, async (c, ids) => {
      const seq = seqs[c]!;
      await seq.clearHistory();
      const out: number[] = [];
      // Greedy (temperature 0); the generator goes on past EOS until it is left.
      for await (const t of seq.evaluate(ids as Token[], { temperature: 0 })) {
        out.push(t);
        if (out.length >= newTokens) break;
      }
      return out;
    });
  } finally {
    await context.dispose();
  }
}

// Warm-up: first runs pay for graph optimisation and allocator growth on both sides.
await engineRun(1, 1, 4);
await llamaRun(1, 1, 1, 4);

const best: Record<string, Run> = {};
const llamaBestThreads: Record<number, number> = {};
for (let round = 0; round < ROUNDS; round++) {
  for (const c of CONCURRENCY) {
    const requests = c === 1 ? Math.max(1, REQUESTS >> 2) : REQUESTS;
    const sides: [string, () => Promise<Run>][] = [['engine', () => engineRun(c, requests)], ...LLAMA_THREADS.map((t) => [`llama(${t} threads)`, () => llamaRun(c, requests, t)] as [string, () => Promise<Run>])];
    for (const [side, run] of sides) {
      const r = await run();
      const key = `${side.startsWith('llama') ? 'llama' : 'engine'}_${c}`;
      if (!best[key] || tokensPerS(r) > tokensPerS(best[key])) {
        best[key] = r;
        if (side.startsWith('llama')) llamaBestThreads[c] = Number(/\d+/.exec(side)![0]);
      }
      console.log(`[bench:gguf] round ${round + 1} ${side} at ${c}: ${tokensPerS(r)} tokens/s, ${cpuMsPerToken(r)} CPU ms a token (${requests} x ${NEW_TOKENS})`);
    }
  }
}
const first = [best['engine_1']!.outputs[0]!, best['llama_1']!.outputs[0]!];
let shared = 0;
while (shared < NEW_TOKENS && first[0]![shared] === first[1]![shared]) shared++;
const result = {
  bench: 'gguf', model: path.basename(GGUF), weights: cfg.ggufWeights, threads: THREADS, intra_op_spin: cfg.intraOpSpin, new_tokens: NEW_TOKENS, requests: REQUESTS, rounds: ROUNDS,
  engine_tokens_per_s_at_1: tokensPerS(best['engine_1']!), llama_cpp_tokens_per_s_at_1: tokensPerS(best['llama_1']!),
  engine_tokens_per_s_at_8: tokensPerS(best['engine_8']!), llama_cpp_tokens_per_s_at_8: tokensPerS(best['llama_8']!),
  ratio_at_1: +(tokensPerS(best['engine_1']!) / tokensPerS(best['llama_1']!)).toFixed(2),
  ratio_at_8: +(tokensPerS(best['engine_8']!) / tokensPerS(best['llama_8']!)).toFixed(2),
  engine_cpu_ms_per_token_at_1: cpuMsPerToken(best['engine_1']!), llama_cpp_cpu_ms_per_token_at_1: cpuMsPerToken(best['llama_1']!),
  engine_cpu_ms_per_token_at_8: cpuMsPerToken(best['engine_8']!), llama_cpp_cpu_ms_per_token_at_8: cpuMsPerToken(best['llama_8']!),
  llama_cpp_best_threads_at_1: llamaBestThreads[1], llama_cpp_best_threads_at_8: llamaBestThreads[8],
  load_average: +(loadavg()[0]!).toFixed(1),
  first_prompt_shared_greedy_tokens: shared,
};
await peer.dispose();
await llama.dispose();
console.log(JSON.stringify(result));
