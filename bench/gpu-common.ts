/** What bench:gpu and bench:gpu-lora share: random prompts and an engine over a CUDA runner's whole pool. */
import { execFileSync } from 'node:child_process';
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

/**
 * The card a run is on and its memory's peak bandwidth by the vendor's datasheet (bytes per second), from
 * nvidia-smi's name: a bandwidth fraction is of the card measured, not of another (H100 SXM 3.35 TB/s, H200
 * 4.8 TB/s). `peak` is null for a card not in the table (the fraction is then not given, never guessed).
 */
export function cardPeak(name: string): { card: string; peak: number | null } {
  const table: [RegExp, number][] = [
    [/H200/i, 4.8e12],
    [/H100.*NVL/i, 3.9e12],
    [/H100.*PCIe/i, 2.0e12],
    [/H100/i, 3.35e12],
    [/A100.*80GB/i, 2.039e12],
    [/A100/i, 1.555e12],
    [/L40S/i, 0.864e12],
  ];
  const hit = table.find(([re]) => re.test(name));
  return { card: name, peak: hit ? hit[1] : null };
}

/** The name of GPU 0 as nvidia-smi gives it ('unknown' where it cannot be asked). */
export function gpuName(): string {
  try {
    return execFileSync('nvidia-smi', ['--query-gpu=name', '--format=csv,noheader', '-i', '0'], { encoding: 'utf8' }).trim() || 'unknown';
  } catch {
    return 'unknown';
  }
}
