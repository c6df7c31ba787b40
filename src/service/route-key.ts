/**
 * The router's prefix key: what HAProxy hashes (header `x-ragguard-prefix-key`, consistent hashing with
 * bounded load) so that the requests of one conversation reach the replica whose prefix cache holds its
 * KV blocks, while conversations that share only a long system prompt spread over the replicas.
 *
 * The key is derived from the prompt's KV block hashes (prefix-hash.ts, the same chain the prefix cache
 * looks blocks up by, adapter and tenant salt included), taken up to the end of the conversation's
 * first user message: the blocks before it are the system prompt that many chats share, the first user
 * message is what tells one conversation from another, and everything up to it is the same at every
 * later turn (turn 2's prompt starts with turn 1's), so the key does not move between turns. The full
 * blocks through that point are hashed as the chain, the tokens of the last, partial block after them
 * are added to the key (not a KV block yet, but part of what tells two conversations apart).
 *
 * `maxBlocks` (N > 0) caps the key at the prompt's first N blocks: requests sharing those N blocks then
 * share a key and one replica (partitioning many distinct long prefixes over the replicas, each cached
 * once), and only the bounded load (hash-balance-factor) spreads them, under concurrency. 0 (the
 * default): no cap, one key per conversation. docs/deploy-cluster.md says why that default.
 */
import { hash } from 'node:crypto';
import { hashBlock, type BlockHash } from '../generate/prefix-hash.js';

/** The header a client sends (and HAProxy hashes first). */
export const ROUTE_KEY_HEADER = 'x-ragguard-prefix-key';

export interface RouteKeyOptions {
  /** Tokens per KV block (RAGGUARD_KV_BLOCK_SIZE). */
  blockSize: number;
  /** Cap the key at the first N blocks; 0 or undefined: no cap. */
  maxBlocks?: number;
  /** The LoRA adapter the request generates with (its KV differs), undefined for the base decoder. */
  adapter?: string;
  /** The tenant's cache salt (tenant.ts): a tenant's blocks are its own, so is its key. */
  salt?: string;
}

export interface RouteKey {
  /** 32 hex digits (128 bits of a SHA-256). */
  key: string;
  /** Full KV blocks hashed into it. */
  blocks: number;
  /** Prompt tokens the key covers (the full blocks and the partial one's tokens). */
  tokens: number;
}

/**
 * The key of a prompt `ids` whose conversation identity ends at token `stableEnd` (for a chat, the end of
 * its first user message; ids.length for a plain prompt): the KV block chain over the full blocks before
 * min(stableEnd, maxBlocks x blockSize), and the remaining tokens before that point.
 */
export function routeKey(ids: ArrayLike<number>, stableEnd: number, o: RouteKeyOptions): RouteKey {
  const bs = o.blockSize;
  if (!Number.isInteger(bs) || bs < 1) throw new Error(`blockSize must be a positive integer, not ${bs}`);
  let end = Math.max(0, Math.min(stableEnd, ids.length));
  if (o.maxBlocks !== undefined && o.maxBlocks > 0) end = Math.min(end, o.maxBlocks * bs);
  const full = Math.floor(end / bs);
  let chain: BlockHash | undefined;
  const slice = (a: number, b: number) => Array.from({ length: b - a }, (_, i) => ids[a + i]!);
  for (let i = 0; i < full; i++) chain = hashBlock(chain, slice(i * bs, (i + 1) * bs), o.adapter, o.salt);
  // The partial block: the tokens after the chain, hashed as a block would be, so that two prompts
  // differing there have different keys.
  const tail = slice(full * bs, end);
  const last = tail.length > 0 || chain === undefined ? hashBlock(chain, tail, o.adapter, o.salt) : chain;
  const key = hash('sha256', `ragguard-route-key/1:${last}`, 'hex').slice(0, 32);
  return { key, blocks: full, tokens: end };
}

/** Length of the common prefix of two token sequences. */
export function commonPrefix(a: ArrayLike<number>, b: ArrayLike<number>): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}
