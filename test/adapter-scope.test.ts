/**
 * Adapters scoped per key (`adapters` in RAGGUARD_KEYS_FILE), over real HTTP on loopback with the shipped
 * test models and their LoRA adapters (demo-r8, demo-qv-r4): a key held to a list lists only those on
 * /v1/models and generates only with them; naming another (/query's `adapter`, whole or streamed, an
 * OpenAI `model` on completions and chat) is 403 adapter_forbidden with the error body, decided before
 * the adapter's files are looked at (a name that exists nowhere is the same 403 to it); a key without the
 * field, and the operator's key, keep every adapter. The field's validation in the keys file.
 */
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { parseKeysFile } from '../src/config/keys-file.js';
import { loadModels, RagService } from '../src/service/rag.js';
import { callJson, serveApp, smallCorpus, tempDir, testConfig } from './helpers.js';

const DEMO = 'demo-scoped-key-0001';
const BASE_ONLY = 'base-only-key-00002';
const ANY = 'any-adapter-key-0003';
const OPERATOR = 'operator-key-000004';
const KEYS = [
  { name: 'demo', key: DEMO, collections: '*', adapters: ['demo-r8'] },
  { name: 'base-only', key: BASE_ONLY, collections: '*', adapters: [] },
  { name: 'any', key: ANY, collections: '*' },
];
const DECODER = 'decoder-gqa';

let service: RagService;
let close: (() => Promise<void>) | undefined;
let base: string;

async function call(key: string, method: string, route: string, body?: unknown) {
  return callJson(base, key, method, route, body);
}

before(async () => {
  const dir = await tempDir();
  const keysFile = path.join(dir, 'keys.json');
  await writeFile(keysFile, JSON.stringify(KEYS));
  const cfg = testConfig({
    RAGGUARD_INDEX_DIR: path.join(dir, 'index'), RAGGUARD_CORPUS_DIR: await smallCorpus(0, ['apt-cache']), RAGGUARD_PROFILE_RUN: 'false',
    RAGGUARD_KEYS_FILE: keysFile, RAGGUARD_API_KEY: OPERATOR,
  });
  service = await RagService.start(cfg, await loadModels(cfg));
  ({ base, close } = await serveApp(service));
});

after(async () => {
  await close?.();
});

/** The 403 a key gets for an adapter outside its list. */
function forbidden(r: { status: number; body: Record<string, any>; text: string }, key: string, adapter: string, param: string) {
  assert.equal(r.status, 403, r.text);
  assert.equal(r.body['error']['code'], 'adapter_forbidden');
  assert.equal(r.body['error']['message'], `the key '${key}' may not use the adapter '${adapter}'`);
  assert.equal(r.body['error']['param'], param);
}

describe('adapters scoped per key', () => {
  test('/v1/models lists only the adapters a key may use', async () => {
    const ids = async (key: string) => ((await call(key, 'GET', '/v1/models')).body['data'] as { id: string }[]).map((m) => m.id);
    assert.deepEqual(await ids(DEMO), [DECODER, 'embedder', 'reranker', 'demo-r8']);
    assert.deepEqual(await ids(BASE_ONLY), [DECODER, 'embedder', 'reranker']);
    assert.deepEqual(await ids(ANY), [DECODER, 'embedder', 'reranker', 'demo-qv-r4', 'demo-r8']);
    assert.deepEqual(await ids(OPERATOR), [DECODER, 'embedder', 'reranker', 'demo-qv-r4', 'demo-r8']);
  });

  test("an OpenAI model naming an adapter outside the key's list: 403 adapter_forbidden; its own adapter and the base decoder run", async () => {
    const prompt = { prompt: 'Question: What is apt?\nAnswer:', max_tokens: 2, temperature: 0 };
    const chat = { messages: [{ role: 'user', content: 'What is apt?' }], max_tokens: 2, temperature: 0 };
    forbidden(await call(DEMO, 'POST', '/v1/completions', { ...prompt, model: 'demo-qv-r4' }), 'demo', 'demo-qv-r4', 'model');
    forbidden(await call(DEMO, 'POST', '/v1/chat/completions', { ...chat, model: 'demo-qv-r4' }), 'demo', 'demo-qv-r4', 'model');
    forbidden(await call(DEMO, 'POST', '/v1/chat/completions', { ...chat, model: 'demo-qv-r4', stream: true }), 'demo', 'demo-qv-r4', 'model');
    forbidden(await call(BASE_ONLY, 'POST', '/v1/completions', { ...prompt, model: 'demo-r8' }), 'base-only', 'demo-r8', 'model');
    // Decided before the files: a name that is no adapter at all is the same 403 to a scoped key, a 404 to the others.
    forbidden(await call(DEMO, 'POST', '/v1/completions', { ...prompt, model: 'no-such-adapter' }), 'demo', 'no-such-adapter', 'model');
    assert.equal((await call(ANY, 'POST', '/v1/completions', { ...prompt, model: 'no-such-adapter' })).body['error']['code'], 'model_not_found');

    const own = await call(DEMO, 'POST', '/v1/completions', { ...prompt, model: 'demo-r8' });
    assert.equal(own.status, 200, own.text);
    assert.equal(own.body['model'], 'demo-r8');
    for (const key of [DEMO, BASE_ONLY]) {
      const plain = await call(key, 'POST', '/v1/chat/completions', { ...chat, model: DECODER });
      assert.equal(plain.status, 200, plain.text);
    }
    const other = await call(ANY, 'POST', '/v1/chat/completions', { ...chat, model: 'demo-qv-r4' });
    assert.equal(other.status, 200, other.text);
    assert.deepEqual(service.adapters.stats().loaded, [], 'nothing stays loaded');
  });

  test("/query naming an adapter outside the key's list: 403 adapter_forbidden, whole or streamed; its own runs", async () => {
    const q = { query: 'What is apt?', max_new_tokens: 2 };
    forbidden(await call(DEMO, 'POST', '/query', { ...q, adapter: 'demo-qv-r4' }), 'demo', 'demo-qv-r4', 'adapter');
    forbidden(await call(DEMO, 'POST', '/query', { ...q, adapter: 'demo-qv-r4', stream: true }), 'demo', 'demo-qv-r4', 'adapter');
    forbidden(await call(BASE_ONLY, 'POST', '/query', { ...q, adapter: 'demo-r8' }), 'base-only', 'demo-r8', 'adapter');
    const own = await call(DEMO, 'POST', '/query', { ...q, adapter: 'demo-r8' });
    assert.equal(own.status, 200, own.text);
    assert.equal(own.body['adapter']['name'], 'demo-r8');
    assert.equal((await call(OPERATOR, 'POST', '/query', { ...q, adapter: 'demo-qv-r4' })).status, 200);
  });
});

describe("the keys file's adapters", () => {
  const sha = (k: string) => createHash('sha256').update(k).digest('hex');
  const entry = { name: 'k', key: 'a-good-key-123', collections: '*' };
  test('a list (possibly empty) or "*"; absent is every adapter', () => {
    const keys = parseKeysFile(JSON.stringify([
      { ...entry, adapters: ['demo-r8', 'demo-r8', 'coder-grounded'] }, { ...entry, name: 'e', key: 'another-key-456', adapters: [] },
      { ...entry, name: 's', key: 'third-key-789', adapters: '*' }, { ...entry, name: 'n', key: 'fourth-key-012' }]), sha);
    assert.deepEqual(keys.map((k) => k.adapters), [['demo-r8', 'coder-grounded'], [], '*', undefined]);
  });

  test('anything else stops the start, naming the entry', () => {
    for (const adapters of ['demo-r8', [1], ['../etc'], [''], null, {}]) {
      assert.throws(() => parseKeysFile(JSON.stringify([{ ...entry, adapters }]), sha), /entry 0 \('k'\): adapters must be "\*" or a list/, JSON.stringify(adapters));
    }
  });
});
