/**
 * The embedded store as it grows (docs/store-growth.md), on real faiss and real files: the write log
 * (appends instead of rewrites, a torn last record dropped, a damaged one refused, a crash between a
 * new snapshot and the log's removal never applying a record twice, a failed append leaving nothing),
 * compaction keeping what searches return, the switch from the exact index to HNSW at the threshold
 * and back, removed and replaced chunks never returned from the graph, filters keeping top_k full on
 * the HNSW path, recall of the graph against exact search at the default efSearch, and the store's
 * running count of its bytes.
 */
import assert from 'node:assert/strict';
import { copyFile, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { test } from 'node:test';
import v8 from 'node:v8';
import vm from 'node:vm';
import { ClusteredSet, ExactNeighbours } from '../bench/synthetic.js';
import { seededRandom } from '../src/generate/sampler.js';
import { normalize } from '../src/retrieval/embedder.js';
import { FaissStore, type FaissStoreOptions } from '../src/retrieval/faiss-store.js';
import { metadataMatches, type Metadata, type NewDocument, type SearchFilter } from '../src/retrieval/retrieval-store.js';
import { CorruptSnapshotError } from '../src/retrieval/snapshot.js';
import { tempDir } from './helpers.js';

const D = 16;
const BM25 = { k1: 1.2, b: 0.75 };
/** Every write to the log, compaction only when asked. */
const LOGGED: FaissStoreOptions = { logBytes: 0, compactBytes: Number.POSITIVE_INFINITY, annMin: 0 };

function randomUnit(next: () => number, d = D): Float32Array {
  const v = Float32Array.from({ length: d }, () => next() * 2 - 1);
  normalize(v);
  return v;
}

function doc(docId: string, vectors: Float32Array[], extra: { collection?: string; metadata?: Metadata; text?: string } = {}): NewDocument {
  const flat = new Float32Array(vectors.length * D);
  vectors.forEach((v, i) => flat.set(v, i * D));
  return {
    doc: { docId, title: `T ${docId}`, bytes: 10, collection: extra.collection, metadata: extra.metadata },
    chunks: vectors.map((_, i) => ({ text: `${extra.text ?? docId} part ${i}`, tokens: 3 })),
    vectors: flat,
  };
}

const warnings = () => {
  const seen: string[] = [];
  return { seen, warn: (m: string) => seen.push(m) };
};

const logFiles = async (dir: string) => (await readdir(dir)).filter((n) => n.startsWith('index.log.')).sort();

/** The state a search sees: every chunk's id and text, best first for this query. */
async function everything(store: FaissStore, q: Float32Array): Promise<string[]> {
  return (await store.searchDense(q, 1000, { collection: 'default' })).map((h) => `${h.chunk.id}:${h.chunk.text}:${h.score.toFixed(5)}`);
}

test('past the snapshot threshold a write appends to the log: the snapshot is not rewritten, a reopen replays the log', async () => {
  const dir = await tempDir();
  const r = seededRandom(1);
  const store = await FaissStore.open(dir, D, BM25, LOGGED);
  await store.addBatch([doc('a', [randomUnit(r), randomUnit(r)]), doc('b', [randomUnit(r)])]);
  await store.compact();
  const snapshot = path.join(dir, 'index.snapshot');
  const before = await stat(snapshot);
  await store.addBatch([doc('c', [randomUnit(r)])]);
  await store.replaceBatch([doc('a', [randomUnit(r)], { text: 'new a' })]);
  await store.remove('default', 'b');
  const after = await stat(snapshot);
  assert.deepEqual([after.ino, after.size, after.mtimeMs], [before.ino, before.size, before.mtimeMs], 'the snapshot is untouched');
  assert.deepEqual(await logFiles(dir), ['index.log.2'], 'records after the snapshot\'s one');
  const q = randomUnit(r);
  const live = await everything(store, q);
  assert.equal(live.length, 2);
  await store.close();
  const again = await FaissStore.open(dir, D, BM25, LOGGED);
  assert.deepEqual(await everything(again, q), live);
  assert.deepEqual(await again.counts(), { documents: 2, chunks: 2 });
  assert.equal((await again.get('default', 'a'))!.chunkIds[0], 4, 'ids given before a restart are not given again');
  await again.addBatch([doc('d', [randomUnit(r)])]);
  assert.deepEqual((await again.get('default', 'd'))!.chunkIds, [5]);
  await again.close();
});

test('a torn last record (a crash mid-append) is dropped with a warning; the log goes on after it', async () => {
  const dir = await tempDir();
  const r = seededRandom(2);
  const store = await FaissStore.open(dir, D, BM25, LOGGED);
  await store.addBatch([doc('a', [randomUnit(r)])]);
  await store.addBatch([doc('b', [randomUnit(r)])]);
  await store.close();
  const [file] = await logFiles(dir);
  const bytes = await readFile(path.join(dir, file!));
  // Where the first record ends (write-log.ts: the header line, then a 44-byte frame and the body).
  const first = magic(bytes) + 44 + bytes.readUInt32LE(magic(bytes));
  // The second record cut inside its frame, at its end, and one byte short of its end.
  for (const cut of [first + 1, first + 20, first + 44, bytes.length - 1]) {
    await writeFile(path.join(dir, file!), bytes.subarray(0, cut));
    const w = warnings();
    const s = await FaissStore.open(dir, D, BM25, { ...LOGGED, warn: w.warn });
    assert.deepEqual(await s.counts(), { documents: 1, chunks: 1 }, `cut at ${cut}: the acknowledged record stays`);
    assert.ok(s.has('a') && !s.has('b'));
    assert.equal(w.seen.length, 1);
    assert.match(w.seen[0]!, /incomplete.*crash mid-write.*dropped/);
    assert.equal((await stat(path.join(dir, file!))).size, first, 'the torn bytes are cut off the file');
    await s.addBatch([doc('c', [randomUnit(r)])]);
    await s.close();
    const again = await FaissStore.open(dir, D, BM25, LOGGED);
    assert.ok(again.has('a') && again.has('c') && !again.has('b'), 'a record after the cut is read back');
    await again.close();
  }
});

test('a damaged record before the last, or a missing one, stops the open naming the log file', async () => {
  const dir = await tempDir();
  const r = seededRandom(3);
  const store = await FaissStore.open(dir, D, BM25, LOGGED);
  await store.addBatch([doc('first-doc', [randomUnit(r)])]);
  await store.addBatch([doc('b', [randomUnit(r)])]);
  await store.close();
  const file = path.join(dir, (await logFiles(dir))[0]!);
  const bytes = await readFile(file);
  const damaged = Buffer.from(bytes);
  const at = damaged.indexOf('first-doc');
  damaged.write('FIRST-doc', at);
  await writeFile(file, damaged);
  await assert.rejects(FaissStore.open(dir, D, BM25, LOGGED), (e: Error) => {
    assert.ok(e instanceof CorruptSnapshotError, e.message);
    assert.ok(e.message.includes(file) && /damaged \(checksum mismatch\)/.test(e.message), e.message);
    return true;
  });
  // A second segment that repeats the first's records: not the ones that follow.
  await writeFile(file, bytes);
  await copyFile(file, path.join(dir, 'index.log.3'));
  await assert.rejects(FaissStore.open(dir, D, BM25, LOGGED), /sequence number 1 but the segment's name says 3/);
  await rm(path.join(dir, 'index.log.3'));
  // A segment after a gap: records are missing.
  await rm(file);
  const renamed = Buffer.from(bytes);
  for (let at = magic(bytes), seq = 5; at < renamed.length; seq++) {
    renamed.writeBigUInt64LE(BigInt(seq), at + 4);
    at += 44 + renamed.readUInt32LE(at);
  }
  await writeFile(path.join(dir, 'index.log.5'), renamed);
  await assert.rejects(FaissStore.open(dir, D, BM25, LOGGED), /damaged|record is missing/);
});

const magic = (log: Buffer) => log.indexOf('\n') + 1;

test('a crash between a new snapshot and the removal of the log it holds never applies a record twice', async () => {
  const dir = await tempDir();
  const r = seededRandom(4);
  const store = await FaissStore.open(dir, D, BM25, LOGGED);
  await store.addBatch([doc('a', [randomUnit(r), randomUnit(r)])]);
  await store.replaceBatch([doc('a', [randomUnit(r)], { text: 'a again' })]);
  await store.addBatch([doc('b', [randomUnit(r)])]);
  const [old] = await logFiles(dir);
  const kept = await readFile(path.join(dir, old!));
  await store.compact();
  assert.deepEqual(await logFiles(dir), [], 'compaction dropped the records it folded');
  await store.addBatch([doc('c', [randomUnit(r)])]);
  await store.remove('default', 'b');
  const q = randomUnit(r);
  const live = await everything(store, q);
  await store.close();
  // The crash: the folded segment is still there, and so is a half-written temporary snapshot.
  await writeFile(path.join(dir, old!), kept);
  await writeFile(path.join(dir, `index.snapshot.${process.pid + 1}.tmp`), 'half a snapshot');
  const again = await FaissStore.open(dir, D, BM25, LOGGED);
  assert.deepEqual(await again.counts(), { documents: 2, chunks: 2 });
  assert.deepEqual(await everything(again, q), live);
  assert.deepEqual((await again.get('default', 'a'))!.chunkIds, [2]);
  assert.ok(!(await readdir(dir)).some((n) => n.endsWith('.tmp')));
  await again.close();
});

test('a log append that fails leaves the write out of the store; the retry succeeds', async () => {
  const dir = await tempDir();
  const r = seededRandom(5);
  const store = await FaissStore.open(dir, D, BM25, LOGGED);
  await store.addBatch([doc('a', [randomUnit(r)])]);
  const append = store.appendLog.bind(store);
  store.appendLog = () => Promise.reject(new Error('disk full'));
  const v = randomUnit(r);
  await assert.rejects(store.addBatch([doc('b', [v])]), /disk full/);
  assert.equal(store.has('b'), false);
  assert.deepEqual(await store.counts(), { documents: 1, chunks: 1 });
  assert.ok(store.search(v, 5).every((h) => h.chunk.docId === 'a'));
  store.appendLog = append;
  await store.addBatch([doc('b', [v])]);
  assert.equal(store.search(v, 1)[0]!.chunk.docId, 'b');
  await store.close();
  const again = await FaissStore.open(dir, D, BM25, LOGGED);
  assert.deepEqual(await again.counts(), { documents: 2, chunks: 2 });
  await again.close();
});

test('compaction in the background keeps what searches return, with writes going on meanwhile', async () => {
  const dir = await tempDir();
  const r = seededRandom(6);
  // Compaction once the log passes 2 KB: several during the run, each racing the writes after it.
  const store = await FaissStore.open(dir, D, BM25, { logBytes: 0, compactBytes: 2048, annMin: 0 });
  const queries = Array.from({ length: 5 }, () => randomUnit(r));
  for (let i = 0; i < 60; i++) {
    const write = i % 5 === 4 ? store.remove('default', `d${i - 3}`) : store.addBatch([doc(`d${i}`, [randomUnit(r), randomUnit(r)])]);
    await write;
  }
  const before = await Promise.all(queries.map((q) => everything(store, q)));
  await store.idle();
  assert.ok(store.status.snapshotBytes > 0 && store.status.logBytes < 2048, JSON.stringify(store.status));
  assert.deepEqual(await Promise.all(queries.map((q) => everything(store, q))), before);
  await store.close();
  const again = await FaissStore.open(dir, D, BM25, LOGGED);
  assert.deepEqual(await Promise.all(queries.map((q) => everything(again, q))), before);
  await again.close();
});

test('the index switches from exact to HNSW at the threshold (built while the exact one serves) and back when the store shrinks', async () => {
  const dir = await tempDir();
  const r = seededRandom(7);
  const opts: FaissStoreOptions = { annMin: 100, logBytes: 0, compactBytes: Number.POSITIVE_INFINITY };
  const store = await FaissStore.open(dir, D, BM25, opts);
  const vectors = Array.from({ length: 100 }, () => randomUnit(r));
  await store.addBatch(vectors.slice(0, 99).map((v, i) => doc(`d${i}`, [v])));
  await store.idle();
  assert.equal(store.status.index, 'flat');
  const exactBefore = store.search(vectors[5]!, 10).map((h) => h.chunk.id);
  await store.addBatch([doc('d99', [vectors[99]!])]);
  // Searches go on while the graph is built, on the exact index.
  assert.equal(store.search(vectors[99]!, 1)[0]!.chunk.docId, 'd99');
  await store.idle();
  assert.equal(store.status.index, 'hnsw');
  assert.ok(store.indexBytes > 100 * D * 4, 'the graph\'s links are counted');
  assert.deepEqual(store.search(vectors[5]!, 10).map((h) => h.chunk.id), exactBefore);
  for (const [i, v] of vectors.entries()) assert.equal(store.search(v, 1)[0]!.chunk.docId, `d${i}`);
  await store.close();
  // The switch is persisted (a compaction followed it): the next open has the graph at once.
  const again = await FaissStore.open(dir, D, BM25, opts);
  assert.equal(again.status.index, 'hnsw');
  for (let i = 0; i < 60; i++) await again.remove('default', `d${i}`);
  await again.idle();
  assert.deepEqual(again.status.index, 'flat', 'under half the threshold, and a quarter of the positions removed: exact again');
  // Removals during a rebuild stay tombstones in the rebuilt index, until they are a quarter of it.
  assert.ok(again.status.tombstones < again.status.positions / 4, JSON.stringify(again.status));
  assert.equal(again.chunkCount, 40);
  for (let i = 60; i < 100; i++) assert.equal(again.search(vectors[i]!, 1)[0]!.chunk.docId, `d${i}`);
  await again.close();
});

test('removed and replaced chunks are never returned from the HNSW graph, before and after a reopen', async () => {
  const dir = await tempDir();
  const r = seededRandom(8);
  const opts: FaissStoreOptions = { annMin: 50, logBytes: 0, compactBytes: Number.POSITIVE_INFINITY };
  const store = await FaissStore.open(dir, D, BM25, opts);
  const vectors = Array.from({ length: 200 }, () => randomUnit(r));
  await store.addBatch(vectors.map((v, i) => doc(`d${i}`, [v])));
  await store.idle();
  assert.equal(store.status.index, 'hnsw');
  for (let i = 0; i < 30; i++) await store.remove('default', `d${i}`);
  await store.replaceBatch(vectors.slice(30, 45).map((_, j) => doc(`d${30 + j}`, [randomUnit(r)], { text: `replacement ${30 + j}` })));
  assert.equal(store.status.index, 'hnsw');
  assert.ok(store.status.tombstones === 45, `${store.status.tombstones} tombstones: under a quarter, no rebuild yet`);
  // Document i's first chunk had id i: ids 0-44 are gone (removed, or replaced by new chunks).
  const check = async (s: FaissStore) => {
    for (let i = 0; i < 45; i++) {
      const hits = s.search(vectors[i]!, 10);
      assert.equal(hits.length, 10);
      assert.ok(hits.every((h) => h.chunk.id >= 45), `a chunk of d${i} as it was came back`);
    }
    const all = s.search(vectors[100]!, 1000);
    assert.equal(all.length, 170);
    assert.equal(new Set(all.map((h) => h.chunk.id)).size, 170);
    assert.equal(all.filter((h) => h.chunk.text.startsWith('replacement')).length, 15);
    assert.ok(all.every((h) => h.chunk.id >= 45));
  };
  await check(store);
  await store.close();
  const again = await FaissStore.open(dir, D, BM25, opts);
  await check(again);
  await again.close();
});

test('filters keep top_k full on the HNSW path: the graph with a bitmap, and exact search for a narrow filter', async () => {
  const r = seededRandom(9);
  const store = await FaissStore.open(await tempDir(), D, BM25, { annMin: 50 });
  const docs = Array.from({ length: 400 }, (_, i) => ({
    v: randomUnit(r),
    collection: i % 4 === 3 ? 'b' : 'a',
    metadata: { lang: i % 2 === 0 ? 'en' : 'fr', n: i % 40 } as Metadata,
  }));
  await store.addBatch(docs.map((d, i) => doc(`d${i}`, [d.v], { collection: d.collection, metadata: d.metadata })));
  await store.idle();
  assert.equal(store.status.index, 'hnsw');
  const filters: SearchFilter[] = [
    { collection: 'a', metadata: { lang: 'en' } }, // 200 of 400: the graph, its candidates raised
    { collection: 'a' }, // 300 of 400
    { collection: 'b', metadata: { n: { in: [3, 7] } } }, // 20: exact
  ];
  for (const f of filters) {
    const passing = docs.map((d, i) => ({ ...d, i })).filter((d) => d.collection === f.collection && metadataMatches(d.metadata, f.metadata));
    for (let q = 0; q < 20; q++) {
      const query = randomUnit(r);
      const k = 15;
      const hits = await store.searchDense(query, k, f);
      assert.equal(hits.length, Math.min(k, passing.length), `top_k full for ${JSON.stringify(f)}`);
      for (const h of hits) {
        const d = docs[Number(h.chunk.docId.slice(1))]!;
        assert.ok(h.chunk.collection === f.collection && metadataMatches(d.metadata, f.metadata));
      }
      const exact = passing.map((d) => ({ i: d.i, s: d.v.reduce((t, x, j) => t + x * query[j]!, 0) })).sort((a, b) => b.s - a.s).slice(0, k);
      const found = new Set(hits.map((h) => Number(h.chunk.docId.slice(1))));
      const recall = exact.filter((e) => found.has(e.i)).length / exact.length;
      assert.ok(recall >= 0.9, `recall ${recall} for ${JSON.stringify(f)}`);
    }
  }
  // A removed document's chunks leave the filter's bitmap too.
  await store.remove('b', 'd3');
  const hits = await store.searchDense(docs[3]!.v, 20, { collection: 'b', metadata: { n: { in: [3, 7] } } });
  assert.equal(hits.length, 19);
  assert.ok(hits.every((h) => h.chunk.docId !== 'd3'));
  await store.close();
});

test('the HNSW graph finds the exact top 10 at the default efSearch (recall@10 >= 0.95, a clustered set of 20000)', async () => {
  const d = 64;
  const n = 20000;
  // Noise of norm ~0.6 around unit centres, as in bench:scale's 384 dimensions.
  const set = new ClusteredSet(d, 200, 0.6 / Math.sqrt(d), 11);
  const store = await FaissStore.open(await tempDir(), d, BM25);
  const { vectors } = set.rows(0, n);
  const queries = set.queries(200).vectors;
  const exact = new ExactNeighbours(queries, d, 10);
  exact.add(vectors, 0);
  const batch: NewDocument[] = Array.from({ length: n / 10 }, (_, i) => ({
    doc: { docId: `d${i}`, title: `T${i}`, bytes: 1 },
    chunks: Array.from({ length: 10 }, (__, j) => ({ text: `row ${i * 10 + j}`, tokens: 2 })),
    vectors: vectors.subarray(i * 10 * d, (i + 1) * 10 * d),
  }));
  await store.addBatch(batch);
  await store.idle();
  assert.equal(store.status.index, 'hnsw', 'the default threshold is 20000 chunks');
  const found = (q: number) => store.search(queries.subarray(q * d, (q + 1) * d), 10).map((h) => Number(h.chunk.text.slice(4)));
  const recall = exact.recall(found);
  assert.ok(recall >= 0.95, `recall@10 ${recall}`);
  await store.close();
});

test('a compaction keeps nothing of the index it serialised once it is done (a snapshot of 1M chunks is 1.9 GB)', async () => {
  // The collector on demand (the suite runs without --expose-gc); native buffers are freed by finalizers
  // that run after a collection, so a few turns follow each.
  v8.setFlagsFromString('--expose-gc');
  const gc = vm.runInNewContext('gc') as () => void;
  const external = async () => {
    for (let i = 0; i < 3; i++) {
      gc();
      await new Promise((r) => setImmediate(r));
    }
    return process.memoryUsage().external;
  };
  const d = 256;
  const r = seededRandom(5);
  const store = await FaissStore.open(await tempDir(), d, BM25, LOGGED);
  // 20000 vectors of 256 floats: a 20 MB index, serialised by each compaction on a worker thread.
  const flat = Float32Array.from({ length: 20000 * d }, () => r() * 2 - 1);
  await store.addBatch(Array.from({ length: 200 }, (_, i) => ({
    doc: { docId: `d${i}`, title: `T${i}`, bytes: 1 },
    chunks: Array.from({ length: 100 }, (__, j) => ({ text: `row ${i * 100 + j}`, tokens: 2 })),
    vectors: flat.subarray(i * 100 * d, (i + 1) * 100 * d),
  })));
  const before = await external();
  for (let i = 0; i < 2; i++) await store.compact();
  const held = (await external()) - before;
  assert.ok(held < store.indexBytes / 4, `${held} bytes held after the compactions, against an index of ${store.indexBytes}`);
  await store.close();
});

test('the store keeps a running count of its bytes: a replacement of the same size in chunks still changes it', async () => {
  const r = seededRandom(10);
  const store = await FaissStore.open(await tempDir(), D, BM25, LOGGED);
  await store.addBatch([doc('a', [randomUnit(r), randomUnit(r)]), doc('b', [randomUnit(r)])]);
  const before = store.residentBytes;
  assert.ok(before > store.indexBytes);
  await store.replaceBatch([doc('a', [randomUnit(r), randomUnit(r)], { text: 'a much longer text than before, '.repeat(20) })]);
  assert.equal(store.chunkCount, 3);
  assert.ok(store.residentBytes > before + 1000, `${store.residentBytes} vs ${before}`);
  await store.remove('default', 'a');
  assert.ok(store.residentBytes < before);
  await store.close();
});
