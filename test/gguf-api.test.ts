/**
 * A GGUF decoder served end to end: RAGGUARD_DECODER names the pretrained SmolLM2-135M-Instruct
 * Q4_1 file (setup fetches it), the server converts it (or finds it converted) and answers over
 * loopback with the genai fast path.
 */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import request from 'supertest';
import { loadModels, RagService } from '../src/service/rag.js';
import { createApp } from '../src/server/app.js';
import { ROOT, smallCorpus, tempDir, testConfig } from './helpers.js';

const GGUF = path.join(ROOT, 'models', 'pretrained', 'SmolLM2-135M-Instruct.Q4_1.gguf');

test('a .gguf RAGGUARD_DECODER is converted and serves /query', { skip: existsSync(GGUF) ? false : `${GGUF} is missing: run npm run setup (scripts/fetch-pretrained-decoder.sh)` }, async () => {
  const cfg = testConfig({ RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, ['quotas']), RAGGUARD_DECODER: GGUF,
    // The conversion goes where the environment says (a worktree sharing models/gguf-cache points it at its own).
    ...(process.env['RAGGUARD_GGUF_CACHE'] ? { RAGGUARD_GGUF_CACHE: process.env['RAGGUARD_GGUF_CACHE'] } : {}) });
  const models = await loadModels(cfg);
  assert.equal(models.decoder.shape.numLayers, 30);
  assert.equal(models.decoder.tokenizer.config['add_bos_token'], false);
  assert.match(String(models.decoder.tokenizer.config['chat_template']), /<\|im_start\|>/);
  const service = await RagService.start(cfg, models);
  const app = createApp(service);
  const health = await request(app).get('/healthz').expect(200);
  assert.deepEqual(health.body.decoder, { layout: 'genai', run_path: 'direct' });
  const res = await request(app).post('/query').send({ query: 'What are disk quotas for?', max_new_tokens: 16 }).expect(200);
  assert.equal(typeof res.body.answer, 'string');
  assert.ok(res.body.usage.completion_tokens > 0);
  // The sample adapters are the small decoder's and the default decoder's, none SmolLM2's: converted without
  // LoRA inputs (RAGGUARD_DECODER_LORA=auto), a request naming one is refused, saying why and what turns them on.
  assert.equal(models.decoder.loraSlots, null);
  const refused = await request(app).post('/query').send({ query: 'What are disk quotas for?', max_new_tokens: 4, adapter: 'demo-r8' }).expect(400);
  assert.equal(refused.body.error.code, 'adapter_not_found');
  assert.match(refused.body.error.message, /no LoRA inputs.*RAGGUARD_DECODER_LORA/);
});

test("a GGUF converted by the server's own start counts its decoder's weights as a start that finds it converted does", { skip: existsSync(GGUF) ? false : `${GGUF} is missing: run npm run setup` }, async () => {
  // A fresh conversion cache: the first load converts in this process, freeing hundreds of MiB of
  // buffers just before the decoder's load; the second finds the conversion. Measured without settling
  // first, the first load reused that freed memory unseen and counted the weights as 0 bytes, so the
  // budget was planned as if the decoder held nothing.
  const cache = await tempDir('gguf-load-');
  const cfg = testConfig({ RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_DECODER: GGUF, RAGGUARD_GGUF_CACHE: cache });
  const converted = await loadModels(cfg);
  const found = await loadModels(cfg);
  const [a, b] = [converted.loads.decoder.hostBytes, found.loads.decoder.hostBytes];
  // SmolLM2-135M Q4_1 as the runtime holds it: about 235 MiB either way.
  assert.ok(b > 100 * 2 ** 20, `found converted: ${b} bytes`);
  assert.ok(Math.abs(a - b) < 0.2 * b, `converted here: ${a} bytes, found converted: ${b}`);
});
