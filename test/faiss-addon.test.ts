/**
 * The faiss addon as built by scripts/build-faiss-node.sh (with scripts/faiss/faiss-node-leaks.patch):
 * serialising and reading an index, and searching it, leave nothing behind. Unpatched faiss-node 0.5.1
 * kept a whole copy of the index per toBuffer() and per fromBuffer() (the store does both on every
 * ingest), and the query's floats per search().
 *
 * Measured in a child process started with --expose-gc, so that the collector (and the addon's
 * finalizers, which run on a later turn) can be made to run before each reading.
 *
 * Then what scripts/faiss/faiss-node-features.patch adds, against faiss's own answers: Float32Array
 * input, a bitmap of allowed positions applied inside the search (flat and HNSW), a per-search HNSW
 * candidate list, an exact search of an HNSW index's storage, reconstruct, memoryBytes, and the builds
 * and serialisations on a worker thread (during which the index refuses changes).
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { test } from 'node:test';
import faiss from 'faiss-node';
import { seededRandom } from '../src/generate/sampler.js';

const SCRIPT = `
const faiss = require('faiss-node');
const { setImmediate: turn } = require('node:timers/promises');
const koffi = require('koffi');
const trim = koffi.load('libc.so.6').func('int malloc_trim(size_t)');
const d = 384, n = 4000; // 6.1 MB of vectors
const ix = new faiss.IndexFlatIP(d);
ix.add(Array.from({ length: n * d }, (_, i) => Math.sin(i)));
const settle = async () => { for (let i = 0; i < 3; i++) { gc(); await turn(); } trim(0); return process.memoryUsage().rss; };
(async () => {
  const bytes = ix.toBuffer().length;
  const q = Array.from({ length: 64 * d }, Math.random); // 64 queries a call (faiss runs them through BLAS): 98 KB of floats
  const ops = {
    toBuffer: async () => { for (let i = 0; i < 10; i++) ix.toBuffer(); },
    toBufferAsync: async () => { for (let i = 0; i < 10; i++) await ix.toBufferAsync(); },
    fromBuffer: async () => { const b = ix.toBuffer(); for (let i = 0; i < 10; i++) { faiss.IndexFlatIP.fromBuffer(b); await turn(); } },
    search: async () => { for (let i = 0; i < 100; i++) ix.search(q, 10); },
  };
  const out = { bytes };
  for (const [name, round] of Object.entries(ops)) {
    // Two rounds first: first-touch allocations, lazily made threads' buffers, V8's young generation
    // growing to the allocation rate. A leak grows with every later round; those do not.
    await round(); await round();
    const before = await settle();
    for (let r = 0; r < 3; r++) await round();
    out[name] = (await settle()) - before;
  }
  console.log(JSON.stringify(out));
})();
`;

test('toBuffer, fromBuffer and search free what they allocate', () => {
  const r = JSON.parse(execFileSync(process.execPath, ['--expose-gc', '-e', SCRIPT], { encoding: 'utf8' })) as Record<string, number>;
  const index = r['bytes']!;
  // A leak would be 30 index copies (~180 MB) for the first two and 300 x 98 KB (~29 MB) for search;
  // what is allowed is less than eight copies of the index, for the allocator's and V8's own slack (the
  // async calls' worker threads share one malloc arena whose freed copies need not go back: 11.7 MiB,
  // then 23.5 MiB, four copies, seen on loaded clean-clone runs).
  for (const op of ['toBuffer', 'toBufferAsync', 'fromBuffer']) {
    assert.ok(r[op]! < 8 * index, `${op}: resident memory grew ${(r[op]! / 2 ** 20).toFixed(1)} MiB over 30 calls (index ${(index / 2 ** 20).toFixed(1)} MiB)`);
  }
  assert.ok(r['search']! < 8 * 2 ** 20, `search: resident memory grew ${(r['search']! / 2 ** 20).toFixed(1)} MiB over 300 calls`);
});

/** faiss-node's Index as the features patch extends it (src/retrieval/vector-index.ts types it for the store). */
interface Patched {
  ntotal(): number;
  add(x: Float32Array | number[]): void;
  search(x: Float32Array | number[], k: number, o?: { allow?: Uint8Array; efSearch?: number; exact?: boolean }): { distances: number[]; labels: number[] };
  toBuffer(): Buffer;
  toBufferAsync(): Promise<Buffer>;
  reconstruct(p: Int32Array | number[]): Float32Array;
  hnswParams(): { M: number; efConstruction: number; efSearch: number; maxLevel: number } | null;
  setHnswParams(p: { efConstruction?: number; efSearch?: number }): void;
  memoryBytes(): { vectors: number; graph: number };
}
interface PatchedStatics {
  fromFactory(d: number, descriptor: string, metric: number): Patched;
  fromBuffer(b: Buffer): Patched;
  buildAsync(d: number, descriptor: string, metric: number, x: Float32Array, o?: { efConstruction?: number }): Promise<Patched>;
}
const Index = faiss.Index as unknown as PatchedStatics;
const flat = (d: number) => new faiss.IndexFlatIP(d) as unknown as Patched;

function vectors(n: number, d: number, seed: number): Float32Array {
  const next = seededRandom(seed);
  const x = Float32Array.from({ length: n * d }, () => next() * 2 - 1);
  for (let i = 0; i < n; i++) {
    const row = x.subarray(i * d, (i + 1) * d);
    const norm = Math.hypot(...row);
    for (let j = 0; j < d; j++) row[j] = row[j]! / norm;
  }
  return x;
}

const bitmap = (n: number, allowed: (p: number) => boolean) => {
  const b = new Uint8Array(Math.ceil(n / 8));
  for (let p = 0; p < n; p++) if (allowed(p)) b[p >> 3] = b[p >> 3]! | (1 << (p & 7));
  return b;
};

test('add and search take a Float32Array as they take an Array', () => {
  const d = 8;
  const x = vectors(50, d, 1);
  const a = flat(d);
  const b = flat(d);
  a.add(x);
  b.add(Array.from(x));
  const q = x.subarray(3 * d, 4 * d);
  assert.deepEqual(a.search(q, 5), b.search(Array.from(q), 5));
  assert.equal(a.search(q, 1).labels[0], 3);
  assert.throws(() => a.add(new Float32Array(d + 1)), /array length/);
});

test('an allowed-positions bitmap applies inside the search, on the flat index and the HNSW graph', () => {
  const d = 16;
  const n = 2000;
  const x = vectors(n, d, 2);
  const f = flat(d);
  f.add(x);
  const h = Index.fromFactory(d, 'HNSW16', 0);
  h.add(x);
  const odd = bitmap(n, (p) => p % 2 === 1);
  for (let i = 0; i < 20; i++) {
    const q = x.subarray(i * d, (i + 1) * d);
    const exact = f.search(q, 10, { allow: odd }).labels;
    assert.equal(exact.length, 10);
    assert.ok(exact.every((l) => l % 2 === 1), 'flat: only allowed positions');
    // The full search's odd positions, in order: the filter changed nothing else.
    assert.deepEqual(exact, f.search(q, 200).labels.filter((l) => l % 2 === 1).slice(0, 10));
    const graph = h.search(q, 10, { allow: odd, efSearch: 200 }).labels;
    assert.ok(graph.every((l) => l % 2 === 1), 'HNSW: only allowed positions');
    assert.ok(graph.filter((l) => exact.includes(l)).length >= 9);
    assert.deepEqual(h.search(q, 10, { allow: odd, exact: true }), f.search(q, 10, { allow: odd }), 'exact: the storage searched exhaustively');
  }
  // Fewer allowed than k: the rest is -1.
  const three = bitmap(n, (p) => p === 5 || p === 70 || p === 1999);
  assert.deepEqual([...f.search(x.subarray(0, d), 5, { allow: three }).labels].sort((a, b) => a - b), [-1, -1, 5, 70, 1999]);
  assert.throws(() => f.search(x.subarray(0, d), 5, { allow: [1, 2] as unknown as Uint8Array }), /Uint8Array/);
});

test('efSearch per search: recall of the graph grows with it; the index\'s own stays as it was', () => {
  const d = 32;
  const n = 5000;
  const x = vectors(n, d, 3);
  const f = flat(d);
  f.add(x);
  const h = Index.fromFactory(d, 'HNSW8', 0);
  h.setHnswParams({ efConstruction: 16 });
  h.add(x);
  const qs = vectors(100, d, 4);
  const recall = (ef: number) => {
    let hit = 0;
    for (let i = 0; i < 100; i++) {
      const q = qs.subarray(i * d, (i + 1) * d);
      const exact = new Set(f.search(q, 10).labels);
      hit += h.search(q, 10, { efSearch: ef }).labels.filter((l) => exact.has(l)).length;
    }
    return hit / 1000;
  };
  const low = recall(10);
  const high = recall(400);
  assert.ok(high > low && high >= 0.95, `recall ${low} at efSearch 10, ${high} at 400`);
  assert.equal(h.hnswParams()!.efSearch, 16, 'put back after each search');
  assert.throws(() => f.search(qs.subarray(0, d), 5, { efSearch: 50 }), /HNSW/);
});

test('reconstruct, memoryBytes, and an HNSW index built and serialised on a worker thread', async () => {
  const d = 16;
  const n = 3000;
  const x = vectors(n, d, 5);
  const f = flat(d);
  f.add(x);
  assert.deepEqual(f.reconstruct(Int32Array.from([0, 2999])), Float32Array.from([...x.subarray(0, d), ...x.subarray(2999 * d)]));
  assert.throws(() => f.reconstruct([n]), /not in the index/);
  assert.deepEqual(f.memoryBytes(), { vectors: n * d * 4, graph: 0 });
  assert.equal(f.hnswParams(), null);
  const h = await Index.buildAsync(d, 'HNSW16', 0, x, { efConstruction: 24 });
  assert.equal(h.ntotal(), n);
  assert.deepEqual({ ...h.hnswParams()!, maxLevel: 0 }, { M: 16, efConstruction: 24, efSearch: 16, maxLevel: 0 });
  const m = h.memoryBytes();
  assert.equal(m.vectors, n * d * 4);
  assert.ok(m.graph >= n * 2 * 16 * 4, `links: ${m.graph} bytes`);
  assert.deepEqual(h.reconstruct([7]), x.subarray(7 * d, 8 * d));
  for (let i = 0; i < 10; i++) assert.equal(h.search(x.subarray(i * d, (i + 1) * d), 1, { efSearch: 64 }).labels[0], i);
  // Serialised on a worker thread: the same bytes, and no change to the index meanwhile.
  const pending = h.toBufferAsync();
  assert.throws(() => h.add(x.subarray(0, d)), /being serialised/);
  assert.throws(() => h.setHnswParams({ efSearch: 40 }), /being serialised/);
  const bytes = await pending;
  assert.deepEqual(bytes, h.toBuffer());
  const back = Index.fromBuffer(bytes);
  assert.equal(back.ntotal(), n);
  assert.deepEqual(back.search(x.subarray(0, d), 5, { exact: true }), h.search(x.subarray(0, d), 5, { exact: true }));
  h.add(x.subarray(0, d));
  assert.equal(h.ntotal(), n + 1);
  await assert.rejects(Index.buildAsync(d, 'NotAnIndex', 0, x), /index/i);
});
