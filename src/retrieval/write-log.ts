/**
 * The embedded store's write-ahead log: each write appended beside the snapshot as one record, made
 * durable (fdatasync) before the write is acknowledged, so that one new document costs its own bytes
 * and not a rewrite of everything stored. Compaction (faiss-store.ts) folds the records into a new
 * snapshot in the background and then drops them.
 *
 * Files: `index.log.<first>`, segments named by the sequence number of their first record; a segment
 * is MAGIC then records. A record: u32 LE body length | u64 LE sequence number | SHA-256 of (sequence
 * number, body) | body. Sequence numbers increase by one across segments; the snapshot names the last
 * one it holds, so a record is never applied twice: a crash after a new snapshot is in place but
 * before the segments it covers are gone leaves records that the next open skips.
 *
 * At open: a last record cut short (a crash mid-append: that write was never acknowledged) is dropped
 * with a warning and cut off the file; damage anywhere else (a checksum that fails with records after
 * it, a gap in the numbers, a foreign file) stops the open with CorruptSnapshotError, as a damaged
 * snapshot does.
 */
import { createHash } from 'node:crypto';
import { open, readdir, readFile, rm, type FileHandle } from 'node:fs/promises';
import path from 'node:path';
import { CorruptSnapshotError } from './snapshot.js';
import { synced } from './synced-file.js';

const MAGIC = Buffer.from('RAGGUARD-LOG-1\n');
const FRAME = 4 + 8 + 32;
const PREFIX = 'index.log.';
/** A segment is read whole at open (one Buffer, one read: under 2 GiB): no record near that. */
const MAX_RECORD = 2 ** 30;
const MAX_SEGMENT = 2 ** 30;

export interface LogRecord {
  seq: number;
  body: Buffer;
}

interface Segment {
  first: number;
  file: string;
  /** Bytes of its records. */
  bytes: number;
}

function digest(seq: Buffer, body: Uint8Array): Buffer {
  return createHash('sha256').update(seq).update(body).digest();
}

/** A directory's entries on disk (a new segment's name). */
function syncDir(dir: string): Promise<void> {
  return synced(dir, 'r', async () => undefined);
}

export class WriteLog {
  /** The segment appends go to, open. */
  private current: { segment: Segment; fh: FileHandle; size: number } | undefined;
  /** Whether the last segment was rotated away from (the next append starts a new one). */
  private sealed = false;
  /** Set when a failed append could not be cut back off the file: later appends would follow garbage. */
  private broken: Error | undefined;

  private constructor(
    readonly dir: string,
    private segments: Segment[],
    /** The last sequence number written (or held by the snapshot). */
    private last: number,
  ) {}

  /**
   * Reads every segment in `dir`, calls `apply` for each record after `after` (the snapshot's last
   * sequence number) in order, and returns the log ready to append after the last one.
   */
  static async open(dir: string, after: number, apply: (r: LogRecord) => void, warn: (message: string) => void): Promise<WriteLog> {
    const segments: Segment[] = (await readdir(dir))
      .filter((n) => n.startsWith(PREFIX) && /^\d+$/.test(n.slice(PREFIX.length)))
      .map((n) => ({ first: Number(n.slice(PREFIX.length)), file: path.join(dir, n), bytes: 0 }))
      .sort((a, b) => a.first - b.first);
    let last = after;
    for (const [i, seg] of segments.entries()) {
      const isLast = i === segments.length - 1;
      const buf = await readFile(seg.file);
      let at = MAGIC.length;
      if (buf.length < MAGIC.length || !buf.subarray(0, MAGIC.length).equals(MAGIC)) {
        // A segment created by a crash before its header was durable holds nothing yet.
        if (isLast && MAGIC.subarray(0, buf.length).equals(buf)) {
          warn(`${seg.file}: an empty log segment cut short by a crash; rewritten`);
          await WriteLog.cut(seg.file, 0);
          break;
        }
        throw new CorruptSnapshotError(`${seg.file} is not a ragguard log (bad header)`, seg.file, 'log');
      }
      while (at < buf.length) {
        const bad = (why: string) => new CorruptSnapshotError(`${seg.file}: the record at byte ${at} ${why}`, seg.file, 'log');
        const whole = at + FRAME <= buf.length && at + FRAME + buf.readUInt32LE(at) <= buf.length;
        const len = whole ? buf.readUInt32LE(at) : 0;
        const ok = whole && digest(buf.subarray(at + 4, at + 12), buf.subarray(at + FRAME, at + FRAME + len)).equals(buf.subarray(at + 12, at + FRAME));
        if (!ok) {
          // Only the very last record can be a torn append (that write was never acknowledged).
          if (isLast && (!whole || at + FRAME + len === buf.length)) {
            warn(`${seg.file}: the last record (byte ${at}, ${buf.length - at} bytes) is incomplete, the trace of a crash mid-write; ` +
              'it was never acknowledged and is dropped');
            await WriteLog.cut(seg.file, at);
            break;
          }
          throw bad(whole ? 'is damaged (checksum mismatch)' : 'is truncated');
        }
        const seq = Number(buf.readBigUInt64LE(at + 4));
        if (at === MAGIC.length && seq !== seg.first) throw bad(`has sequence number ${seq} but the segment's name says ${seg.first}`);
        if (seq > after) {
          if (seq !== last + 1) throw bad(`has sequence number ${seq} where ${last + 1} was expected (a record is missing)`);
          apply({ seq, body: buf.subarray(at + FRAME, at + FRAME + len) });
          last = seq;
        }
        seg.bytes += FRAME + len;
        at += FRAME + len;
      }
    }
    return new WriteLog(dir, segments, last);
  }

  /** The last sequence number written (or held by the snapshot). */
  get lastSeq(): number {
    return this.last;
  }

  /** Bytes of records in the segments (what the next compaction folds and drops). */
  get bytes(): number {
    return this.segments.reduce((n, s) => n + s.bytes, 0);
  }

  /** Appends a record and makes it durable; returns its sequence number. A failed append leaves the file as it was. */
  async append(body: Uint8Array): Promise<number> {
    if (this.broken) throw new Error(`the write log takes no more records until a restart: ${this.broken.message}`);
    if (body.length > MAX_RECORD) throw new Error(`a write of ${body.length} bytes is more than one log record takes (${MAX_RECORD}): split the batch`);
    // A segment stays readable in one piece at open even when compaction keeps failing (a full disk).
    if (this.current && this.current.size > MAGIC.length && this.current.size + FRAME + body.length > MAX_SEGMENT) await this.rotate();
    const cur = this.current ?? (await this.openCurrent());
    const seq = this.last + 1;
    const head = Buffer.alloc(FRAME);
    head.writeUInt32LE(body.length, 0);
    head.writeBigUInt64LE(BigInt(seq), 4);
    digest(head.subarray(4, 12), body).copy(head, 12);
    try {
      await cur.fh.writev([head, body], cur.size);
      await cur.fh.datasync();
    } catch (e) {
      await cur.fh.truncate(cur.size).then(() => cur.fh.datasync()).catch((cut: Error) => {
        this.broken = cut;
      });
      throw e;
    }
    cur.size += FRAME + body.length;
    cur.segment.bytes += FRAME + body.length;
    this.last = seq;
    return seq;
  }

  /**
   * Later records go to a new segment, so that the earlier ones can go once a snapshot holding them is
   * durable (dropThrough). Returns the last sequence number written so far.
   */
  async rotate(): Promise<number> {
    const tail = this.segments.at(-1);
    if (tail && tail.first <= this.last) {
      await this.current?.fh.close();
      this.current = undefined;
      this.sealed = true;
    }
    return this.last;
  }

  /** Removes the segments whose records all have sequence numbers at or below `seq` (a durable snapshot holds them). */
  async dropThrough(seq: number): Promise<void> {
    const keep: Segment[] = [];
    let removed = false;
    for (const [i, s] of this.segments.entries()) {
      const next = this.segments[i + 1];
      const lastOf = next ? next.first - 1 : this.last;
      const appendable = !next && !this.sealed;
      if (lastOf <= seq && !appendable) {
        await rm(s.file, { force: true });
        removed = true;
      } else {
        keep.push(s);
      }
    }
    this.segments = keep;
    if (removed) await syncDir(this.dir);
  }

  /** A snapshot holds every record: every segment goes, the next append starts a new one. */
  async dropAll(): Promise<void> {
    await this.current?.fh.close();
    this.current = undefined;
    this.sealed = false;
    if (this.segments.length === 0) return;
    for (const s of this.segments) await rm(s.file, { force: true });
    this.segments = [];
    await syncDir(this.dir);
  }

  async close(): Promise<void> {
    await this.current?.fh.close();
    this.current = undefined;
  }

  /** The segment appends go to: the last one unless rotated away from, else a new one after the last record. */
  private async openCurrent(): Promise<{ segment: Segment; fh: FileHandle; size: number }> {
    const tail = this.segments.at(-1);
    if (tail && !this.sealed) {
      const fh = await open(tail.file, 'r+');
      let size = (await fh.stat()).size;
      if (size < MAGIC.length) {
        await fh.truncate(0);
        await fh.write(MAGIC, 0, MAGIC.length, 0);
        await fh.datasync();
        size = MAGIC.length;
      }
      this.current = { segment: tail, fh, size };
      return this.current;
    }
    const segment: Segment = { first: this.last + 1, file: path.join(this.dir, `${PREFIX}${this.last + 1}`), bytes: 0 };
    const fh = await open(segment.file, 'w+');
    try {
      await fh.write(MAGIC, 0, MAGIC.length, 0);
      await fh.datasync();
      await syncDir(this.dir);
    } catch (e) {
      await fh.close().catch(() => undefined);
      await rm(segment.file, { force: true }).catch(() => undefined);
      throw e;
    }
    this.segments.push(segment);
    this.sealed = false;
    this.current = { segment, fh, size: MAGIC.length };
    return this.current;
  }

  private static cut(file: string, length: number): Promise<void> {
    return synced(file, 'r+', (fh) => fh.truncate(length), 'datasync');
  }
}
