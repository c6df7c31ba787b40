/**
 * A damaged snapshot stops start-up, naming the file and the section: every section's bytes changed
 * in turn (vectors, metadata, text, the header), a cut tail; and a batch whose snapshot write fails
 * leaves nothing behind, so that its retry succeeds.
 */
import assert from 'node:assert/strict';
import { mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { test } from 'node:test';
import { normalize } from '../src/retrieval/embedder.js';
import { CorruptSnapshotError, encodeSnapshot, temporaryPath } from '../src/retrieval/snapshot.js';
import { FaissStore as DocumentStore, type NewDocument } from '../src/retrieval/faiss-store.js';
import { tempDir } from './helpers.js';

const D = 8;
const MAGIC_LENGTH = 'RAGGUARD-SNAPSHOT-2\n'.length;

function unit(seed: number): Float32Array {
  const v = Float32Array.from({ length: D }, (_, i) => Math.sin(seed * 7.1 + i * 1.3));
  normalize(v);
  return v;
}

function doc(id: string, texts: string[], seed: number): NewDocument {
  const vectors = new Float32Array(texts.length * D);
  texts.forEach((_, i) => vectors.set(unit(seed + i), i * D));
  return { doc: { docId: id, title: id.toUpperCase(), bytes: texts.join(' ').length }, chunks: texts.map((text) => ({ text, tokens: 4 })), vectors };
}

const TEXTS = ['the sticky bit on /tmp keeps users from deleting each other\'s files', 'cron.deny lists users who may not use crontab'];

async function written(): Promise<{ dir: string; file: string; bytes: Buffer; sections: Map<string, [number, number]> }> {
  const dir = await tempDir();
  const store = await DocumentStore.open(dir, D);
  await store.addDurably([doc('a', TEXTS, 1), doc('b', ['quotas limit disk use per user'], 5)]);
  const file = path.join(dir, 'index.snapshot');
  const bytes = await readFile(file);
  // Where each section lies, from the header (the layout snapshot.ts documents).
  const n = bytes.readUInt32LE(MAGIC_LENGTH);
  const header = JSON.parse(bytes.subarray(MAGIC_LENGTH + 4, MAGIC_LENGTH + 4 + n).toString()) as { sections: { name: string; length: number }[] };
  const sections = new Map<string, [number, number]>([['header', [MAGIC_LENGTH + 4, MAGIC_LENGTH + 4 + n]]]);
  let at = MAGIC_LENGTH + 4 + n;
  for (const s of header.sections) {
    sections.set(s.name, [at, at + s.length]);
    at += s.length;
  }
  assert.equal(at, bytes.length);
  return { dir, file, bytes, sections };
}

async function refuses(dir: string, file: string, section: string, what: RegExp): Promise<void> {
  await assert.rejects(DocumentStore.open(dir, D), (e: Error) => {
    assert.ok(e instanceof CorruptSnapshotError, `${e.name}: ${e.message}`);
    assert.ok(e.message.includes(file), `names the file: ${e.message}`);
    assert.ok(e.message.includes(`'${section}'`), `names the section '${section}': ${e.message}`);
    assert.match(e.message, what);
    assert.equal(e.section, section);
    return true;
  });
}

test('a snapshot round-trips documents, chunk texts and vectors through its three sections', async () => {
  const { dir, sections } = await written();
  assert.deepEqual([...sections.keys()], ['header', 'metadata', 'text', 'vectors']);
  const store = await DocumentStore.open(dir, D);
  assert.equal(store.documentCount, 2);
  assert.equal(store.chunkCount, 3);
  const hit = store.search(unit(2), 1)[0]!;
  assert.equal(hit.chunk.text, TEXTS[1]);
  assert.ok(Math.abs(hit.score - 1) < 1e-5);
});

test('damage in any one section stops the open, naming the file and that section', async () => {
  for (const section of ['vectors', 'metadata', 'text', 'header']) {
    const { dir, file, bytes, sections } = await written();
    const [start, end] = sections.get(section)!;
    const damaged = Buffer.from(bytes);
    if (section === 'text') {
      // Letters changed inside a chunk's text: still valid JSON of the same length, only the checksum sees it.
      const at = damaged.indexOf('sticky', start);
      assert.ok(at > 0 && at < end);
      damaged.write('STICKY', at);
    } else if (section === 'vectors') {
      // Random bytes over the vectors (after faiss's own header, so faiss itself would load them).
      for (let i = Math.max(start, end - 64); i < end; i++) damaged[i] = (damaged[i]! + 97 + i) & 0xff;
    } else if (section === 'metadata') {
      const at = damaged.indexOf('"tokens":4', start);
      assert.ok(at > 0 && at < end);
      damaged.write('"tokens":9', at);
    } else {
      const at = damaged.indexOf('"length":', start);
      damaged[at + 9] = damaged[at + 9] === 0x31 ? 0x32 : 0x31; // one digit of a section's length
    }
    await writeFile(file, damaged);
    await refuses(dir, file, section, /damaged|truncated/);
  }
});

test('a cut tail stops the open with the file and the section it cuts, not faiss\'s raw read error', async () => {
  const { dir, file, bytes, sections } = await written();
  await writeFile(file, bytes.subarray(0, bytes.length - 100));
  await refuses(dir, file, 'vectors', /truncated/);
  await writeFile(file, bytes.subarray(0, sections.get('text')![0] + 3));
  await refuses(dir, file, 'text', /truncated/);
  await writeFile(file, bytes.subarray(0, 30));
  await refuses(dir, file, 'header', /truncated/);
});

test('a version-1 snapshot (no checksums) is still read', async () => {
  const dir = await tempDir();
  const store = await DocumentStore.open(dir, D);
  await store.addDurably([doc('a', TEXTS, 1)]);
  const v2 = await DocumentStore.open(dir, D);
  // Rebuild the same state in the old layout: meta JSON with the texts, then faiss's bytes.
  const chunks = TEXTS.map((text, i) => ({ id: i, docId: 'a', ord: i, text, tokens: 4 }));
  const { default: faiss } = await import('faiss-node');
  const index = new faiss.IndexFlatIP(D);
  index.add([...unit(1), ...unit(2)]);
  await writeFile(path.join(dir, 'index.snapshot'), encodeSnapshot({ version: 1, dimension: D, documents: [v2.document('a')], chunks }, index.toBuffer()));
  const v1 = await DocumentStore.open(dir, D);
  assert.equal(v1.chunkCount, 2);
  assert.equal(v1.search(unit(2), 1)[0]!.chunk.text, TEXTS[1]);
});

test('a failed snapshot write leaves the batch out of the store and off the disk; the retry succeeds', async () => {
  const dir = await tempDir();
  const store = await DocumentStore.open(dir, D);
  await store.addDurably([doc('a', TEXTS, 1)]);
  const file = path.join(dir, 'index.snapshot');
  const before = await readFile(file);
  // The write goes through a temporary file: a directory in its place makes it fail (as a full disk would).
  await mkdir(temporaryPath(file));
  await assert.rejects(store.addDurably([doc('b', ['quotas limit disk use per user'], 5)]), /EISDIR|illegal operation/);
  assert.equal(store.documentCount, 1, 'not visible');
  assert.equal(store.chunkCount, 2);
  assert.equal(store.has('b'), false);
  assert.ok(store.search(unit(5), 3).every((h) => h.chunk.docId === 'a'), 'not searchable');
  assert.deepEqual(await readFile(file), before, 'the snapshot on disk is the old one');
  await rm(temporaryPath(file), { recursive: true });
  await store.addDurably([doc('b', ['quotas limit disk use per user'], 5)]);
  assert.equal(store.documentCount, 2);
  assert.equal(store.search(unit(5), 1)[0]!.chunk.docId, 'b');
  // The snapshot and the open store's lock (dir-lock.ts), nothing temporary.
  assert.deepEqual((await readdir(dir)).sort(), ['index.lock', 'index.snapshot']);
  const again = await DocumentStore.open(dir, D);
  assert.deepEqual([again.documentCount, again.chunkCount], [2, 3]);
});
