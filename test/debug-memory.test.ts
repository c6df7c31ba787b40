/** GET /debug/memory on the real app: every component, the KV pool, the queue, the fallback GPU reading. */
import assert from 'node:assert/strict';
import { before, test } from 'node:test';
import request from 'supertest';
import type { Express } from 'express';
import { RagService } from '../src/service/rag.js';
import { createApp } from '../src/server/app.js';
import { accountingUnavailable, countingAllocator } from '../src/backends/ort/ort-allocator.js';
import { smallCorpus, tempDir, testConfig, faiss } from './helpers.js';

let app: Express;
let service: RagService;

before(async () => {
  const cfg = testConfig({
    RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, ['apt-cache', 'quotas']),
    RAGGUARD_KV_CACHE_BYTES: String(8 << 20), RAGGUARD_LEAK_WINDOW: '4',
  });
  service = await RagService.start(cfg);
  app = createApp(service);
});

test('the snapshot accounts for every component, the KV pool and the process', async () => {
  const res = await request(app).get('/debug/memory').expect(200);
  const m = res.body;
  const names = m.components.map((c: { name: string }) => c.name);
  assert.deepEqual(names, ['embedder', 'reranker', 'decoder', 'kv_pool', 'block_tables', 'faiss_index', 'adapter_slots', 'token_masks', 'allocator_warm']);
  const byName = Object.fromEntries(m.components.map((c: { name: string; bytes: number }) => [c.name, c.bytes]));
  assert.ok(byName.decoder > 0, 'decoder load was measured');
  assert.equal(byName.kv_pool, m.kv.pool_bytes);
  assert.ok(m.kv.pool_bytes <= 8 << 20 && m.kv.pool_bytes > (8 << 20) - m.kv.block_size * m.kv.bytes_per_token);
  assert.equal(m.kv.bytes_per_token, 2 * 4 * 2 * 32 * 4, '2 x layers x kv_heads x head_dim x fp32');
  // The store-wide index's float32 vectors, and each collection's own copy of them with its chunk ids (8 bytes
  // each: faiss-collections.ts), which its filtered searches scan. A collection's array is counted as
  // allocated: it grows by doubling as documents arrive, so up to twice its vectors.
  const vectorBytes = faiss(service).chunkCount * service.store.dimension * 4;
  const ids = faiss(service).chunkCount * 8;
  assert.ok(byName.faiss_index >= 2 * vectorBytes + ids && byName.faiss_index <= 3 * vectorBytes + ids,
    `faiss_index ${byName.faiss_index}: the index's ${vectorBytes} bytes of vectors, the collections' copy (${vectorBytes} to twice that) and ${ids} of ids`);
  assert.equal(m.components_total_bytes, Object.values(byName).reduce((a: number, b) => a + (b as number), 0));
  assert.equal(m.kv.free_blocks, m.kv.total_blocks, 'nothing allocated while idle');
  const { slots, ...adapters } = m.adapters;
  assert.deepEqual(adapters, { dir: service.cfg.adapterDir, loaded: [], waiting: 0, loads: 0, unloads: 0 });
  assert.deepEqual([slots.max_loras, slots.max_rank, slots.free], [4, 16, 4]);
  assert.equal(byName.adapter_slots, slots.bytes, 'the slots, allocated at start-up, are a component');
  assert.ok(slots.bytes > 0);
  assert.equal(m.queue.running, 0);
  assert.equal(m.gpu, null);
  assert.match(m.gpu_unavailable_reason, /libnvidia-ml/);
  for (const k of ['rss', 'heap_total', 'heap_used', 'external', 'array_buffers']) assert.ok(m.process[k] > 0, k);
  assert.ok(m.budget.host_total_bytes > 0);
  // ONNX Runtime's own host bytes, accounted by the counting allocator (the profile's meter).
  assert.equal(m.onnxruntime_host.accounted, true);
  assert.ok(m.onnxruntime_host.live_bytes > 0 && m.onnxruntime_host.peak_bytes >= m.onnxruntime_host.live_bytes, JSON.stringify(m.onnxruntime_host));
  assert.equal(m.memory_model.host_meter, 'accounted');
  // The allocator's warm cache: at most its limit held, the limit a component counted in the budget.
  assert.equal(byName.allocator_warm, service.cfg.allocatorWarmBytes);
  assert.equal(m.onnxruntime_host.warm_limit_bytes, service.cfg.allocatorWarmBytes);
  assert.ok(m.onnxruntime_host.warm_bytes >= 0 && m.onnxruntime_host.warm_bytes <= m.onnxruntime_host.warm_limit_bytes);
});

test('growth is tracked over the last requests', async () => {
  for (let i = 0; i < 5; i++) await request(app).post('/query').send({ query: `apt-cache policy ${i}`, max_new_tokens: 2 }).expect(200);
  const m = (await request(app).get('/debug/memory').expect(200)).body;
  assert.equal(m.growth.window, 4);
  assert.equal(m.growth.samples, 4);
  assert.equal(typeof m.growth.flagged, 'boolean');
  assert.equal(typeof m.growth.rss_growth_bytes, 'number');
  assert.equal(m.kv.used_blocks, 0, 'finished requests returned their blocks');
  // The slow-leak check expects the store's bytes and the allocator's warm cache as far as it is resident
  // (bounded, not a leak): its pages written, at most its blocks' length.
  assert.ok(m.onnxruntime_host.warm_resident_bytes >= 0 && m.onnxruntime_host.warm_resident_bytes <= m.onnxruntime_host.warm_bytes, JSON.stringify(m.onnxruntime_host));
  assert.ok(m.native.expected_growth_bytes >= m.native.store_predicted_bytes + m.onnxruntime_host.warm_resident_bytes, JSON.stringify(m.native));
  // ONNX Runtime's bytes by where they lie: malloc's share is inside malloc's in-use figure, the regions'
  // (with the warm cache's resident pages) outside it; together, everything accounted.
  const n = m.native;
  assert.ok(n.onnxruntime_in_malloc_bytes > 0 && n.onnxruntime_in_malloc_bytes <= n.malloc.in_use_bytes, JSON.stringify(n));
  assert.equal(n.onnxruntime_in_malloc_bytes + n.onnxruntime_regions_bytes, n.onnxruntime_live_bytes + m.onnxruntime_host.warm_resident_bytes);
});

test('a snapshot reads the warm cache\'s resident pages once (a pagemap pass over its blocks) and shows the same figure everywhere', async (t) => {
  const counters = countingAllocator();
  if (!counters) return t.skip(`no counting allocator: ${accountingUnavailable()}`);
  const read = counters.warmResident;
  const sample = service.sampleMemory;
  let reads = 0;
  let samples = 0; // the slow-leak check's timer reads it too, and may fire meanwhile
  counters.warmResident = () => { reads++; return read(); };
  service.sampleMemory = (at?: number) => { samples++; sample.call(service, at); };
  try {
    const m = (await request(app).get('/debug/memory').expect(200)).body;
    assert.equal(reads, 1 + samples);
    const warm = m.components.find((c: { name: string }) => c.name === 'allocator_warm');
    if (warm) assert.match(warm.detail, new RegExp(`${m.onnxruntime_host.warm_resident_bytes} of them resident`));
  } finally {
    counters.warmResident = read;
    service.sampleMemory = sample;
  }
});
