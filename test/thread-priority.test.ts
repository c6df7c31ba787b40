/**
 * RAGGUARD_WORKER_NICE: every thread but the event loop's at a lower priority (Linux). Read back from
 * /proc (the kernel's own figure, field 19 of each thread's stat), on this test's process with a real
 * ONNX Runtime session (its intra-op pool and libuv's pool exist), and on a spawned server.
 */
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { loadConfig } from '../src/config/config.js';
import { EncoderSession } from '../src/backends/ort/encoder-session.js';
import { lowerOtherThreads } from '../src/runtime/thread-priority.js';
import { ROOT, smallCorpus, startServer, tempDir } from './helpers.js';

const linux = process.platform === 'linux';

/** Nice value of each thread of `pid`, by thread id, from /proc/<pid>/task/<tid>/stat. */
function niceByThread(pid: number | 'self'): Map<number, number> {
  const m = new Map<number, number>();
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      // Fields after the command name (which may hold spaces): state is field 3, nice field 19.
      const f = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8').split(') ')[1]!.split(' ');
      m.set(Number(tid), Number(f[16]));
    } catch {
      // the thread ended meanwhile
    }
  }
  return m;
}

test('RAGGUARD_WORKER_NICE: default 0, 0-19 accepted, anything else named', () => {
  assert.equal(loadConfig({}).workerThreadNice, 0);
  assert.equal(loadConfig({ RAGGUARD_WORKER_NICE: '10' }).workerThreadNice, 10);
  assert.throws(() => loadConfig({ RAGGUARD_WORKER_NICE: '20' }), /RAGGUARD_WORKER_NICE: expected an integer in \[0, 19\]/);
  assert.throws(() => loadConfig({ RAGGUARD_WORKER_NICE: '-5' }), /RAGGUARD_WORKER_NICE/);
  assert.throws(() => lowerOtherThreads(20), RangeError);
});

test('nice 0 changes nothing', () => {
  const before = linux ? niceByThread('self') : new Map();
  const r = lowerOtherThreads(0);
  assert.equal(r.threads, 0);
  assert.match(r.skipped ?? '', /nice 0/);
  if (linux) assert.deepEqual(niceByThread('self'), before);
});

test('every thread but the main one, the model runtime\'s included, gets the nice value; runs give the same output after', { skip: !linux && 'Linux only' }, async () => {
  const session = await EncoderSession.create(path.join(ROOT, 'models/embedder/onnx/model.onnx'), 'cpu');
  try {
    const rows = [[1, 5, 9, 2], [1, 7, 2]];
    const before = await session.run(undefined, session.outputNames[0]!, rows, 0); // libuv's pool and ORT's threads exist now
    const threads = niceByThread('self');
    assert.ok(threads.size > 2, `threads: ${threads.size}`);
    assert.equal(threads.get(process.pid), 0);

    const r = lowerOtherThreads(10);
    assert.equal(r.skipped, undefined);
    const after = niceByThread('self');
    assert.equal(after.get(process.pid), 0, 'the event loop keeps its priority');
    for (const [tid, nice] of after) if (tid !== process.pid && threads.has(tid)) assert.equal(nice, 10, `thread ${tid}`);
    assert.ok(r.threads + r.failed >= threads.size - 1);

    // A thread already lower than asked is left there (raising it back would need a privilege).
    assert.equal(lowerOtherThreads(5).failed, 0);
    for (const [tid, nice] of niceByThread('self')) if (tid !== process.pid && threads.has(tid)) assert.equal(nice, 10);

    const again = await session.run(undefined, session.outputNames[0]!, rows, 0);
    assert.deepEqual(again.dims, before.dims);
    assert.deepEqual(Array.from(again.data), Array.from(before.data));
  } finally {
    await session.release();
  }
});

test('the server sets RAGGUARD_WORKER_NICE at start-up: its model threads lowered, its event loop not', { skip: !linux && 'Linux only' }, async () => {
  const server = await startServer({ RAGGUARD_WORKER_NICE: '7', RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, ['quotas']) });
  const { proc } = server;
  try {
    const nice = niceByThread(proc.pid!);
    assert.equal(nice.get(proc.pid!), 0, 'the event loop');
    const others = [...nice].filter(([tid]) => tid !== proc.pid);
    assert.ok(others.length > 2);
    for (const [tid, n] of others) assert.equal(n, 7, `thread ${tid}`);
    assert.match(server.log(), /threads besides the event loop's at nice 7/);
  } finally {
    proc.kill('SIGKILL');
    await server.exited;
  }
});
