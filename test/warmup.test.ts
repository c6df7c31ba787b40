/**
 * RAGGUARD_WARMUP: a spawned server sends itself one query before it reports ready (through auth,
 * as any client), and logs it; with RAGGUARD_WARMUP=false it sends none.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { smallCorpus, startServer, tempDir } from './helpers.js';

/** Starts the server, waits until it reports ready, kills it; resolves with its log lines (JSON). */
async function startLog(env: Record<string, string>): Promise<Record<string, unknown>[]> {
  const server = await startServer({ RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, ['quotas']), ...env });
  server.proc.kill('SIGKILL');
  await server.exited;
  return server.log().split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as Record<string, unknown>);
}

test('the server answers one warm-up query of its own before it reports ready, through auth like any client', async () => {
  const lines = await startLog({ RAGGUARD_API_KEY: 'key-for-the-warm-up' });
  const listening = lines.findIndex((l) => String(l['msg']).startsWith('ragguard ready'));
  const request = lines.findIndex((l) => l['req_id'] === 'warmup');
  const report = lines.findIndex((l) => l['msg'] === 'warm-up query');
  assert.ok(request >= 0 && report > request && listening > report, JSON.stringify(lines.map((l) => l['msg'])));
  assert.equal(lines[request]!['path'], '/query');
  assert.equal(lines[request]!['status'], 200);
  assert.equal(lines[report]!['status'], 200);
});

test('RAGGUARD_WARMUP=false: no warm-up query', async () => {
  const lines = await startLog({ RAGGUARD_WARMUP: 'false' });
  assert.ok(lines.some((l) => String(l['msg']).startsWith('ragguard ready')));
  assert.equal(lines.filter((l) => l['req_id'] === 'warmup' || l['msg'] === 'warm-up query').length, 0);
});
