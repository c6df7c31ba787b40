/**
 * Crash-safe single-file snapshots: write a temporary file, fsync it, rename it over the old one,
 * fsync the directory. A crash at any point leaves either the old snapshot or the new one, never a
 * torn file; a leftover temporary file is ignored and removed at the next open.
 *
 * Layout (version 2): MAGIC | u32 LE header length | header (UTF-8 JSON: the sections' names, lengths
 * and SHA-256 digests, and the header's own digest of everything else in it) | the sections' bytes in
 * header order. Each section is checked at load, so damage anywhere (a flipped byte in a vector, a
 * changed letter in a chunk's text, a cut tail) stops start-up with a message naming the file and the
 * section, instead of serving a vector that scores 4e36 or a text nobody wrote.
 *
 * Version 1 (MAGIC_V1 | u32 meta length | meta JSON | payload) carries no checksums; it is still read,
 * so that an index written before is not lost, and the next write replaces it with version 2.
 */
import { createHash } from 'node:crypto';
import { open, readdir, readFile, rename, rm } from 'node:fs/promises';
import path from 'node:path';

const MAGIC_V1 = Buffer.from('RAGGUARD-SNAPSHOT-1\n');
const MAGIC = Buffer.from('RAGGUARD-SNAPSHOT-2\n');
const TMP_SUFFIX = '.tmp';

export class CorruptSnapshotError extends Error {
  constructor(message: string, readonly file: string, readonly section?: string) {
    super(message);
    this.name = 'CorruptSnapshotError';
  }
}

interface SectionEntry {
  name: string;
  length: number;
  sha256: string;
}

interface Header {
  sections: SectionEntry[];
  /** SHA-256 of JSON.stringify(sections): the header's own check. */
  sha256: string;
}

const sha256 = (b: Uint8Array | string) => createHash('sha256').update(b).digest('hex');

/** Encodes named sections, each with its digest. */
export function encodeSections(sections: ReadonlyArray<readonly [string, Uint8Array]>): Buffer {
  const entries: SectionEntry[] = sections.map(([name, bytes]) => ({ name, length: bytes.length, sha256: sha256(bytes) }));
  const header: Header = { sections: entries, sha256: sha256(JSON.stringify(entries)) };
  const json = Buffer.from(JSON.stringify(header));
  const len = Buffer.alloc(4);
  len.writeUInt32LE(json.length);
  return Buffer.concat([MAGIC, len, json, ...sections.map(([, b]) => b)]);
}

/**
 * The sections of a version-2 snapshot, each verified against its digest; throws CorruptSnapshotError
 * naming the file and the section. Returns undefined for a version-1 file (see decodeSnapshot).
 */
export function decodeSections(buf: Buffer, file: string): Map<string, Buffer> | undefined {
  if (buf.length >= MAGIC_V1.length && buf.subarray(0, MAGIC_V1.length).equals(MAGIC_V1)) return undefined;
  if (buf.length < MAGIC.length + 4 || !buf.subarray(0, MAGIC.length).equals(MAGIC)) {
    throw new CorruptSnapshotError(`${file} is not a ragguard snapshot (bad header)`, file, 'header');
  }
  const n = buf.readUInt32LE(MAGIC.length);
  const start = MAGIC.length + 4;
  if (start + n > buf.length) throw new CorruptSnapshotError(`${file} is truncated: section 'header' needs bytes ${start}..${start + n}, the file ends at ${buf.length}`, file, 'header');
  let header: Header;
  try {
    header = JSON.parse(buf.subarray(start, start + n).toString('utf8')) as Header;
  } catch {
    throw new CorruptSnapshotError(`${file}: section 'header' is damaged (not readable JSON)`, file, 'header');
  }
  if (!Array.isArray(header?.sections) || header.sha256 !== sha256(JSON.stringify(header.sections))) {
    throw new CorruptSnapshotError(`${file}: section 'header' is damaged (checksum mismatch)`, file, 'header');
  }
  const out = new Map<string, Buffer>();
  let at = start + n;
  for (const s of header.sections) {
    if (at + s.length > buf.length) {
      throw new CorruptSnapshotError(`${file} is truncated: section '${s.name}' needs bytes ${at}..${at + s.length}, ` +
        `the file ends at ${buf.length}`, file, s.name);
    }
    const bytes = buf.subarray(at, at + s.length);
    if (sha256(bytes) !== s.sha256) {
      throw new CorruptSnapshotError(`${file}: section '${s.name}' is damaged (checksum mismatch)`, file, s.name);
    }
    out.set(s.name, bytes);
    at += s.length;
  }
  if (at !== buf.length) {
    throw new CorruptSnapshotError(`${file} has ${buf.length - at} bytes after its last section`, file, 'trailer');
  }
  return out;
}

/** Version 1: meta JSON and one payload, no checksums (written by earlier versions; still read). */
export function encodeSnapshot(meta: unknown, payload: Uint8Array): Buffer {
  const json = Buffer.from(JSON.stringify(meta));
  const len = Buffer.alloc(4);
  len.writeUInt32LE(json.length);
  return Buffer.concat([MAGIC_V1, len, json, payload]);
}

export function decodeSnapshot<M>(buf: Buffer, file: string): { meta: M; payload: Buffer } {
  if (buf.length < MAGIC_V1.length + 4 || !buf.subarray(0, MAGIC_V1.length).equals(MAGIC_V1)) {
    throw new CorruptSnapshotError(`${file} is not a ragguard snapshot (bad header)`, file, 'header');
  }
  const n = buf.readUInt32LE(MAGIC_V1.length);
  const start = MAGIC_V1.length + 4;
  if (start + n > buf.length) throw new CorruptSnapshotError(`${file} is truncated`, file, 'metadata');
  let meta: M;
  try {
    meta = JSON.parse(buf.subarray(start, start + n).toString('utf8')) as M;
  } catch {
    throw new CorruptSnapshotError(`${file} has unreadable metadata`, file, 'metadata');
  }
  return { meta, payload: buf.subarray(start + n) };
}

/** The temporary file writeFileAtomic writes `file` through (tests make it unwritable to fail a write). */
export function temporaryPath(file: string): string {
  return `${file}.${process.pid}${TMP_SUFFIX}`;
}

export async function writeFileAtomic(file: string, data: Uint8Array): Promise<void> {
  const tmp = temporaryPath(file);
  try {
    const fh = await open(tmp, 'w');
    try {
      await fh.writeFile(data);
      await fh.sync();
    } finally {
      await fh.close();
    }
    await rename(tmp, file);
  } catch (e) {
    // Nothing of a failed write stays behind (a full disk keeps its space).
    await rm(tmp, { force: true }).catch(() => undefined);
    throw e;
  }
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
    if (name.startsWith(`${base}.`) && name.endsWith(TMP_SUFFIX)) await rm(path.join(dir, name), { force: true, recursive: true });
  }
  try {
    return await readFile(file);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw e;
  }
}
