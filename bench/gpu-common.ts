/** What bench:gpu and bench:gpu-lora share: random prompts and an engine over a CUDA runner's whole pool. */
import type { CudaModelRunner } from '../src/backends/cuda/cuda-runner.js';
import { BlockManager } from '../src/generate/block-manager.js';
import { Engine } from '../src/generate/engine.js';
import { seededRandom } from '../src/generate/sampler.js';

export const BLOCK = 16;

/** `n` prompts of `len` random ids (above the first three, which tokenizers keep for specials). */
export function randomPrompts(n: number, len: number, vocab: number, seed: number): number[][] {
  const r = seededRandom(seed);
  return Array.from({ length: n }, () => Array.from({ length: len }, () => 3 + Math.floor(r() * (vocab - 3))));
}

/** An engine over the runner's pool, prefix caching off (every request computes its prompt). */
export function engineFor(runner: CudaModelRunner, maxNumSeqs: number): Engine {
  const { numBlocks } = runner.pool;
  const blocks = new BlockManager({ numBlocks, blockSize: BLOCK, watermark: 0.01, enablePrefixCaching: false });
  return new Engine(runner, blocks, { numBlocks, blockSize: BLOCK, maxNumSeqs, maxNumBatchedTokens: runner.limits.maxBatchedTokens });
}
