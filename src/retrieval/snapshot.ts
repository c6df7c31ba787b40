/**
 * Crash-safe single-file snapshots: write a temporary file, fsync it, rename it over the old one,
 * fsync the directory. A crash at any point leaves either the old snapshot or the new one, never a
 * torn file; a leftover temporary file is ignored and removed at the next open.
 *
 * Layout: MAGIC | u32 LE meta length | meta (UTF-8 JSON) | payload (the faiss index's own bytes).
 */
import { open, readdir, readFile, rename, rm } from 'node:fs/promises';
import path from 'node:path';

const MAGIC = Buffer.from('RAGGUARD-SNAPSHOT-1\n');
const TMP_SUFFIX = '.tmp';

export class CorruptSnapshotError extends Error {}

export function encodeSnapshot(meta: unknown, payload: Uint8Array): Buffer {
  const json = Buffer.from(JSON.stringify(meta));
  const len = Buffer.alloc(4);
  len.writeUInt32LE(json.length);
  return Buffer.concat([MAGIC, len, json, payload]);
}

export function decodeSnapshot<M>(buf: Buffer, file: string): { meta: M; payload: Buffer } {
  if (buf.length < MAGIC.length + 4 || !buf.subarray(0, MAGIC.length).equals(MAGIC)) {
    throw new CorruptSnapshotError(`${file} is not a ragguard snapshot (bad header)`);
  }
  const n = buf.readUInt32LE(MAGIC.length);
  const start = MAGIC.length + 4;
  if (start + n > buf.length) throw new CorruptSnapshotError(`${file} is truncated`);
  let meta: M;
  try {
    meta = JSON.parse(buf.subarray(start, start + n).toString('utf8')) as M;
  } catch {
    throw new CorruptSnapshotError(`${file} has unreadable metadata`);
  }
  return { meta, payload: buf.subarray(start + n) };
}

export async function writeFileAtomic(file: string, data: Uint8Array): Promise<void> {
  const tmp = `${file}.${process.pid}${TMP_SUFFIX}`;
  const fh = await open(tmp, 'w');
  try {
    await fh.writeFile(data);
    await fh.sync();
  } finally {
    await fh.close();
  }
  await rename(tmp, file);
  const dir = await open(path.dirname(file), 'r');
  try {
    await dir.sync();
  } finally {
    await dir.close();
  }
}

/** The snapshot's bytes, or undefined when none was ever written. Removes stale temporary files. */
export async function readSnapshotFile(file: string): Promise<Buffer | undefined> {
  const dir = path.dirname(file);
  const base = path.basename(file);
  for (const name of await readdir(dir)) {
    if (name.startsWith(`${base}.`) && name.endsWith(TMP_SUFFIX)) await rm(path.join(dir, name), { force: true });
  }
  try {
    return await readFile(file);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw e;
  }
}
