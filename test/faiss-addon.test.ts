/**
 * The faiss addon as built by scripts/build-faiss-node.sh (with scripts/faiss/faiss-node-leaks.patch):
 * serialising and reading an index, and searching it, leave nothing behind. Unpatched faiss-node 0.5.1
 * kept a whole copy of the index per toBuffer() and per fromBuffer() (the store does both on every
 * ingest), and the query's floats per search().
 *
 * Measured in a child process started with --expose-gc, so that the collector (and the addon's
 * finalizers, which run on a later turn) can be made to run before each reading.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { test } from 'node:test';

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
  // what is allowed is less than two copies of the index, for the allocator's and V8's own slack.
  for (const op of ['toBuffer', 'fromBuffer']) {
    assert.ok(r[op]! < 2 * index, `${op}: resident memory grew ${(r[op]! / 2 ** 20).toFixed(1)} MiB over 30 calls (index ${(index / 2 ** 20).toFixed(1)} MiB)`);
  }
  assert.ok(r['search']! < 8 * 2 ** 20, `search: resident memory grew ${(r['search']! / 2 ** 20).toFixed(1)} MiB over 300 calls`);
});
