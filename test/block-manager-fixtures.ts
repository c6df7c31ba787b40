/**
 * The block manager tests' small pool: blocks of BS tokens, prefix caching on unless asked, and the
 * token ids and block ids they read (block-manager.test.ts, prefix-cache.test.ts).
 */
import { BlockManager } from '../src/generate/block-manager.js';

export const BS = 4;

export function manager(numBlocks: number, opts: { watermark?: number; enablePrefixCaching?: boolean } = {}): BlockManager {
  return new BlockManager({ numBlocks, blockSize: BS, watermark: opts.watermark ?? 0, enablePrefixCaching: opts.enablePrefixCaching ?? true });
}

/** n distinct-looking token ids starting at `from`. */
export function toks(n: number, from = 100): number[] {
  return Array.from({ length: n }, (_, i) => from + i);
}

export function ids(m: BlockManager, seqId: number): number[] {
  return Array.from(m.blockTable(seqId).ids());
}
