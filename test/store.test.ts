import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { test } from 'node:test';
import { normalize } from '../src/retrieval/embedder.js';
import { CorruptSnapshotError } from '../src/retrieval/snapshot.js';
import { DocumentStore } from '../src/retrieval/store.js';
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

test('search returns the nearest chunks by cosine, best first, with their metadata', async () => {
  const store = await DocumentStore.open(await tempDir(), D);
  store.add({ docId: 'a', title: 'A', bytes: 3 }, [{ text: 'a0', tokens: 1 }, { text: 'a1', tokens: 1 }], rows(unit(1), unit(2)));
  store.add({ docId: 'b', title: 'B', bytes: 3 }, [{ text: 'b0', tokens: 1 }], rows(unit(3)));
  const hits = store.search(unit(2), 10);
  assert.equal(hits.length, 3, 'k is capped at the number of chunks');
  assert.equal(hits[0]!.chunk.text, 'a1');
  assert.ok(Math.abs(hits[0]!.score - 1) < 1e-5);
  assert.ok(hits[0]!.score >= hits[1]!.score && hits[1]!.score >= hits[2]!.score);
  assert.deepEqual(store.document('a')!.chunkIds, [0, 1]);
  assert.throws(() => store.add({ docId: 'a', title: 'A', bytes: 1 }, [], new Float32Array(0)), /exists/);
  assert.deepEqual((await DocumentStore.open(await tempDir(), D)).search(unit(1), 5), []);
});

test('persist then reopen gives the same documents, chunks and search results', async () => {
  const dir = await tempDir();
  const store = await DocumentStore.open(dir, D);
  store.add({ docId: 'a', title: 'A', bytes: 3 }, [{ text: 'a0', tokens: 1 }, { text: 'a1', tokens: 1 }], rows(unit(1), unit(2)));
  await store.persist();
  const again = await DocumentStore.open(dir, D);
  assert.equal(again.documentCount, 1);
  assert.equal(again.chunkCount, 2);
  assert.deepEqual(again.search(unit(1), 2), store.search(unit(1), 2));
});

test('a snapshot of another dimension or a corrupt file refuses to open', async () => {
  const dir = await tempDir();
  const store = await DocumentStore.open(dir, D);
  store.add({ docId: 'a', title: 'A', bytes: 1 }, [{ text: 'a', tokens: 1 }], rows(unit(1)));
  await store.persist();
  await assert.rejects(DocumentStore.open(dir, 16), /8-dimensional vectors but the embedder makes 16/);
  await writeFile(path.join(dir, 'index.snapshot'), 'garbage');
  await assert.rejects(DocumentStore.open(dir, D), CorruptSnapshotError);
});
