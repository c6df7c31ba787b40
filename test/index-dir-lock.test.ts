/**
 * Two processes on one faiss index directory (the store in plain processes, then two servers): the first
 * holds it (index.lock), the second refuses to open it, naming the holder's pid; a holder killed with
 * SIGKILL leaves a stale lock that the next process takes over; a close gives the directory back. Real
 * processes, not mocks.
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { IndexDirLockedError, LOCK_FILE } from '../src/retrieval/dir-lock.js';
import { FaissStore } from '../src/retrieval/faiss-store.js';
import { ROOT, smallCorpus, startServer, tempDir } from './helpers.js';

const D = 4;

/** A process that opens the store on `dir` and says so ("open"), or prints the error ("refused: ...") and exits 3. */
function holder(dir: string): { proc: ChildProcess; said: Promise<string>; exited: Promise<number | null> } {
  const script = `
    const { FaissStore } = await import(${JSON.stringify(path.join(ROOT, 'src/retrieval/faiss-store.ts'))});
    try {
      await FaissStore.open(${JSON.stringify(dir)}, ${D});
      console.log('open');
      setInterval(() => {}, 1 << 30);
    } catch (e) {
      console.log('refused: ' + e.message);
      process.exit(3);
    }`;
  const proc = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { cwd: ROOT, stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  const said = new Promise<string>((resolve) => proc.stdout!.on('data', (c: Buffer) => {
    out += c.toString();
    if (out.includes('\n')) resolve(out.trim());
  }));
  const exited = new Promise<number | null>((resolve) => proc.on('exit', (code) => resolve(code)));
  return { proc, said, exited };
}

test('a second process on the index directory refuses to open it, naming the holder; a killed holder\'s lock is taken over', async () => {
  const dir = await tempDir();
  const first = holder(dir);
  try {
    assert.equal(await first.said, 'open');
    await assert.rejects(FaissStore.open(dir, D), (e) => {
      assert.ok(e instanceof IndexDirLockedError, String(e));
      assert.equal(e.holder.pid, first.proc.pid);
      assert.match(e.message, new RegExp(`in use by process ${first.proc.pid} on `));
      return true;
    });
    // The holder dies without a word (no close): its lock stays, stale.
    first.proc.kill('SIGKILL');
    await first.exited;
    assert.ok(existsSync(path.join(dir, LOCK_FILE)), 'the killed holder left its lock');
  } finally {
    first.proc.kill('SIGKILL');
  }
  const store = await FaissStore.open(dir, D);
  try {
    // Now this process holds it: another one is refused, and told this pid.
    const second = holder(dir);
    assert.match(await second.said, new RegExp(`^refused: the index directory .* is in use by process ${process.pid} on `));
    assert.equal(await second.exited, 3);
  } finally {
    await store.close();
  }
  assert.ok(!existsSync(path.join(dir, LOCK_FILE)), 'close gives the directory back');
  const third = holder(dir);
  try {
    assert.equal(await third.said, 'open', 'after a close the next process opens it');
  } finally {
    third.proc.kill('SIGKILL');
    await third.exited;
  }
});

test('two servers on one index directory: the second stops at start, naming the first', async () => {
  const env = { RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, ['quotas']) };
  const first = await startServer(env);
  try {
    await assert.rejects(startServer(env), (e: Error) => {
      assert.match(e.message, /server exited \(\d+\) before it was ready/);
      assert.match(e.message, new RegExp(`is in use by process ${first.proc.pid} on `));
      return true;
    });
  } finally {
    first.proc.kill('SIGTERM');
    await first.exited;
  }
});
