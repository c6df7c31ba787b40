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
import { open, readdir, readFile, rename, rm, type FileHandle } from 'node:fs/promises';
import { setImmediate as turn } from 'node:timers/promises';
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

/** MAGIC | u32 header length | header: what precedes the sections' bytes. */
function headerBytes(entries: SectionEntry[]): Buffer {
  const header: Header = { sections: entries, sha256: sha256(JSON.stringify(entries)) };
  const json = Buffer.from(JSON.stringify(header));
  const len = Buffer.alloc(4);
  len.writeUInt32LE(json.length);
  return Buffer.concat([MAGIC, len, json]);
}

/** Encodes named sections, each with its digest. */
export function encodeSections(sections: ReadonlyArray<readonly [string, Uint8Array]>): Buffer {
  const entries: SectionEntry[] = sections.map(([name, bytes]) => ({ name, length: bytes.length, sha256: sha256(bytes) }));
  return Buffer.concat([headerBytes(entries), ...sections.map(([, b]) => b)]);
}

/** Bytes hashed between two turns of the event loop: a large index's digest does not stall queries. */
const HASH_SLICE = 16 * 2 ** 20;
/** Bytes one write() takes at most (the kernel's and Node's limits are near 2 GiB). */
const WRITE_SLICE = 256 * 2 ** 20;

async function sha256Yielding(bytes: Uint8Array): Promise<string> {
  const h = createHash('sha256');
  for (let at = 0; at < bytes.length; at += HASH_SLICE) {
    h.update(bytes.subarray(at, Math.min(bytes.length, at + HASH_SLICE)));
    if (at + HASH_SLICE < bytes.length) await turn();
  }
  return h.digest('hex');
}

/**
 * writeFileAtomic of encodeSections(sections), without joining them into one buffer and hashing
 * between turns of the event loop: what compaction writes while the store serves queries.
 */
export async function writeSectionsAtomic(file: string, sections: ReadonlyArray<readonly [string, Uint8Array]>): Promise<number> {
  const entries: SectionEntry[] = [];
  for (const [name, bytes] of sections) entries.push({ name, length: bytes.length, sha256: await sha256Yielding(bytes) });
  const parts = [headerBytes(entries), ...sections.map(([, b]) => b)];
  await writeAtomically(file, async (fh) => {
    let at = 0;
    for (const part of parts) {
      for (let off = 0; off < part.length; off += WRITE_SLICE) {
        const n = Math.min(WRITE_SLICE, part.length - off);
        let done = 0;
        while (done < n) done += (await fh.write(part, off + done, n - done, at + done)).bytesWritten;
        at += n;
      }
    }
  });
  return parts.reduce((n, p) => n + p.length, 0);
}

/** A snapshot file's contents: version-2 sections, each verified, or a version-1 file's bytes (see decodeSnapshot). */
export type SnapshotContents = { sections: Map<string, Buffer> } | { v1: Buffer };

/**
 * Reads and verifies a snapshot section by section (no single buffer of the whole file, whose size
 * may pass what one read or one Buffer takes); undefined when none was ever written. Removes stale
 * temporary files. Throws CorruptSnapshotError naming the file and the section.
 */
export async function readSnapshot(file: string): Promise<SnapshotContents | undefined> {
  await removeStaleTemporaries(file);
  let fh;
  try {
    fh = await open(file, 'r');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw e;
  }
  try {
    const size = (await fh.stat()).size;
    const read = async (at: number, length: number): Promise<Buffer> => {
      const buf = Buffer.allocUnsafe(length);
      let done = 0;
      while (done < length) {
        const { bytesRead } = await fh.read(buf, done, Math.min(WRITE_SLICE, length - done), at + done);
        if (bytesRead === 0) throw new CorruptSnapshotError(`${file} changed while it was read`, file, 'header');
        done += bytesRead;
      }
      return buf;
    };
    const head = await read(0, Math.min(size, MAGIC.length + 4));
    if (head.length >= MAGIC_V1.length && head.subarray(0, MAGIC_V1.length).equals(MAGIC_V1)) return { v1: await readFile(file) };
    if (head.length < MAGIC.length + 4 || !head.subarray(0, MAGIC.length).equals(MAGIC)) {
      throw new CorruptSnapshotError(`${file} is not a ragguard snapshot (bad header)`, file, 'header');
    }
    const n = head.readUInt32LE(MAGIC.length);
    const start = MAGIC.length + 4;
    if (start + n > size) throw new CorruptSnapshotError(`${file} is truncated: section 'header' needs bytes ${start}..${start + n}, the file ends at ${size}`, file, 'header');
    let header: Header;
    try {
      header = JSON.parse((await read(start, n)).toString('utf8')) as Header;
    } catch {
      throw new CorruptSnapshotError(`${file}: section 'header' is damaged (not readable JSON)`, file, 'header');
    }
    if (!Array.isArray(header?.sections) || header.sha256 !== sha256(JSON.stringify(header.sections))) {
      throw new CorruptSnapshotError(`${file}: section 'header' is damaged (checksum mismatch)`, file, 'header');
    }
    const sections = new Map<string, Buffer>();
    let at = start + n;
    for (const s of header.sections) {
      if (at + s.length > size) {
        throw new CorruptSnapshotError(`${file} is truncated: section '${s.name}' needs bytes ${at}..${at + s.length}, ` +
          `the file ends at ${size}`, file, s.name);
      }
      const bytes = await read(at, s.length);
      if ((await sha256Yielding(bytes)) !== s.sha256) {
        throw new CorruptSnapshotError(`${file}: section '${s.name}' is damaged (checksum mismatch)`, file, s.name);
      }
      sections.set(s.name, bytes);
      at += s.length;
    }
    if (at !== size) throw new CorruptSnapshotError(`${file} has ${size - at} bytes after its last section`, file, 'trailer');
    return { sections };
  } finally {
    await fh.close();
  }
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

export function writeFileAtomic(file: string, data: Uint8Array): Promise<void> {
  return writeAtomically(file, (fh) => fh.writeFile(data));
}

/** Writes `file` through its temporary file: written by `fill`, fsynced, renamed over, the directory fsynced. */
async function writeAtomically(file: string, fill: (fh: FileHandle) => Promise<void>): Promise<void> {
  const tmp = temporaryPath(file);
  try {
    const fh = await open(tmp, 'w');
    try {
      await fill(fh);
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
  await removeStaleTemporaries(file);
  try {
    return await readFile(file);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw e;
  }
}

async function removeStaleTemporaries(file: string): Promise<void> {
  const dir = path.dirname(file);
  const base = path.basename(file);
  for (const name of await readdir(dir)) {
    if (name.startsWith(`${base}.`) && name.endsWith(TMP_SUFFIX)) await rm(path.join(dir, name), { force: true, recursive: true });
  }
}
