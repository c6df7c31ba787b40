/**
 * The paged KV bookkeeping, after vLLM's block manager tests: allocation, watermark admission,
 * appends, fork and copy-on-write, free, block tables' growth, and a randomized run that checks every
 * reference and every slot against a simulated KV store. Prefix caching is prefix-cache.test.ts's.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { BlockManager, type BlockCopy } from '../src/generate/block-manager.js';
import { BlockPool } from '../src/generate/block-pool.js';
import { hashBlock } from '../src/generate/prefix-hash.js';
import { seededRandom } from '../src/generate/sampler.js';
import { BS, ids, manager, toks } from './block-manager-fixtures.js';

test('allocate takes ceil(len / blockSize) distinct blocks and stores len slots', () => {
  for (const len of [1, 3, 4, 5, 8, 11]) {
    const m = manager(16);
    assert.equal(m.allocate({ id: 0, tokenIds: toks(len) }), 0, 'nothing cached yet');
    const t = ids(m, 0);
    assert.equal(t.length, Math.ceil(len / BS), `len ${len}`);
    assert.equal(new Set(t).size, t.length, 'distinct physical blocks');
    const s = m.stats();
    assert.equal(s.usedBlocks, t.length);
    assert.equal(s.freeBlocks, 16 - t.length);
    assert.equal(s.usedSlots, len);
    assert.equal(s.allocatedSlots, t.length * BS);
    assert.equal(s.utilization, len / (t.length * BS));
  }
});

test('allocate throws when the pool cannot hold the prompt, and changes nothing', () => {
  const m = manager(2);
  assert.throws(() => m.allocate({ id: 0, tokenIds: toks(9) }));
  assert.equal(m.stats().freeBlocks, 2);
  assert.equal(m.has(0), false);
  m.allocate({ id: 1, tokenIds: toks(8) });
  assert.throws(() => m.allocate({ id: 1, tokenIds: toks(1) }), /already/);
});

test('canAllocate: ok / later / never at the watermark thresholds', () => {
  // 100 blocks, watermark 0.1 -> 10 blocks kept free at admission.
  const m = manager(100, { watermark: 0.1 });
  assert.equal(m.watermarkBlocks, 10);
  const blocks = (n: number, from = 0) => ({ id: -1, tokenIds: toks(n * BS, 10000 + from) });
  assert.equal(m.canAllocate(blocks(101)), 'never', 'more blocks than the whole pool');
  assert.equal(m.canAllocate({ id: -1, tokenIds: toks(100 * BS + 1) }), 'never', 'one token over');
  assert.equal(m.canAllocate(blocks(100)), 'ok', 'an idle pool waives the watermark: it would otherwise wait forever');
  m.allocate({ id: 0, tokenIds: toks(10 * BS) }); // 90 free
  assert.equal(m.canAllocate(blocks(80, 1)), 'ok', '90 - 80 = 10 left: exactly the watermark');
  assert.equal(m.canAllocate(blocks(81, 1)), 'later', '9 left: under the watermark');
  assert.equal(m.canAllocate(blocks(91, 1)), 'later', 'more than free, less than the pool');
  assert.equal(m.canAllocate(blocks(101, 1)), 'never');
  m.free(0);
  assert.equal(m.canAllocate(blocks(81, 1)), 'ok');
});

test('canAllocate counts prefix-cache hits on used blocks as needing no new block', () => {
  const m = manager(100, { watermark: 0.1 });
  const prompt = toks(80 * BS);
  m.allocate({ id: 0, tokenIds: prompt }); // 20 free
  // 81 blocks, 80 of them the same prefix: only 1 new block -> 19 free left.
  assert.equal(m.canAllocate({ id: 1, tokenIds: [...prompt, 7] }), 'ok');
  assert.equal(m.canAllocate({ id: 1, tokenIds: [9, ...prompt] }), 'later', 'same tokens shifted: no hit');
  assert.equal(m.allocate({ id: 1, tokenIds: [...prompt, 7] }), 80 * BS);
  assert.equal(m.stats().freeBlocks, 19);
});

test('a hit on a cached free block still takes it out of the free count', () => {
  const m = manager(10, { watermark: 0.2 }); // 2 kept free
  const a = toks(8 * BS);
  m.allocate({ id: 0, tokenIds: a });
  m.free(0); // 8 cached free + 2 plain free
  m.allocate({ id: 1, tokenIds: toks(BS, 5000) }); // uses a plain free block: 9 free, 8 of them cached
  assert.equal(m.stats().cachedBlocks, 8);
  // 9 blocks, 8 hits (all revived) -> takes 9 of 9 free: 0 left, under the watermark.
  assert.equal(m.canAllocate({ id: 2, tokenIds: [...a, 1] }), 'later');
  // 7 hits + 1 new -> takes 8: 1 left, still under.
  assert.equal(m.canAllocate({ id: 2, tokenIds: a }), 'later');
  assert.equal(m.canAllocate({ id: 2, tokenIds: a.slice(0, 7 * BS) }), 'ok', '7 blocks: 2 left');
});

test('append within a block takes no block; across the boundary takes one', () => {
  const m = manager(8);
  m.allocate({ id: 0, tokenIds: toks(3) });
  const first = ids(m, 0);
  assert.deepEqual(m.appendSlots(0, [1]), []);
  assert.deepEqual(ids(m, 0), first, 'the 4th token fits block 0');
  assert.equal(m.stats().usedBlocks, 1);
  assert.deepEqual(m.appendSlots(0, [2]), []);
  assert.equal(m.blockTable(0).length, 2, 'the 5th token opens block 1');
  assert.equal(m.blockTable(0).get(0), first[0]);
  m.appendSlots(0, [3, 4, 5, 6, 7]); // 10 tokens: 3 blocks
  assert.equal(m.blockTable(0).length, 3);
  assert.equal(m.numTokens(0), 10);
  assert.equal(m.stats().usedSlots, 10);
  assert.equal(m.stats().allocatedSlots, 12);
});

test('canAppendSlots is false when the pool is out of blocks; appendSlots then throws and changes nothing', () => {
  const m = manager(2);
  m.allocate({ id: 0, tokenIds: toks(7) });
  assert.equal(m.canAppendSlots(0, 1), true, 'the last slot of block 1');
  assert.equal(m.canAppendSlots(0, 2), false);
  assert.throws(() => m.appendSlots(0, [1, 2]));
  assert.equal(m.numTokens(0), 7);
  assert.equal(m.stats().usedSlots, 7);
  assert.throws(() => m.canAppendSlots(42, 1), /no blocks/);
});

test('fork shares every block of the parent: refcounts 2, no new block', () => {
  const m = manager(8);
  m.allocate({ id: 0, tokenIds: toks(6) });
  m.fork(0, 1);
  assert.deepEqual(ids(m, 1), ids(m, 0));
  for (const b of ids(m, 0)) assert.equal(m.pool.refCount(b), 2);
  assert.equal(m.stats().usedBlocks, 2);
  assert.equal(m.stats().usedSlots, 6, 'shared slots count once');
  assert.equal(m.numTokens(1), 6);
  m.free(0);
  for (const b of ids(m, 1)) assert.equal(m.pool.refCount(b), 1, 'the child keeps its blocks');
  assert.equal(m.stats().usedBlocks, 2);
  assert.throws(() => m.fork(1, 1), /already/);
});

test('copy-on-write: appending to a shared partial block copies it; the parent is unaffected', () => {
  const m = manager(8);
  m.allocate({ id: 0, tokenIds: toks(6) }); // [full, 2 of 4]
  m.fork(0, 1);
  const [b0, b1] = ids(m, 0) as [number, number];
  const copies = m.appendSlots(1, [1]);
  assert.equal(copies.length, 1);
  const { src, dst } = copies[0]!;
  assert.equal(src, b1);
  assert.notEqual(dst, b1);
  assert.deepEqual(ids(m, 1), [b0, dst], 'the child writes into its copy');
  assert.deepEqual(ids(m, 0), [b0, b1], 'the parent keeps its block');
  assert.equal(m.pool.refCount(b0), 2, 'the full block stays shared');
  assert.equal(m.pool.refCount(b1), 1);
  assert.equal(m.stats().usedSlots, 4 + 2 + 3, 'the copy holds the 2 copied tokens and the new one');
  assert.deepEqual(m.appendSlots(0, [2]), [], 'the parent now owns its block alone: no copy');
  assert.equal(m.canAppendSlots(1, 1), true);
});

test('copy-on-write needs a free block, and canAppendSlots says so', () => {
  const m = manager(2);
  m.allocate({ id: 0, tokenIds: toks(5) });
  m.fork(0, 1);
  assert.equal(m.canAppendSlots(1, 1), false, 'the shared partial block must be copied, and no block is free');
  assert.throws(() => m.appendSlots(1, [1]));
  assert.deepEqual(ids(m, 1), ids(m, 0));
});

test('appending after a fork at a block boundary shares nothing partial: no copy, one new block', () => {
  const m = manager(8);
  m.allocate({ id: 0, tokenIds: toks(8) });
  m.fork(0, 1);
  assert.deepEqual(m.appendSlots(1, [1]), []);
  assert.equal(m.blockTable(1).length, 3);
  assert.deepEqual(ids(m, 1).slice(0, 2), ids(m, 0));
});

test('free returns every block; freeing an unknown id does nothing', () => {
  const m = manager(32, { enablePrefixCaching: false });
  m.allocate({ id: 0, tokenIds: toks(13) });
  m.allocate({ id: 1, tokenIds: toks(4, 900) });
  m.fork(0, 2);
  m.appendSlots(2, [1, 2, 3, 4, 5]);
  m.free(0);
  m.free(1);
  m.free(2);
  m.free(77);
  const s = m.stats();
  assert.equal(s.freeBlocks, 32);
  assert.equal(s.usedBlocks, 0);
  assert.equal(s.usedSlots, 0);
  assert.equal(s.cachedBlocks, 0, 'without prefix caching nothing is kept');
  assert.deepEqual(s.tablesByBucket, {});
});

test('block tables grow 4 -> 16 -> 64 entries as a sequence decodes, never sized for the max length up front', () => {
  const m = new BlockManager({ numBlocks: 4096, blockSize: BS, watermark: 0.01 });
  m.allocate({ id: 0, tokenIds: toks(3) });
  assert.deepEqual(m.stats().tablesByBucket, { 4: 1 });
  const buckets = [m.blockTable(0).bucket];
  for (let i = 0; i < 64 * BS; i++) {
    m.appendSlots(0, [i]);
    const b = m.blockTable(0).bucket;
    if (b !== buckets.at(-1)) buckets.push(b);
  }
  assert.deepEqual(buckets, [4, 16, 64, 256]);
  m.allocate({ id: 1, tokenIds: toks(17 * BS) });
  assert.equal(m.blockTable(1).bucket, 64, 'a prompt of 17 blocks takes the 64 bucket directly');
  assert.deepEqual(m.stats().tablesByBucket, { 64: 1, 256: 1 });
  const custom = new BlockManager({ numBlocks: 64, blockSize: BS, buckets: [2, 8] });
  custom.allocate({ id: 0, tokenIds: toks(9 * BS) });
  assert.equal(custom.blockTable(0).capacity, 16);
});

/**
 * Random allocate / append / fork / free cycles against a simulated KV store (a token id per physical
 * slot, with the manager's copies applied): after every operation, each block's refcount equals the
 * references the tables hold, the counters agree, and every sequence reads back exactly its tokens,
 * so prefix hits and copy-on-write handed out the right KV.
 */
test('randomized cycles: no leak, refcounts match the tables, every sequence reads its own tokens', () => {
  const NUM_BLOCKS = 48;
  const m = new BlockManager({ numBlocks: NUM_BLOCKS, blockSize: BS, watermark: 0.05 });
  const random = seededRandom(20240611);
  const int = (n: number) => Math.floor(random() * n);
  const kv: (number | undefined)[][] = Array.from({ length: NUM_BLOCKS }, () => new Array<number | undefined>(BS));
  const live = new Map<number, number[]>();
  let nextId = 0;
  const counts = { allocate: 0, hits: 0, append: 0, cow: 0, fork: 0, free: 0, later: 0 };

  const applyCopies = (copies: BlockCopy[]) => {
    for (const { src, dst } of copies) kv[dst] = [...kv[src]!];
    counts.cow += copies.length;
  };
  const writeTokens = (seqId: number, tokens: number[], from: number) => {
    const t = m.blockTable(seqId);
    for (let i = from; i < tokens.length; i++) kv[t.get(Math.floor(i / BS))]![i % BS] = tokens[i]!;
  };

  const check = (where: string) => {
    const refs = new Int32Array(NUM_BLOCKS);
    const fill = new Map<number, number>();
    for (const [id, tokens] of live) {
      const t = m.blockTable(id);
      assert.equal(t.length, Math.ceil(tokens.length / BS), `${where}: seq ${id} table length`);
      assert.equal(m.numTokens(id), tokens.length);
      const seen = new Set<number>();
      for (let i = 0; i < t.length; i++) {
        const b = t.get(i);
        assert.ok(!seen.has(b), `${where}: block ${b} twice in one table`);
        seen.add(b);
        refs[b]!++;
        const f = Math.min(BS, tokens.length - i * BS);
        assert.equal(fill.get(b) ?? f, f, `${where}: sharers of block ${b} disagree on its fill`);
        fill.set(b, f);
      }
      const stored = tokens.map((_, i) => kv[t.get(Math.floor(i / BS))]![i % BS]);
      assert.deepEqual(stored, tokens, `${where}: seq ${id} reads back its tokens`);
    }
    for (let b = 0; b < NUM_BLOCKS; b++) assert.equal(m.pool.refCount(b), refs[b], `${where}: refcount of block ${b}`);
    const s = m.stats();
    assert.equal(s.usedBlocks, fill.size, `${where}: used blocks`);
    assert.equal(s.freeBlocks + s.usedBlocks, NUM_BLOCKS);
    assert.ok(s.cachedBlocks <= s.freeBlocks);
    assert.equal(s.usedSlots, [...fill.values()].reduce((a, b) => a + b, 0), `${where}: used slots`);
  };

  // A few shared stems so that prefix hits happen often; adapters split the cache.
  const stems = [toks(12, 1), toks(8, 50), toks(5, 1)];
  for (let step = 0; step < 3000; step++) {
    const op = random();
    const liveIds = [...live.keys()];
    const pick = () => liveIds[int(liveIds.length)]!;
    if (op < 0.3 || liveIds.length === 0) {
      const stem = stems[int(stems.length)]!;
      const tokens = [...stem.slice(0, int(stem.length + 1)), ...Array.from({ length: int(10) }, () => int(6))];
      if (tokens.length === 0) tokens.push(3);
      const seq = { id: nextId++, tokenIds: tokens, adapter: random() < 0.2 ? 'lora' : undefined };
      const status = m.canAllocate(seq);
      if (status !== 'ok') {
        counts.later++;
        continue;
      }
      const computed = m.allocate(seq);
      assert.equal(computed % BS, 0);
      assert.ok(computed < tokens.length);
      if (computed > 0) counts.hits++;
      counts.allocate++;
      // The adapter tag is folded into the simulated token so that a cross-adapter hit would read wrong KV.
      const stored = seq.adapter ? tokens.map((t) => t + 1_000_000) : tokens;
      const t = m.blockTable(seq.id);
      for (let i = 0; i < computed; i++) assert.equal(kv[t.get(Math.floor(i / BS))]![i % BS], stored[i], 'a prefix hit holds the right KV');
      writeTokens(seq.id, stored, computed);
      live.set(seq.id, stored);
    } else if (op < 0.7) {
      const id = pick();
      const tokens = live.get(id)!;
      const add = Array.from({ length: 1 + int(5) }, () => int(6));
      if (!m.canAppendSlots(id, add.length)) {
        assert.throws(() => m.appendSlots(id, add));
        continue;
      }
      // as stored: the same adapter tag as the sequence's prompt
      const tag = tokens[0]! >= 1_000_000 ? 1_000_000 : 0;
      applyCopies(m.appendSlots(id, add));
      const grown = [...tokens, ...add.map((t) => t + tag)];
      writeTokens(id, grown, tokens.length);
      live.set(id, grown);
      counts.append++;
    } else if (op < 0.8) {
      const parent = pick();
      const child = nextId++;
      m.fork(parent, child);
      live.set(child, [...live.get(parent)!]);
      counts.fork++;
    } else {
      const id = pick();
      m.free(id);
      live.delete(id);
      counts.free++;
    }
    check(`step ${step}`);
  }
  for (const id of [...live.keys()]) m.free(id);
  live.clear();
  check('end');
  const s = m.stats();
  assert.equal(s.freeBlocks, NUM_BLOCKS, 'every block is back');
  assert.equal(s.usedSlots, 0);
  // the run exercised every path
  for (const [k, v] of Object.entries(counts)) assert.ok(v > 10, `${k} happened ${v} times`);
});

test('touched counts the blocks ever handed out: reuse of a freed block does not add, a cached one pushed aside does', () => {
  const pool = new BlockPool(6, 4);
  assert.equal(pool.touched, 0);
  const a = pool.allocate();
  const b = pool.allocate();
  assert.equal(pool.touched, 2);
  pool.release(b); // plain free (no hash): handed out again next
  assert.equal(pool.allocate(), b);
  assert.equal(pool.touched, 2);
  pool.register(a, hashBlock(undefined, [1, 2, 3, 4]));
  pool.release(a); // cached free: kept for its prefix, so a new block is taken instead
  pool.allocate();
  assert.equal(pool.touched, 3);
});
