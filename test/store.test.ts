import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { test } from 'node:test';
import { normalize } from '../src/retrieval/embedder.js';
import { CorruptSnapshotError, encodeSections } from '../src/retrieval/snapshot.js';
import { FaissStore } from '../src/retrieval/faiss-store.js';
import { tempDir } from './helpers.js';

const D = 8;
function unit(seed: number): Float32Array {
  const v = Float32Array.from({ length: D }, (_, i) => Math.sin(seed * 7.1 + i * 1.3));
  normalize(v);
  return v;
}
function rows(...vs: Float32Array[]): Float32Array {
  const out = new Float32Array(vs.length * D);
  vs.forEach((v, i) => out.set(v, i * D));
  return out;
}

const add = (docId: string, texts: string[], ...vs: Float32Array[]) =>
  ({ doc: { docId, title: docId.toUpperCase(), bytes: 3 }, chunks: texts.map((text) => ({ text, tokens: 1 })), vectors: rows(...vs) });

test('search returns the nearest chunks by cosine, best first, with their metadata', async () => {
  const store = await FaissStore.open(await tempDir(), D);
  await store.addBatch([add('a', ['a0', 'a1'], unit(1), unit(2)), add('b', ['b0'], unit(3))]);
  const hits = store.search(unit(2), 10);
  assert.equal(hits.length, 3, 'k is capped at the number of chunks');
  assert.equal(hits[0]!.chunk.text, 'a1');
  assert.equal(hits[0]!.chunk.title, 'A');
  assert.ok(Math.abs(hits[0]!.score - 1) < 1e-5);
  assert.ok(hits[0]!.score >= hits[1]!.score && hits[1]!.score >= hits[2]!.score);
  assert.deepEqual(store.document('a')!.chunkIds, [0, 1]);
  await assert.rejects(store.addBatch([add('a', [])]), /exists/);
  assert.deepEqual((await FaissStore.open(await tempDir(), D)).search(unit(1), 5), []);
});

test('chunk ids stay the same when an earlier document is removed, and are not reused after a reopen', async () => {
  const dir = await tempDir();
  const store = await FaissStore.open(dir, D);
  await store.addBatch([add('a', ['a0', 'a1'], unit(1), unit(2)), add('b', ['b0'], unit(3))]);
  await store.remove('default', 'a');
  assert.equal(store.search(unit(3), 1)[0]!.chunk.id, 2);
  assert.deepEqual(store.document('b')!.chunkIds, [2]);
  const again = await FaissStore.open(dir, D);
  await again.addBatch([add('c', ['c0'], unit(4))]);
  assert.deepEqual(again.document('c')!.chunkIds, [3]);
  assert.equal(again.search(unit(3), 1)[0]!.chunk.text, 'b0');
});

test('persist then reopen gives the same documents, chunks and search results', async () => {
  const dir = await tempDir();
  const store = await FaissStore.open(dir, D);
  await store.addBatch([add('a', ['a0', 'a1'], unit(1), unit(2))]);
  const again = await FaissStore.open(dir, D);
  assert.equal(again.documentCount, 1);
  assert.equal(again.chunkCount, 2);
  assert.deepEqual(again.search(unit(1), 2), store.search(unit(1), 2));
});

test('a snapshot of another dimension or a corrupt file refuses to open', async () => {
  const dir = await tempDir();
  const store = await FaissStore.open(dir, D);
  await store.addBatch([add('a', ['a'], unit(1))]);
  await assert.rejects(FaissStore.open(dir, 16), /8-dimensional vectors but the embedder makes 16/);
  await writeFile(path.join(dir, 'index.snapshot'), 'garbage');
  await assert.rejects(FaissStore.open(dir, D), CorruptSnapshotError);
});

test('a snapshot written before collections opens into the default collection, titles on its chunks, ids kept', async () => {
  const dir = await tempDir();
  const { default: faissNode } = await import('faiss-node');
  const index = new faissNode.IndexFlatIP(D);
  index.add([...unit(1), ...unit(2), ...unit(3)]);
  // The version-2 layout as it was: no collection or metadata on documents, no title on chunks, no nextId.
  const meta = {
    version: 2, dimension: D,
    documents: [{ docId: 'a', title: 'A', bytes: 3, chunkIds: [0, 1] }, { docId: 'b', title: 'B', bytes: 3, chunkIds: [2] }],
    chunks: [{ id: 0, docId: 'a', ord: 0, tokens: 1 }, { id: 1, docId: 'a', ord: 1, tokens: 1 }, { id: 2, docId: 'b', ord: 0, tokens: 1 }],
  };
  await writeFile(path.join(dir, 'index.snapshot'), encodeSections([
    ['metadata', Buffer.from(JSON.stringify(meta))], ['text', Buffer.from(JSON.stringify(['a0', 'a1', 'b0']))], ['vectors', index.toBuffer()],
  ]));
  const store = await FaissStore.open(dir, D);
  assert.deepEqual(await store.counts('default'), { documents: 2, chunks: 3 });
  assert.deepEqual((await store.get('default', 'a'))!.metadata, {});
  const hit = (await store.searchDense(unit(3), 1, { collection: 'default' }))[0]!;
  assert.deepEqual([hit.chunk.id, hit.chunk.title, hit.chunk.collection, hit.chunk.text], [2, 'B', 'default', 'b0']);
  await store.addBatch([add('c', ['c0'], unit(4))]);
  assert.deepEqual(store.document('c')!.chunkIds, [3], 'new ids after the old ones');
});
