import assert from 'node:assert/strict';
import { readdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { test } from 'node:test';
import { CorruptSnapshotError, decodeSnapshot, encodeSnapshot, readSnapshotFile, writeFileAtomic } from '../src/retrieval/snapshot.js';
import { tempDir } from './helpers.js';

test('snapshot round-trips metadata and payload', () => {
  const buf = encodeSnapshot({ a: 1, s: 'é' }, new Uint8Array([1, 2, 3]));
  const { meta, payload } = decodeSnapshot<{ a: number; s: string }>(buf, 'x');
  assert.deepEqual(meta, { a: 1, s: 'é' });
  assert.deepEqual([...payload], [1, 2, 3]);
});

test('a torn or foreign file is reported as corrupt, not read as empty', () => {
  const buf = encodeSnapshot({ a: 1 }, new Uint8Array(10));
  assert.throws(() => decodeSnapshot(buf.subarray(0, 25), 'f'), CorruptSnapshotError);
  assert.throws(() => decodeSnapshot(Buffer.from('hello world, not a snapshot'), 'f'), /bad header/);
});

test('atomic write replaces the file and leaves no temporary behind', async () => {
  const dir = await tempDir();
  const file = path.join(dir, 'index.snapshot');
  await writeFileAtomic(file, Buffer.from('one'));
  await writeFileAtomic(file, Buffer.from('two'));
  assert.equal((await readSnapshotFile(file))!.toString(), 'two');
  assert.deepEqual(await readdir(dir), ['index.snapshot']);
});

test('a temporary file left by a crash is ignored and removed; the old snapshot survives', async () => {
  const dir = await tempDir();
  const file = path.join(dir, 'index.snapshot');
  await writeFileAtomic(file, Buffer.from('good'));
  await writeFile(`${file}.12345.tmp`, 'half-writ');
  assert.equal((await readSnapshotFile(file))!.toString(), 'good');
  assert.deepEqual(await readdir(dir), ['index.snapshot']);
  assert.equal(await readSnapshotFile(path.join(dir, 'missing')), undefined);
});
