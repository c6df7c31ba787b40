/**
 * Initializers kept in external data files (as exports over 2 GiB keep them) are read through the
 * model directory, at their offset and length; a location that leaves the directory is refused.
 */
import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { test } from 'node:test';
import { externalDataReader } from '../src/runtime/model-dir.js';
import { ONNX_FLOAT, readInitializers, Writer } from '../src/runtime/onnx-proto.js';
import { tempDir } from './helpers.js';

/** A ModelProto whose initializers name (location, offset, length) in external files. */
function modelWith(tensors: { name: string; dims: number[]; location: string; offset: number; length?: number }[]): Uint8Array {
  const w = new Writer();
  w.msg(7, (g) => {
    for (const t of tensors) {
      g.msg(5, (m) => {
        for (const d of t.dims) m.int(1, d);
        m.int(2, ONNX_FLOAT).str(8, t.name);
        m.msg(13, (e) => e.str(1, 'location').str(2, t.location));
        m.msg(13, (e) => e.str(1, 'offset').str(2, String(t.offset)));
        if (t.length !== undefined) m.msg(13, (e) => e.str(1, 'length').str(2, String(t.length)));
        m.int(14, 1);
      });
    }
  });
  return w.finish();
}

test('external data is read at its offset and length', async () => {
  const dir = await tempDir('ragguard-ext-');
  const a = new Float32Array([1, 2, 3, 4]);
  const b = new Float32Array([5, 6]);
  const file = new Uint8Array(64 + 24);
  file.set(new Uint8Array(a.buffer), 64);
  file.set(new Uint8Array(b.buffer), 80);
  await writeFile(path.join(dir, 'weights.bin'), file);
  const reader = externalDataReader(dir);
  const inits = readInitializers(modelWith([
    { name: 'a', dims: [2, 2], location: 'weights.bin', offset: 64, length: 16 },
    { name: 'b', dims: [2], location: 'weights.bin', offset: 80 },
  ]), reader.read);
  reader.close();
  assert.deepEqual([...new Float32Array(inits.get('a')!.data.buffer)], [1, 2, 3, 4]);
  assert.deepEqual([...new Float32Array(inits.get('b')!.data.buffer)], [5, 6]);
  assert.throws(() => readInitializers(modelWith([{ name: 'c', dims: [1], location: '../etc/passwd', offset: 0 }]), externalDataReader(dir).read), /leaves/);
  assert.throws(() => readInitializers(modelWith([{ name: 'd', dims: [8], location: 'weights.bin', offset: 80, length: 32 }]), externalDataReader(dir).read), /run past its end/);
});
