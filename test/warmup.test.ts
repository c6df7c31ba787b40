/**
 * RAGGUARD_WARMUP: a spawned server sends itself one query before it reports listening (through auth,
 * as any client), and logs it; with RAGGUARD_WARMUP=false it sends none.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { test } from 'node:test';
import { ROOT, smallCorpus, tempDir, TEST_ENV } from './helpers.js';

/** Starts the server, waits until it reports listening, kills it; resolves with its log lines (JSON). */
async function startLog(env: Record<string, string>): Promise<Record<string, unknown>[]> {
  const proc = spawn(process.execPath, ['--import', 'tsx', 'src/server/main.ts'], {
    cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ...TEST_ENV, PORT: '0', RAGGUARD_PROFILE_RUN: 'false', RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, ['quotas']), ...env },
  });
  let out = '';
  proc.stdout.on('data', (c: Buffer) => (out += c.toString()));
  proc.stderr.on('data', (c: Buffer) => (out += c.toString()));
  const exited = new Promise<number | null>((resolve) => proc.on('exit', resolve));
  try {
    await new Promise<void>((resolve, reject) => {
      proc.stdout.on('data', () => /listening on http:/.test(out) && resolve());
      void exited.then((code) => reject(new Error(`server exited (${code}) before listening:\n${out}`)));
    });
  } finally {
    proc.kill('SIGKILL');
    await exited;
  }
  return out.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as Record<string, unknown>);
}

test('the server answers one warm-up query of its own before it reports listening, through auth like any client', async () => {
  const lines = await startLog({ RAGGUARD_API_KEY: 'key-for-the-warm-up' });
  const listening = lines.findIndex((l) => String(l['msg']).startsWith('ragguard listening'));
  const request = lines.findIndex((l) => l['req_id'] === 'warmup');
  const report = lines.findIndex((l) => l['msg'] === 'warm-up query');
  assert.ok(request >= 0 && report > request && listening > report, JSON.stringify(lines.map((l) => l['msg'])));
  assert.equal(lines[request]!['path'], '/query');
  assert.equal(lines[request]!['status'], 200);
  assert.equal(lines[report]!['status'], 200);
});

test('RAGGUARD_WARMUP=false: no warm-up query', async () => {
  const lines = await startLog({ RAGGUARD_WARMUP: 'false' });
  assert.ok(lines.some((l) => String(l['msg']).startsWith('ragguard listening')));
  assert.equal(lines.filter((l) => l['req_id'] === 'warmup' || l['msg'] === 'warm-up query').length, 0);
});
