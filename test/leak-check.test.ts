/**
 * The slow-leak check on a real service and real native memory: the test leaks on purpose (mapped
 * and touched pages, never freed, as faiss-node's index copies were) at a rate the per-window check
 * cannot see, and /debug/memory and /metrics flag it. Time is the samples' own (sampleMemory(at)),
 * so the check runs over "thirty minutes" in a second, with no clock in the test.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import koffi from 'koffi';
import request from 'supertest';
import { settledResident } from '../src/guards/peak-meter.js';
import { createApp } from '../src/server/app.js';
import { RagService } from '../src/service/rag.js';
import { smallCorpus, tempDir, testConfig } from './helpers.js';

const MIN = 60_000;
const MiB = 2 ** 20;
const libc = koffi.load('libc.so.6');
// Fresh anonymous pages, touched: each leak is new resident memory. (malloc's 3 MiB blocks could be served
// from pages the process had freed but glibc kept resident, whose reuse raises no RSS: a clean-clone suite
// run measured 0.5 MiB a minute of the 3 leaked that way, and the trend rightly said steady.)
const mmap = libc.func('void *mmap(void *addr, size_t n, int prot, int flags, int fd, long off)') as (a: null, n: number, prot: number, flags: number, fd: number, off: number) => unknown;
const munmap = libc.func('int munmap(void *p, size_t n)') as (p: unknown, n: number) => number;
const memset = libc.func('void *memset(void *p, int c, size_t n)') as (p: unknown, c: number, n: number) => unknown;
const PROT_READ_WRITE = 0x3, MAP_PRIVATE_ANONYMOUS = 0x22;
const leaked: unknown[] = [];

let service: RagService;
before(async () => {
  service = await RagService.start(testConfig({
    RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(2), RAGGUARD_PROFILE_RUN: 'false',
    // Samples only when the test takes them; the default warm-up, span and slope (1 MiB a minute).
    RAGGUARD_LEAK_SAMPLE_MS: '3600000', RAGGUARD_LEAK_WINDOW: '4',
  }));
});
after(async () => {
  for (const p of leaked) munmap(p, 3 * MiB);
  await service.close();
});

test('a slow native leak is flagged by the trend in /debug/memory and /metrics; a steady process is not', async () => {
  const app = createApp(service);
  const t0 = Date.now();
  // Each "minute" is sampled on settled memory (garbage collected, V8's dead buffers freed, glibc's free
  // heap given back), as a minute of real time leaves it. Sampled back to back instead, the process's own
  // churn lands between samples at random: a loaded clean-clone run saw resident memory grow 45 MB over the
  // 30 minutes that leaked 90 MiB (its dead buffers freed and trimmed in the middle), a slope of 1.0 MiB a
  // minute, and the trend rightly said steady.
  const sample = async (m: number) => {
    await settledResident();
    service.sampleMemory(t0 + m * MIN);
  };
  // Twenty quiet minutes after start: steady.
  for (let m = 1; m <= 20; m++) await sample(m);
  let mem = (await request(app).get('/debug/memory').expect(200)).body;
  assert.equal(mem.trend.verdict, 'steady', JSON.stringify(mem.trend));
  assert.equal(mem.trend.flagged, false);
  assert.ok(mem.native.faiss_index_bytes > 0 && mem.native.store_predicted_bytes >= mem.native.faiss_index_bytes);
  assert.ok('in_use_bytes' in mem.native.malloc, 'glibc malloc is read');

  // Then 3 MiB a minute of native memory that nothing frees, with queries going on (the window check
  // sees 4 requests and well under its 64 MB threshold).
  for (let m = 21; m <= 50; m++) {
    const p = mmap(null, 3 * MiB, PROT_READ_WRITE, MAP_PRIVATE_ANONYMOUS, -1, 0);
    memset(p, 1, 3 * MiB);
    leaked.push(p);
    if (m % 10 === 0) await service.query({ query: 'What is the sticky bit?', topK: 5, rerankTopN: 2, maxNewTokens: 2, temperature: 0 });
    await sample(m);
  }
  mem = (await request(app).get('/debug/memory').expect(200)).body;
  assert.equal(mem.trend.verdict, 'growing', JSON.stringify(mem.trend));
  assert.equal(mem.trend.flagged, true);
  // The slope is of real resident memory, which also moves with what settling leaves (the allocator's
  // caches, V8's heap size). What matters is that it is above the 1 MiB a minute the soak's goal allows.
  assert.ok(mem.trend.rss_slope_bytes_per_min > 1 * MiB, `slope ${mem.trend.rss_slope_bytes_per_min}`);
  assert.equal(mem.growth.flagged, false, 'the per-window check does not see a leak this slow');
  const metrics = (await request(app).get('/metrics').expect(200)).text;
  assert.match(metrics, /^ragguard:memory_leak_suspected\{check="trend"[^}]*\} 1$/m);
  assert.match(metrics, /^ragguard:memory_leak_suspected\{check="window"[^}]*\} 0$/m);
  assert.match(metrics, /^ragguard:memory_growth_bytes_per_minute\{kind="rss_adjusted"[^}]*\} \d+/m);
});
