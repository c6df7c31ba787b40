/**
 * A dropped-in Optimum export served end to end: RAGGUARD_DECODER names a constant-folded export of the
 * shipped decoder (weights renamed, [in, out]); the server converts it into the genai layout by itself
 * (RAGGUARD_DECODER_CONVERT=auto, cached in RAGGUARD_GGUF_CACHE), so the fast path and LoRA adapters work.
 */
import assert from 'node:assert/strict';
import { readdir } from 'node:fs/promises';
import { test } from 'node:test';
import request from 'supertest';
import { loadModels, RagService } from '../src/service/rag.js';
import { createApp } from '../src/server/app.js';
import { editedExport, fold } from './export-fixture.js';
import { smallCorpus, tempDir, testConfig } from './helpers.js';

test('an Optimum export as RAGGUARD_DECODER is converted at start-up and serves /query with a LoRA adapter', async () => {
  const cache = await tempDir('ragguard-convert-cache-');
  const cfg = testConfig({
    RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, ['quotas']),
    RAGGUARD_DECODER: await editedExport(fold), RAGGUARD_GGUF_CACHE: cache,
  });
  const models = await loadModels(cfg);
  assert.equal((await readdir(cache)).filter((d) => d !== '.digests').length, 1, 'one conversion in the cache');
  const service = await RagService.start(cfg, models);
  const app = createApp(service);
  const health = await request(app).get('/healthz').expect(200);
  assert.deepEqual(health.body.decoder, { layout: 'genai', run_path: 'direct' });
  const res = await request(app).post('/query').send({ query: 'What are disk quotas for?', max_new_tokens: 8, adapter: 'demo-r8' }).expect(200);
  assert.equal(res.body.adapter.name, 'demo-r8');
  assert.ok(res.body.usage.completion_tokens > 0);
});
