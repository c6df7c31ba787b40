/**
 * A stand-in for the native CUDA library (binding.ts's CudaBackend) on machines without a GPU: its
 * "model" answers each sequence with (its last token + 1) mod vocab, read from the packed step as the
 * kernels read it; its plan and memory figures are step-pack.ts's, as the real library's must be. So the
 * CUDA runner's and the server's own logic run on the CPU (scripts/check-cuda.ts checks the device).
 */
import type { CudaBackend, EngineHandle, NativeConfig, NativeMemory } from '../src/backends/cuda/binding.js';
import { parseConfig } from '../src/backends/cuda/hf-checkpoint.js';
import { planDevice } from '../src/backends/cuda/step-pack.js';

export interface StandIn extends CudaBackend {
  /** Each step's token and sequence counts. */
  readonly steps: { T: number; S: number }[];
  /** Engines created and not destroyed. */
  live: number;
}

export function standInCuda(config: Record<string, unknown>): StandIn {
  const parsed = parseConfig(config as Parameters<typeof parseConfig>[0]);
  const vocab = parsed.vocabSize;
  const planOf = (cfg: NativeConfig) => planDevice(parsed, cfg.dtype === 1 ? 'bfloat16' : 'float16', {
    numBlocks: cfg.num_blocks, blockSize: cfg.block_size, maxBatchedTokens: cfg.max_batched_tokens, maxSeqs: cfg.max_seqs,
    maxBlocksPerSeq: cfg.max_blocks_per_seq, cublasWorkspaceBytes: cfg.cublas_workspace_bytes,
    maxLoras: cfg.max_loras, maxLoraRank: cfg.max_lora_rank,
  });
  const engines = new Map<EngineHandle, NativeConfig>();
  const s: StandIn = {
    steps: [],
    live: 0,
    deviceCount: () => 1,
    plan: (cfg) => {
      const p = planOf(cfg);
      return [p.weights, p.kvPool, p.workspace, p.cublasWorkspace, p.hostPinned, p.lora];
    },
    create: (cfg) => {
      const h = {} as EngineHandle;
      engines.set(h, cfg);
      s.live++;
      return h;
    },
    destroy: (h) => {
      if (engines.delete(h)) s.live--;
    },
    setRope: () => {},
    loadTensor: () => {},
    loadDone: () => {},
    captureGraphs: () => 0,
    step: (_h, words, tokensOut) => new Promise((resolve) => setImmediate(() => {
      const T = words[0]!, S = words[1]!;
      s.steps.push({ T, S });
      const ids = words.subarray(4, 4 + T);
      const last = words.subarray(4 + 4 * T + S, 4 + 4 * T + 2 * S);
      for (let r = 0; r < S; r++) tokensOut[r] = (ids[last[r]!]! + 1) % vocab;
      resolve();
    })),
    copyBlocks: () => {},
    loraWrite: () => {},
    memory: (h): NativeMemory => {
      const cfg = engines.get(h);
      if (!cfg) throw new Error('no such engine');
      const p = planOf(cfg);
      return {
        weights: p.weights, kv_pool: p.kvPool, workspace: p.workspace, cublas_workspace: p.cublasWorkspace, graphs: 0,
        host_pinned: p.hostPinned, total: p.total, device_free: 100e9, device_total: 141e9, lora: p.lora,
      };
    },
  };
  return s;
}
