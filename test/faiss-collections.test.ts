/**
 * The faiss store's vectors per collection (src/retrieval/faiss-collections.ts), on real faiss and real
 * files: a search filtered to a collection that is a small part of the store scans that collection's own
 * vectors (counted here by wrapping their search), exactly (the exact top-k within the collection, with
 * and without metadata conditions, while the store-wide graph is a sparse one); removed and replaced
 * chunks leave them; they are the same after a reopen (snapshot, then the log's replay) and after the
 * store-wide index's rebuild; a collection that is the whole store still goes through the store-wide index.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { seededRandom } from '../src/generate/sampler.js';
import { normalize } from '../src/retrieval/embedder.js';
import { CollectionVectors } from '../src/retrieval/faiss-collections.js';
import { FaissStore, type FaissStoreOptions } from '../src/retrieval/faiss-store.js';
import type { NewDocument } from '../src/retrieval/retrieval-store.js';
import { tempDir } from './helpers.js';

const D = 16;
const BM25 = { k1: 1.2, b: 0.75 };
/** HNSW from 200 chunks, a sparse graph (what a narrow filter must not be left to), writes to the log. */
const OPTS: FaissStoreOptions = { annMin: 200, hnswM: 4, efConstruction: 8, efSearch: 4, logBytes: 0, compactBytes: Number.POSITIVE_INFINITY };

function unit(next: () => number): Float32Array {
  const v = Float32Array.from({ length: D }, () => next() * 2 - 1);
  normalize(v);
  return v;
}

/** Counts the searches of the collections' own vectors. */
function countOwnSearches(): { n: number; restore: () => void } {
  const original = CollectionVectors.prototype.search;
  const counter = {
    n: 0,
    restore: () => {
      CollectionVectors.prototype.search = original;
    },
  };
  CollectionVectors.prototype.search = function (this: CollectionVectors, ...args: Parameters<typeof original>) {
    counter.n++;
    return original.apply(this, args);
  };
  return counter;
}

interface Kept { collection: string; docId: string; tier: string; v: Float32Array }

function exact(kept: Map<number, Kept>, q: Float32Array, k: number, pass: (c: Kept) => boolean): number[] {
  return [...kept].filter(([, c]) => pass(c))
    .map(([id, c]) => ({ id, s: c.v.reduce((acc, x, j) => acc + x * q[j]!, 0) }))
    .sort((a, b) => b.s - a.s).slice(0, k).map((x) => x.id);
}

test('a collection\'s search scans its own vectors, exactly, kept level with adds, removals, replacements, a reopen and a rebuild', async () => {
  const dir = await tempDir();
  const next = seededRandom(3);
  const kept = new Map<number, Kept>();
  let store = await FaissStore.open(dir, D, BM25, OPTS);
  const add = async (collection: string, docId: string, n: number) => {
    const vs = Array.from({ length: n }, () => unit(next));
    const tier = next() < 0.5 ? 'gold' : 'free';
    const flat = new Float32Array(n * D);
    vs.forEach((v, i) => flat.set(v, i * D));
    const d: NewDocument = {
      doc: { docId, title: docId, bytes: 1, collection, metadata: { tier } },
      chunks: vs.map((_, i) => ({ text: `${docId} ${i}`, tokens: 2 })), vectors: flat,
    };
    const [stored] = await store.replaceBatch([d]);
    for (const [id, c] of kept) if (c.collection === collection && c.docId === docId) kept.delete(id);
    stored!.document.chunkIds.forEach((id, i) => kept.set(id, { collection, docId, tier, v: vs[i]! }));
  };
  const check = async (label: string) => {
    const counter = countOwnSearches();
    try {
      for (let c = 0; c < 12; c++) {
        for (let i = 0; i < 3; i++) {
          const q = unit(next);
          const hits = await store.searchDense(q, 10, { collection: `c${c}` });
          assert.deepEqual(hits.map((h) => h.chunk.id), exact(kept, q, 10, (x) => x.collection === `c${c}`), `${label}: c${c}`);
          const gold = await store.searchDense(q, 10, { collection: `c${c}`, metadata: { tier: 'gold' } });
          assert.deepEqual(gold.map((h) => h.chunk.id), exact(kept, q, 10, (x) => x.collection === `c${c}` && x.tier === 'gold'), `${label}: c${c} gold`);
        }
      }
      assert.equal(counter.n, 12 * 3 * 2, `${label}: every search scanned its collection's own vectors`);
    } finally {
      counter.restore();
    }
  };
  try {
    // 12 collections of 5 documents of 4 chunks: 240 chunks, HNSW store-wide, each collection 1/12 of it.
    for (let d = 0; d < 5; d++) for (let c = 0; c < 12; c++) await add(`c${c}`, `d${d}`, 4);
    await store.idle();
    assert.equal(store.status.index, 'hnsw');
    await check('after the adds');
    // Removals and replacements leave the collection's vectors.
    for (let c = 0; c < 12; c += 2) {
      await store.remove(`c${c}`, 'd1');
      for (const [id, x] of kept) if (x.collection === `c${c}` && x.docId === 'd1') kept.delete(id);
      await add(`c${c}`, 'd2', 3);
    }
    await check('after removals and replacements');
    // A reopen: the snapshot's vectors grouped again, then the log replayed on top.
    await store.close();
    store = await FaissStore.open(dir, D, BM25, OPTS);
    await check('after a reopen');
    await store.compact();
    await store.close();
    store = await FaissStore.open(dir, D, BM25, OPTS);
    await check('after a compaction and a reopen');
    // A rebuild of the store-wide index (tombstones dropped: positions move, ids do not).
    const positions = store.status.positions;
    for (let c = 1; c < 12; c += 2) {
      await store.remove(`c${c}`, 'd3');
      await store.remove(`c${c}`, 'd4');
      for (const [id, x] of kept) if (x.collection === `c${c}` && (x.docId === 'd3' || x.docId === 'd4')) kept.delete(id);
    }
    await store.idle();
    assert.ok(store.status.positions < positions, `rebuilt: ${store.status.positions} positions, ${positions} before`);
    await check('after a rebuild');
  } finally {
    await store.close();
  }
});

test('a collection that is the whole store goes through the store-wide index', async () => {
  const dir = await tempDir();
  const next = seededRandom(5);
  const store = await FaissStore.open(dir, D, BM25, { ...OPTS, efSearch: 64 });
  try {
    const batch: NewDocument[] = [];
    for (let d = 0; d < 100; d++) {
      const flat = new Float32Array(3 * D);
      for (let i = 0; i < 3; i++) flat.set(unit(next), i * D);
      batch.push({ doc: { docId: `d${d}`, title: 't', bytes: 1 }, chunks: [0, 1, 2].map((i) => ({ text: `x ${i}`, tokens: 1 })), vectors: flat });
    }
    await store.addBatch(batch);
    await store.idle();
    assert.equal(store.status.index, 'hnsw');
    const counter = countOwnSearches();
    try {
      assert.equal((await store.searchDense(unit(next), 10, { collection: 'default' })).length, 10);
      assert.equal(counter.n, 0);
    } finally {
      counter.restore();
    }
  } finally {
    await store.close();
  }
});
