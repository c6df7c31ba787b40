/**
 * A file changed and on disk before the call returns: opened with `flag`, changed by `work`, synced
 * (fsync, or fdatasync: its data and size without its times) and closed, whatever `work` or the sync
 * throws. What the index directory's lock (dir-lock.ts) and the write log's cut (write-log.ts) share.
 */
import { open, type FileHandle } from 'node:fs/promises';

export async function synced(file: string, flag: string, work: (fh: FileHandle) => Promise<unknown>, how: 'sync' | 'datasync' = 'sync'): Promise<void> {
  const fh = await open(file, flag);
  try {
    await work(fh);
    await (how === 'sync' ? fh.sync() : fh.datasync());
  } finally {
    await fh.close();
  }
}

/** `body` written whole to `file` (opened with `flag`: 'w', or 'wx' to create it exclusively), fsynced, closed. */
export function writeSynced(file: string, flag: string, body: string | Uint8Array): Promise<void> {
  return synced(file, flag, (fh) => fh.writeFile(body));
}
