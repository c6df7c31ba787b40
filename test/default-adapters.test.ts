/**
 * Adapters on Qwen2.5-Coder-0.5B-Instruct Q4_K_M (fetched by setup beside the default 1.5B, and the base of
 * the adapters it ships), the other settings at their defaults: the adapters setup makes for it (scripts/build-adapters.ts: coder-random-r8, and the trained coder-grounded
 * copied from models/shipped-adapters) fit it, so RAGGUARD_DECODER_LORA=auto converts it with LoRA inputs,
 * and over real HTTP a request naming an adapter is answered in the same batch as base-model requests. A /query
 * that names none runs coder-grounded (RAGGUARD_QUERY_ADAPTER=auto); `adapter: null` is the base model.
 */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { test } from 'node:test';
import { loadConfig } from '../src/config/config.js';
import { loraWanted } from '../src/generate/adapters.js';
import { configDims, DecoderModel } from '../src/backends/ort/decoder-model.js';
import type { DecoderAdapter } from '../src/generate/lora-pool.js';
import { ggufModel } from '../src/backends/ort/convert/gguf-weights.js';
import { planAdapter, type PeftConfig } from '../src/generate/lora.js';
import { RagService } from '../src/service/rag.js';
import { GgufFile } from '../src/runtime/gguf.js';
import { readHeader } from '../src/runtime/safetensors.js';
import { createApp } from '../src/server/app.js';
import { QWEN_05B_GGUF, ROOT, smallCorpus, tempDir } from './helpers.js';

const DEFAULTS = loadConfig({});
const GGUF = QWEN_05B_GGUF;
const ADAPTERS = path.join(ROOT, 'models', 'adapters');
const CODER = ['coder-grounded', 'coder-random-r8'];
const missing = !existsSync(GGUF) ? `${GGUF} is missing: run npm run setup (scripts/fetch-pretrained-qwen.sh)`
  : CODER.some((n) => !existsSync(path.join(ADAPTERS, n))) ? `${ADAPTERS} lacks ${CODER.join(' or ')}: run npm run setup (scripts/build-adapters.ts)` : false;

test('the adapters setup makes for Qwen2.5-Coder-0.5B fit it, and auto turns its LoRA inputs on', { skip: missing }, async () => {
  const file = GgufFile.open(GGUF);
  const shape = (() => {
    try {
      return configDims(ggufModel(file).config);
    } finally {
      file.close();
    }
  })();
  for (const name of CODER) {
    const dir = path.join(ADAPTERS, name);
    const cfg = JSON.parse(await readFile(path.join(dir, 'adapter_config.json'), 'utf8')) as PeftConfig;
    const plan = planAdapter(cfg, (await readHeader(path.join(dir, 'adapter_model.safetensors'))).tensors, shape, DEFAULTS.maxLoraRank);
    assert.equal(new Set(plan.slots.map((s) => s.slot.layer)).size, shape.numLayers, `${name}: every layer`);
  }
  // The small decoder's samples do not fit it (another base model).
  const small = JSON.parse(await readFile(path.join(ADAPTERS, 'demo-r8', 'adapter_config.json'), 'utf8')) as PeftConfig;
  assert.throws(() => planAdapter(small, new Map([['base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight', { dtype: 'F32', shape: [8, 256], offsets: [0, 8192] }],
    ['base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight', { dtype: 'F32', shape: [256, 8], offsets: [8192, 16384] }]]), shape));
  const said: string[] = [];
  const wanted = loraWanted({ decoderLora: 'auto', adapterDir: ADAPTERS, maxLoraRank: DEFAULTS.maxLoraRank }, (m) => said.push(m));
  assert.equal(typeof wanted, 'function');
  assert.equal(await (wanted as (s: typeof shape) => Promise<boolean>)(shape), true);
  assert.match(said.join('\n'), /LoRA inputs: on \(adapter 'coder-grounded'/);
});

test('Qwen2.5-Coder-0.5B, defaults otherwise: requests naming adapters answer 200 in one batch with base requests, over HTTP', { skip: missing }, async () => {
  const cfg = loadConfig({
    PORT: '0', RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, ['quotas']), RAGGUARD_PROFILE_RUN: 'false',
    RAGGUARD_DECODER: GGUF,
    // The conversion goes where the environment says (a worktree sharing models/gguf-cache points it at its own).
    ...(process.env['RAGGUARD_GGUF_CACHE'] ? { RAGGUARD_GGUF_CACHE: process.env['RAGGUARD_GGUF_CACHE'] } : {}),
  });
  assert.equal(cfg.decoderPath, GGUF);
  assert.equal(cfg.decoderLora, 'auto');
  const service = await RagService.start(cfg);
  const decoder = service.models.decoder;
  assert.ok(decoder instanceof DecoderModel, 'the CPU path');
  assert.ok(decoder.loraSlots, 'converted with LoRA inputs');
  assert.equal(service.adapters.unavailable, '');
  assert.equal(service.queryAdapter, 'coder-grounded', 'RAGGUARD_QUERY_ADAPTER=auto finds the grounded adapter');
  // Every forward run's rows: which adapter each had.
  const runs: (DecoderAdapter | undefined)[][] = [];
  const forward = decoder.forward.bind(decoder);
  decoder.forward = (async (args: Parameters<typeof forward>[0]) => {
    runs.push(args.adapters ? [...args.adapters] : args.lengths.map(() => undefined));
    return forward(args);
  }) as typeof forward;
  // The requests meet in the engine: each generate waits until all four have asked (retrieval and rerank
  // take their own time per request), then all go in together.
  const generate = service.engine.generate.bind(service.engine);
  const arrived: (() => void)[] = [];
  service.engine.generate = ((...args: Parameters<typeof generate>) => new Promise<void>((go) => {
    arrived.push(go);
    if (arrived.length === 4) for (const g of arrived) g();
  }).then(() => generate(...args))) as typeof generate;

  const server = createApp(service).listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  try {
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/query`;
    const ask = async (adapter?: string | null) => {
      const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ query: 'What are disk quotas for?', max_new_tokens: 8, ...(adapter === undefined ? {} : { adapter }) }) });
      return { status: res.status, body: (await res.json()) as { answer?: string; adapter?: { name: string; key: string }; usage?: { completion_tokens: number } } };
    };
    const answers = await Promise.all([ask(null), ask('coder-grounded'), ask(), ask('coder-random-r8')]);
    assert.deepEqual(answers.map((a) => a.status), [200, 200, 200, 200], JSON.stringify(answers.map((a) => a.body)));
    assert.deepEqual(answers.map((a) => a.body.adapter?.name), [undefined, 'coder-grounded', 'coder-grounded', 'coder-random-r8']);
    for (const a of answers) assert.ok(a.body.usage!.completion_tokens > 0);
    assert.match(answers[1]!.body.adapter!.key, /^coder-grounded@[0-9a-f]{16}$/);
    // A run with both kinds of rows: base rows (no adapter) beside rows of both adapters.
    const mixed = runs.find((r) => r.some((a) => a === undefined) && new Set(r.filter((a) => a !== undefined).map((a) => a!.key)).size === 2);
    assert.ok(mixed, `no run mixed the base model with both adapters: ${JSON.stringify(runs.map((r) => r.map((a) => a?.key ?? 'base')))}`);
    assert.deepEqual(service.adapters.stats().loaded, [], 'unloaded after the last request');
  } finally {
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
});
