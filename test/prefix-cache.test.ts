/**
 * Prefix caching in the paged KV bookkeeping, after vLLM's tests: hits on full blocks, a prompt's last
 * token always recomputed, hits across preemption, isolation by adapter and by a tenant's cache salt, the
 * hash chain, and the pool's least-recently-freed eviction.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { BlockPool } from '../src/generate/block-pool.js';
import { hashBlock } from '../src/generate/prefix-hash.js';
import { BS, ids, manager, toks } from './block-manager-fixtures.js';

test('prefix hit: a second sequence with the same full blocks reuses them and reports the computed tokens', () => {
  const m = manager(16);
  const a = toks(14); // 3 full blocks + 2
  assert.equal(m.allocate({ id: 0, tokenIds: a }), 0);
  assert.equal(m.allocate({ id: 1, tokenIds: [...a.slice(0, 12), 1, 2, 3] }), 12);
  assert.deepEqual(ids(m, 1).slice(0, 3), ids(m, 0).slice(0, 3));
  assert.notEqual(ids(m, 1)[3], ids(m, 0)[3], 'the partial block is never shared');
  for (const b of ids(m, 0).slice(0, 3)) assert.equal(m.pool.refCount(b), 2);
  assert.equal(m.numComputedTokens(1), 12);
  assert.equal(m.allocate({ id: 2, tokenIds: [...a.slice(0, 8), 0, 0, 0, 0, 0] }), 8, 'the chain stops at the first differing block');
  assert.equal(m.allocate({ id: 3, tokenIds: [...a.slice(0, 4), 0, ...a.slice(5)] }), 4, 'a later block equal in tokens but not in prefix is no hit');
  // A prompt made only of cached blocks still recomputes its last one, for its logits.
  assert.equal(m.allocate({ id: 4, tokenIds: a.slice(0, 12) }), 8);
  assert.equal(m.blockTable(4).get(1), m.blockTable(0).get(1));
  assert.notEqual(m.blockTable(4).get(2), m.blockTable(0).get(2));
});

test('a one-block prompt is never a hit (its last token must be recomputed)', () => {
  const m = manager(8);
  m.allocate({ id: 0, tokenIds: toks(4) });
  assert.equal(m.allocate({ id: 1, tokenIds: toks(4) }), 0);
  assert.equal(m.allocate({ id: 2, tokenIds: toks(5) }), 4);
});

test('without prefix caching nothing is shared', () => {
  const m = manager(16, { enablePrefixCaching: false });
  m.allocate({ id: 0, tokenIds: toks(12) });
  assert.equal(m.allocate({ id: 1, tokenIds: toks(13) }), 0);
  assert.equal(m.stats().usedBlocks, 3 + 4);
});

test('blocks filled by appends join the prefix cache', () => {
  const m = manager(16);
  m.allocate({ id: 0, tokenIds: toks(3) });
  m.appendSlots(0, [7, 8, 9, 10, 11]); // tokens 100 101 102 7 | 8 9 10 11
  assert.equal(m.allocate({ id: 1, tokenIds: [100, 101, 102, 7, 8, 9, 10, 11, 5] }), 8);
  assert.equal(m.allocate({ id: 2, tokenIds: [100, 101, 102, 7, 8, 9, 10, 12, 5] }), 4);
});

test('preemption: free, then allocate the same tokens again, hits the prefix cache for every full block', () => {
  const m = manager(16);
  const prompt = toks(10);
  m.allocate({ id: 0, tokenIds: prompt });
  const generated = [1, 2, 3, 4, 5, 6, 7];
  for (const t of generated) m.appendSlots(0, [t]); // 17 tokens: 4 full blocks + 1
  const before = ids(m, 0).slice(0, 4);
  m.free(0);
  let s = m.stats();
  assert.equal(s.freeBlocks, 16);
  assert.equal(s.usedBlocks, 0);
  assert.equal(s.cachedBlocks, 4, 'the 4 full blocks stay cached, the partial one does not');
  assert.equal(m.canAllocate({ id: 0, tokenIds: [...prompt, ...generated] }), 'ok');
  assert.equal(m.allocate({ id: 0, tokenIds: [...prompt, ...generated] }), 16);
  assert.deepEqual(ids(m, 0).slice(0, 4), before, 'the very same physical blocks');
  s = m.stats();
  assert.equal(s.cachedBlocks, 0);
  assert.equal(s.usedSlots, 17);
});

test('one sequence object re-checked while its tokens grow (a queued, then preempted, sequence) gets the right hits', () => {
  const m = manager(16);
  m.allocate({ id: 9, tokenIds: toks(16) }); // caches 4 blocks (3 may be hit by a longer prompt)
  const tokens = toks(6);
  const seq = { id: 0, get tokenIds(): readonly number[] { return tokens; } };
  assert.equal(m.canAllocate(seq), 'ok'); // remembers the hash of block 0
  tokens.push(...toks(10, 106)); // now the same 16 tokens as sequence 9
  assert.equal(m.allocate(seq), 12, 'the remembered hash is extended, not stale');
  m.free(0);
  tokens.push(1, 2, 3, 4, 5);
  assert.equal(m.allocate(seq), 16);
  m.free(0);
  assert.equal(m.allocate(seq), 20, 'the block filled at the last allocation is cached too');
});

test('adapter isolation: the same tokens under another adapter do not share KV', () => {
  const m = manager(32);
  const p = toks(9);
  m.allocate({ id: 0, tokenIds: p });
  assert.equal(m.allocate({ id: 1, tokenIds: p, adapter: 'lora-a' }), 0);
  assert.equal(m.allocate({ id: 2, tokenIds: p, adapter: 'lora-b' }), 0);
  assert.equal(m.allocate({ id: 3, tokenIds: p, adapter: 'lora-a' }), 8, 'same adapter: a hit');
  assert.deepEqual(ids(m, 3).slice(0, 2), ids(m, 1).slice(0, 2));
  assert.equal(m.allocate({ id: 4, tokenIds: p }), 8, 'no adapter: the base model entries');
  assert.deepEqual(ids(m, 4).slice(0, 2), ids(m, 0).slice(0, 2));
  assert.equal(m.allocate({ id: 5, tokenIds: p, adapter: '' }), 0, 'an empty adapter name is not the base model');
  // appended blocks are per adapter too
  m.appendSlots(1, [1, 2, 3]); // adapter 'lora-a': block 2 full
  assert.equal(m.allocate({ id: 6, tokenIds: [...p, 1, 2, 3, 0] }), 8);
  assert.equal(m.allocate({ id: 7, tokenIds: [...p, 1, 2, 3, 0], adapter: 'lora-a' }), 12);
});

test('prefix hashes chain the parent, the tokens and the adapter', () => {
  const t = [1, 2, 3, 4];
  const h = hashBlock(undefined, t);
  assert.equal(h, hashBlock(undefined, [1, 2, 3, 4]), 'deterministic');
  assert.notEqual(hashBlock(h, t), h, 'the parent is part of the hash');
  assert.notEqual(hashBlock(undefined, t, 'a'), h);
  assert.notEqual(hashBlock(undefined, t, 'a'), hashBlock(undefined, t, 'b'));
  assert.notEqual(hashBlock(undefined, t, ''), h);
  assert.notEqual(hashBlock(undefined, [1, 2, 3, 5]), h);
  assert.notEqual(hashBlock(undefined, [65536 + 1, 2, 3, 4]), h, 'ids are not truncated to 16 bits');
});

test('tenant isolation: the same tokens under another cache salt never hit; the same salt does', () => {
  const m = manager(64);
  const p = toks(13); // three full blocks and one token
  assert.equal(m.allocate({ id: 0, tokenIds: p, cacheSalt: 'key:a' }), 0);
  m.free(0); // a's blocks stay in the prefix cache
  assert.equal(m.allocate({ id: 1, tokenIds: p, cacheSalt: 'key:b' }), 0, "b's identical prompt finds none of a's blocks");
  assert.equal(m.allocate({ id: 2, tokenIds: p }), 0, 'nor does an unsalted prompt');
  assert.equal(m.allocate({ id: 3, tokenIds: p, cacheSalt: 'key:a' }), 12, "a's repeat hits its own blocks");
  assert.equal(new Set([...ids(m, 1), ...ids(m, 3)]).size, ids(m, 1).length + ids(m, 3).length, "no physical block shared between a and b");
  assert.equal(m.allocate({ id: 4, tokenIds: p, cacheSalt: 'key:b' }), 12, "b's repeat hits b's blocks");
  assert.deepEqual(ids(m, 4).slice(0, 3), ids(m, 1).slice(0, 3));
  // A block filled while decoding chains from the salted prefix: still the tenant's own.
  const short = toks(3, 500);
  m.allocate({ id: 5, tokenIds: short, cacheSalt: 'key:a' });
  m.appendSlots(5, [7]); // the first block becomes full during decode (no parent hash yet)
  assert.equal(m.allocate({ id: 6, tokenIds: [...short, 7, 8], cacheSalt: 'key:b' }), 0);
  assert.equal(m.allocate({ id: 7, tokenIds: [...short, 7, 8], cacheSalt: 'key:a' }), 4);
  // Salt and adapter both count.
  assert.equal(m.allocate({ id: 8, tokenIds: p, cacheSalt: 'key:a', adapter: 'lora-a' }), 0);
});

test('a salt goes into the first block only; without one the hash is as it was', () => {
  const t = [1, 2, 3, 4];
  const plain = hashBlock(undefined, t);
  assert.equal(hashBlock(undefined, t, undefined, undefined), plain);
  assert.notEqual(hashBlock(undefined, t, undefined, 'key:a'), plain);
  assert.notEqual(hashBlock(undefined, t, undefined, 'key:a'), hashBlock(undefined, t, undefined, 'key:b'));
  assert.notEqual(hashBlock(undefined, t, undefined, ''), plain, 'an empty salt is still a salt');
  assert.notEqual(hashBlock(undefined, t, 'a', undefined), hashBlock(undefined, t, undefined, 'a'), 'a salt is not an adapter name');
  // After the first block the parent carries the salt.
  assert.equal(hashBlock(plain, t, undefined, 'key:a'), hashBlock(plain, t));
});

test('pool: cached free blocks are evicted least recently freed first; a hit revives one', () => {
  const pool = new BlockPool(3, BS);
  const [a, b, c] = [pool.allocate(), pool.allocate(), pool.allocate()] as [number, number, number];
  assert.deepEqual([a, b, c], [0, 1, 2]);
  assert.throws(() => pool.allocate(), /exhausted/);
  pool.register(a, 'A');
  pool.register(b, 'B');
  pool.register(c, 'C');
  pool.release(a);
  pool.release(b);
  pool.release(c);
  assert.equal(pool.numFree, 3);
  assert.equal(pool.numCached, 3);
  assert.equal(pool.numUsed, 0);
  assert.equal(pool.lookup('A'), a, 'a hit revives the oldest');
  assert.equal(pool.refCount(a), 1);
  assert.equal(pool.numCached, 2);
  assert.equal(pool.allocate(), b, 'B is now the least recently freed');
  assert.equal(pool.peek('B'), undefined, 'an evicted block loses its hash');
  assert.equal(pool.hashOf(b), undefined);
  assert.equal(pool.peek('C'), c);
  pool.release(a); // A freed again: now more recent than C
  assert.equal(pool.allocate(), c);
  assert.equal(pool.lookup('A'), a);
  assert.equal(pool.numFree, 0);
});

test('pool: a plain free block is taken before any cached one; refcounts guard misuse', () => {
  const pool = new BlockPool(2, BS);
  const a = pool.allocate();
  const b = pool.allocate();
  pool.register(a, 'A');
  assert.equal(pool.register(b, 'A'), false, 'one block per content: the first stays canonical');
  pool.release(a);
  pool.release(b);
  assert.equal(pool.numCached, 1);
  assert.equal(pool.allocate(), b, 'the plain free block first');
  assert.equal(pool.peek('A'), a, 'the cached one is kept');
  assert.throws(() => pool.release(a), /more often/);
  assert.throws(() => pool.retain(a), /free/);
  assert.throws(() => pool.refCount(2), /no block/);
  pool.lookup('A');
  pool.release(a, true);
  assert.equal(pool.peek('A'), undefined, 'forget drops the hash with the last reference');
  assert.equal(pool.numCached, 0);
});

test('manager: freed prefixes are evicted oldest first, the tail of a sequence before its head', () => {
  const m = manager(4);
  const x = toks(8, 100); // 2 full blocks
  const y = toks(8, 200);
  m.allocate({ id: 0, tokenIds: x });
  m.allocate({ id: 1, tokenIds: y });
  m.free(0); // LRU: x1, x0
  m.free(1); // LRU: x1, x0, y1, y0
  assert.equal(m.stats().cachedBlocks, 4);
  const hx0 = hashBlock(undefined, x.slice(0, 4));
  const hx1 = hashBlock(hx0, x.slice(4));
  const hy0 = hashBlock(undefined, y.slice(0, 4));
  const hy1 = hashBlock(hy0, y.slice(4));
  m.allocate({ id: 2, tokenIds: [1] }); // evicts x1
  assert.equal(m.pool.peek(hx1), undefined);
  assert.notEqual(m.pool.peek(hx0), undefined);
  // A hit on y revives y0 (and y's first block only: its last block is recomputed); the fresh block evicts x0.
  assert.equal(m.allocate({ id: 3, tokenIds: y }), 4);
  assert.equal(m.pool.peek(hx0), undefined);
  assert.notEqual(m.pool.peek(hy0), undefined);
  assert.notEqual(m.pool.peek(hy1), undefined, 'y1 is still cached: y0 revived did not make it older');
  assert.equal(m.stats().cachedBlocks, 1);
  assert.equal(m.stats().freeBlocks, 1);
});

test('allocate takes its hits before fresh blocks, so it cannot evict the very block it hits', () => {
  const m = manager(2);
  m.allocate({ id: 0, tokenIds: toks(4, 100) });
  m.allocate({ id: 1, tokenIds: toks(4, 200) });
  m.free(0);
  m.free(1); // LRU: a (oldest), b; no plain free block
  const a = m.pool.peek(hashBlock(undefined, toks(4, 100)));
  assert.equal(m.allocate({ id: 2, tokenIds: [...toks(4, 100), 1] }), 4);
  assert.equal(m.blockTable(2).get(0), a);
  assert.equal(m.pool.peek(hashBlock(undefined, toks(4, 200))), undefined, 'b was evicted instead');
});

test('free with discardPrefix leaves nothing findable (KV that was never computed)', () => {
  const m = manager(8);
  m.allocate({ id: 0, tokenIds: toks(9) });
  m.free(0, { discardPrefix: true });
  assert.equal(m.stats().cachedBlocks, 0);
  assert.equal(m.allocate({ id: 1, tokenIds: toks(9) }), 0);
});
