/**
 * One process per index directory: the embedded store (faiss-store.ts) writes its snapshot and log as
 * the only writer, and two processes on one directory would interleave log records and replace each
 * other's snapshots. The first to open it holds `index.lock` (created exclusively: O_CREAT|O_EXCL, so
 * of two processes starting at once exactly one creates it); the second refuses to start, naming the
 * holder (its pid, host and since when).
 *
 * A lock is stale, and taken over, when its holder is gone: on this host, a pid that no longer runs
 * (a crash, a kill -9); from another host (two containers on one volume), a lock whose holder stopped
 * refreshing it (the holder touches it every REFRESH_MS; past STALE_MS without, it is taken). Within one
 * process a second open takes the lock over (the process already owns the directory); each holder has
 * its own token, so only the latest holder's release removes the file.
 */
import { randomBytes } from 'node:crypto';
import { readFile, rename, unlink, utimes, stat } from 'node:fs/promises';
import { hostname } from 'node:os';
import path from 'node:path';
import { writeSynced } from './synced-file.js';

export const LOCK_FILE = 'index.lock';
const REFRESH_MS = 10_000;
const STALE_MS = 60_000;

interface Holder {
  pid: number;
  host: string;
  since: string;
  token: string;
}

export class IndexDirLockedError extends Error {
  constructor(readonly dir: string, readonly holder: { pid: number; host: string; since: string }) {
    super(`the index directory ${dir} is in use by process ${holder.pid} on ${holder.host} (since ${holder.since}; ${path.join(dir, LOCK_FILE)}): ` +
      'one process per RAGGUARD_INDEX_DIR (stop that one, give this one another directory, or use RAGGUARD_STORE=postgres://... to share an index between replicas)');
  }
}

export interface DirLock {
  readonly file: string;
  release(): Promise<void>;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    // EPERM: it runs, as another user.
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

async function readHolder(file: string): Promise<Holder | undefined> {
  try {
    const h = JSON.parse(await readFile(file, 'utf8')) as Partial<Holder>;
    if (typeof h.pid === 'number' && typeof h.host === 'string') return { pid: h.pid, host: h.host, since: String(h.since ?? '?'), token: String(h.token ?? '') };
  } catch { /* unreadable or half written: treated below */ }
  return undefined;
}

/** Takes `dir`'s lock, or throws IndexDirLockedError naming the process that holds it. */
export async function lockDir(dir: string): Promise<DirLock> {
  const file = path.join(dir, LOCK_FILE);
  const me: Holder = { pid: process.pid, host: hostname(), since: new Date().toISOString(), token: randomBytes(8).toString('hex') };
  const body = `${JSON.stringify(me)}\n`;
  for (let attempt = 0; ; attempt++) {
    try {
      await writeSynced(file, 'wx', body);
      break;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST' || attempt >= 5) throw e;
    }
    const holder = await readHolder(file);
    const age = await stat(file).then((s) => Date.now() - s.mtimeMs, () => 0);
    let stale: boolean;
    if (!holder) stale = age > STALE_MS; // written but not readable: a holder that died mid-write, once old
    else if (holder.host === me.host) stale = holder.pid === process.pid || !alive(holder.pid);
    else stale = age > STALE_MS;
    if (!stale) {
      throw new IndexDirLockedError(dir, holder ?? { pid: Number.NaN, host: 'unknown', since: 'unknown' });
    }
    // Taken over by replacing the file whole (rename is atomic), then re-read: of two processes
    // taking over at once, the one whose token is in the file holds it; the other tries again.
    const tmp = `${file}.${me.token}`;
    await writeSynced(tmp, 'w', body);
    await rename(tmp, file);
    if ((await readHolder(file))?.token === me.token) break;
  }
  const timer = setInterval(() => {
    const now = new Date();
    utimes(file, now, now).catch(() => undefined);
  }, REFRESH_MS);
  timer.unref();
  return {
    file,
    async release() {
      clearInterval(timer);
      // Only this holder's lock: a later open in this process may have taken it over.
      if ((await readHolder(file))?.token === me.token) await unlink(file).catch(() => undefined);
    },
  };
}
