/**
 * Faults of the server as a process, each on a spawned server: SIGTERM to `npm start` drains the
 * requests in flight (new ones get 503 shutting_down, /readyz 503) and exits 0; a grace period too
 * short stops the rest with 503 shutting_down and a non-zero exit; kill -9 in the middle of an ingest
 * leaves the old index or the new one, never part of a batch, and a restart serves it; a damaged
 * snapshot stops start-up naming the file and the section.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import path from 'node:path';
import { describe, test } from 'node:test';
import { readCorpus } from '../src/service/rag.js';
import { CORPUS, ROOT, smallCorpus, startServer, tempDir, TEST_ENV } from './helpers.js';

interface Reply {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: { error?: { code: string; message: string }; queue?: { running: number; waiting: number }; documents?: unknown } & Record<string, unknown>;
}

const SMALL = ['task-scheduling-cron-atd', 'quotas', 'syslog'];

/** Starts the server and expects it to fail start-up; resolves with its exit code and output. */
async function failedStart(env: Record<string, string>): Promise<{ code: number | null; log: string }> {
  const proc = spawn(process.execPath, ['--import', 'tsx', 'src/cli/serve.ts'], {
    cwd: ROOT, env: { ...process.env, ...TEST_ENV, PORT: '0', RAGGUARD_PROFILE_RUN: 'false', ...env }, stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  proc.stdout.on('data', (c: Buffer) => (out += c.toString()));
  proc.stderr.on('data', (c: Buffer) => (out += c.toString()));
  const code = await new Promise<number | null>((resolve) => proc.on('exit', resolve));
  return { code, log: out };
}

function request(port: number, method: string, route: string, body?: unknown): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const req = http.request({ host: '127.0.0.1', port, method, path: route, headers: data ? { 'content-type': 'application/json', 'content-length': data.length } : {} }, (res) => {
      let s = '';
      res.on('data', (c: Buffer) => (s += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: JSON.parse(s) as Reply['body'] }));
    });
    req.on('error', reject);
    req.end(data);
  });
}

async function untilInFlight(port: number, n: number): Promise<void> {
  for (;;) {
    const h = await request(port, 'GET', '/healthz');
    if (h.body.queue!.running + h.body.queue!.waiting >= n) return;
    await new Promise((r) => setTimeout(r, 20));
  }
}

const QUERIES = ['How can I stop one particular user from scheduling cron jobs?', 'How do I set disk quotas for a user?', 'Which daemon collects system log messages?'];

describe('shutdown', () => {
  test('SIGTERM to `npm start` reaches node: in-flight requests finish, new ones get 503 shutting_down, /readyz 503, exit 0', async () => {
    const s = await startServer({ RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, SMALL), RAGGUARD_SHUTDOWN_GRACE_MS: '600000' }, true);
    assert.equal((await request(s.port, 'GET', '/readyz')).status, 200);
    const queries = QUERIES.map((q) => request(s.port, 'POST', '/query', { query: q, max_new_tokens: 48 }));
    // An ingest whose body is still arriving: in flight until the test sends the rest, so the drain
    // cannot end before the checks below.
    const doc = Buffer.from(JSON.stringify({ doc_id: 'late', title: 'Late', text: 'Sent in two parts, across the SIGTERM.' }));
    const ingest = new Promise<Reply>((resolve, reject) => {
      const req = http.request({ host: '127.0.0.1', port: s.port, method: 'POST', path: '/documents', headers: { 'content-type': 'application/json', 'content-length': doc.length } }, (res) => {
        let b = '';
        res.on('data', (c: Buffer) => (b += c.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: JSON.parse(b) as Reply['body'] }));
      });
      req.on('error', reject);
      req.write(doc.subarray(0, 10));
      void untilInFlight(s.port, QUERIES.length).then(async () => {
        s.proc.kill('SIGTERM'); // npm's pid: npm passes the signal on to node, nothing in between
        for (;;) {
          const r = await request(s.port, 'GET', '/readyz');
          if (r.status === 503) break;
          await new Promise((res) => setTimeout(res, 20));
        }
        const refused = await request(s.port, 'POST', '/query', { query: 'anything?' });
        assert.equal(refused.status, 503);
        assert.equal(refused.body.error!.code, 'shutting_down');
        assert.ok(refused.headers['retry-after']);
        const ready = await request(s.port, 'GET', '/readyz');
        assert.equal(ready.body.error!.code, 'shutting_down');
        req.end(doc.subarray(10));
      }).catch(reject);
    });
    const replies = await Promise.all(queries);
    for (const r of replies) assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal((await ingest).status, 201, 'the ingest in flight finished and is durable');
    assert.equal(await s.exited, 0, s.log());
    assert.match(s.log(), /SIGTERM: draining/);
    assert.match(s.log(), /4 of 4 in-flight requests finished, 0 stopped/);
    assert.match(s.log(), /1 new ones refused/);
  });

  test('a grace period too short: the requests still running are stopped with 503 shutting_down, and the exit code says work was dropped', async () => {
    const s = await startServer({ RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, SMALL), RAGGUARD_SHUTDOWN_GRACE_MS: '0' });
    const queries = QUERIES.map((q) => request(s.port, 'POST', '/query', { query: q, max_new_tokens: 256 }).catch((e: Error) => e));
    await untilInFlight(s.port, QUERIES.length);
    s.proc.kill('SIGTERM');
    const replies = await Promise.all(queries);
    let stopped = 0;
    for (const r of replies) {
      assert.ok(!(r instanceof Error), `every request gets a reply, not a closed socket: ${String(r)}`);
      if (r.status === 200) continue;
      assert.equal(r.status, 503, JSON.stringify(r.body));
      assert.equal(r.body.error!.code, 'shutting_down');
      assert.match(r.body.error!.message, /RAGGUARD_SHUTDOWN_GRACE_MS/);
      assert.ok(r.headers['retry-after']);
      stopped++;
    }
    assert.ok(stopped > 0, 'a 256-token answer cannot finish between the check and the signal');
    assert.equal(await s.exited, 3, s.log());
    assert.match(s.log(), new RegExp(`${stopped} stopped at the grace deadline`));
  });
});

describe('crash and damage', () => {
  test('kill -9 in the middle of an ingest: the restart serves the old index or the whole batch, never part of it; the retry completes it', async () => {
    const indexDir = await tempDir();
    const env = { RAGGUARD_INDEX_DIR: indexDir, RAGGUARD_CORPUS_DIR: await smallCorpus(0, SMALL) };
    const s = await startServer(env);
    const before = (await request(s.port, 'GET', '/healthz')).body.documents as number;
    assert.equal(before, SMALL.length);
    const all = await readCorpus(CORPUS);
    const batch = all.filter((d) => !SMALL.includes(d.docId!)).slice(0, 24).map((d) => ({ doc_id: d.docId, title: d.title, text: d.text }));
    const sent = request(s.port, 'POST', '/documents', { documents: batch }).catch((e: Error) => e);
    // Wherever the ingest is when the kill lands (reading, embedding, writing, renaming), the outcome
    // below holds: the delay only makes "in the middle" likely, no assertion depends on it.
    await new Promise((r) => setTimeout(r, 300));
    s.proc.kill('SIGKILL');
    await s.exited;
    const reply = await sent;
    const restarted = await startServer(env);
    try {
      const docs = (await request(restarted.port, 'GET', '/healthz')).body.documents as number;
      assert.ok(docs === before || docs === before + batch.length, `${docs} documents: the old index (${before}) or all of the batch`);
      if (!(reply instanceof Error) && reply.status === 201) assert.equal(docs, before + batch.length, 'a 201 means durable');
      assert.deepEqual((await readdir(indexDir)).filter((f) => f.endsWith('.tmp')), [], 'no temporary file left');

      // A snapshot write that fails (a directory where its temporary file goes, as a full disk would
      // fail it): 500, nothing of the batch visible; the same batch retried then succeeds.
      const tmp = `${path.join(indexDir, 'index.snapshot')}.${restarted.proc.pid}.tmp`;
      await mkdir(tmp);
      const extra = { doc_id: 'extra', title: 'Extra', text: 'The sticky bit on /tmp keeps users from deleting each other\'s files.' };
      const failed = await request(restarted.port, 'POST', '/documents', extra);
      assert.equal(failed.status, 500, JSON.stringify(failed.body));
      assert.equal(failed.body.error!.code, 'internal');
      assert.equal((await request(restarted.port, 'GET', '/healthz')).body.documents, docs, 'nothing of the failed batch is visible');
      await rm(tmp, { recursive: true });
      assert.equal((await request(restarted.port, 'POST', '/documents', extra)).status, 201, 'the retry is no duplicate');
      assert.equal((await request(restarted.port, 'GET', '/healthz')).body.documents, docs + 1);

      const retry = await request(restarted.port, 'POST', '/documents', { documents: batch });
      if (docs === before) assert.equal(retry.status, 201, JSON.stringify(retry.body));
      else assert.equal(retry.body.error!.code, 'document_exists');
      assert.equal((await request(restarted.port, 'GET', '/healthz')).body.documents, before + batch.length + 1);
    } finally {
      restarted.proc.kill('SIGKILL');
      await restarted.exited;
    }

    // The same index damaged: start-up stops, naming the file and the section.
    const file = path.join(indexDir, 'index.snapshot');
    const bytes = await readFile(file);
    const damaged = Buffer.from(bytes);
    for (let i = damaged.length - 256; i < damaged.length; i++) damaged[i] = (damaged[i]! * 31 + 7) & 0xff;
    await writeFile(file, damaged);
    const failed = await failedStart(env);
    assert.equal(failed.code, 1);
    assert.match(failed.log, new RegExp(`${file.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}: section 'vectors' is damaged`));
    await writeFile(file, bytes.subarray(0, bytes.length - 100));
    const cut = await failedStart(env);
    assert.equal(cut.code, 1);
    assert.match(cut.log, /is truncated: section 'vectors'/);
    assert.doesNotMatch(cut.log, /read error/, "not faiss's raw message");
  });
});
