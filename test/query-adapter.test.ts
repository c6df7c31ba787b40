/**
 * RAGGUARD_QUERY_ADAPTER: the adapter a /query that names none generates with. Its resolution at start-up
 * (off, a name that must load, auto: the shipped grounded adapter where it fits, else the base model with
 * the reason), and, over real HTTP with the test models and their demo adapters, what a request gets: the
 * default when it names none (whole and streamed, whatever the key's adapter list), the base model for
 * `adapter: null`, its own when it names one; /healthz says which; a name that cannot load stops the start.
 */
import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { loadConfig } from '../src/config/config.js';
import { AdapterInvalidError, AdapterNotFoundError, GROUNDED_ADAPTERS, resolveQueryAdapter } from '../src/generate/adapters.js';
import { loadModels, RagService, type Models } from '../src/service/rag.js';
import { callJson, serveApp, smallCorpus, sseEvents, tempDir, testConfig } from './helpers.js';

describe('resolving RAGGUARD_QUERY_ADAPTER', () => {
  const registry = (fits: (name: string) => Error | undefined) => ({
    inspect: async (name: string) => {
      const e = fits(name);
      if (e) throw e;
      return { name, dir: '', plan: undefined as never, bytes: 0, maxRank: 8 };
    },
  });

  test('off: none; a name: that adapter, or the loader\'s error', async () => {
    assert.deepEqual(await resolveQueryAdapter('off', registry(() => new Error('not asked'))), { name: undefined, note: 'query adapter: none (RAGGUARD_QUERY_ADAPTER=off)' });
    assert.equal((await resolveQueryAdapter('demo-r8', registry(() => undefined))).name, 'demo-r8');
    await assert.rejects(resolveQueryAdapter('gone', registry((n) => new AdapterNotFoundError(`adapter '${n}' not found`))), AdapterNotFoundError);
    await assert.rejects(resolveQueryAdapter('bad', registry((n) => new AdapterInvalidError(`adapter '${n}': wrong shape`))), AdapterInvalidError);
  });

  test('auto: the first grounded adapter that loads for the decoder, else the base model saying why', async () => {
    const asked: string[] = [];
    const first = await resolveQueryAdapter('auto', registry((n) => (asked.push(n), undefined)));
    assert.deepEqual(asked, [GROUNDED_ADAPTERS[0]], 'the first that loads ends the search');
    assert.equal(first.name, 'coder-grounded-1.5b');
    // On the 0.5B the 1.5B's adapter does not fit: the 0.5B's own is next.
    const small = await resolveQueryAdapter('auto', registry((n) => (n === 'coder-grounded-1.5b' ? new AdapterInvalidError("adapter 'coder-grounded-1.5b': q_proj is 1536 wide, the decoder's 896") : undefined)));
    assert.equal(small.name, 'coder-grounded');
    assert.match(small.note, /query adapter: coder-grounded \(RAGGUARD_QUERY_ADAPTER=auto/);
    const misfit = await resolveQueryAdapter('auto', registry((n) => new AdapterInvalidError(`adapter '${n}': q_proj is 896 wide, the decoder's 256`)));
    assert.equal(misfit.name, undefined);
    assert.match(misfit.note, /none \(RAGGUARD_QUERY_ADAPTER=auto: adapter 'coder-grounded-1\.5b': q_proj is 896 wide.*; adapter 'coder-grounded': q_proj is 896 wide/);
    assert.equal((await resolveQueryAdapter('auto', registry(() => new AdapterNotFoundError('not found')))).name, undefined);
    // Anything else (a disk error) is not a reason to serve without it quietly.
    await assert.rejects(resolveQueryAdapter('auto', registry(() => new Error('EIO'))), /EIO/);
  });

  test('the variable: auto by default; off, or an adapter name, never a path', () => {
    assert.equal(loadConfig({}).queryAdapter, 'auto');
    assert.equal(loadConfig({ RAGGUARD_QUERY_ADAPTER: 'off' }).queryAdapter, 'off');
    assert.equal(loadConfig({ RAGGUARD_QUERY_ADAPTER: 'demo-r8' }).queryAdapter, 'demo-r8');
    for (const bad of ['../etc', '', 'a/b', '.hidden']) {
      assert.throws(() => loadConfig({ RAGGUARD_QUERY_ADAPTER: bad }), /RAGGUARD_QUERY_ADAPTER/, bad);
    }
  });
});

describe('a /query that names no adapter, over HTTP (test models, RAGGUARD_QUERY_ADAPTER=demo-r8)', () => {
  const BASE_ONLY = 'base-only-key-00002';
  const OPERATOR = 'operator-key-000004';
  let models: Models;
  let service: RagService;
  let close: (() => Promise<void>) | undefined;
  let base: string;
  let dir: string;

  const call = (key: string, route: string, body?: unknown) => callJson(base, key, body === undefined ? 'GET' : 'POST', route, body);;
  const env = async (extra: Record<string, string>) => testConfig({
    RAGGUARD_INDEX_DIR: path.join(dir, `index-${Object.values(extra).join('-')}`), RAGGUARD_CORPUS_DIR: await smallCorpus(0, ['apt-cache']),
    RAGGUARD_PROFILE_RUN: 'false', ...extra,
  });

  before(async () => {
    dir = await tempDir();
    const keysFile = path.join(dir, 'keys.json');
    await writeFile(keysFile, JSON.stringify([{ name: 'base-only', key: BASE_ONLY, collections: '*', adapters: [] }]));
    const cfg = await env({ RAGGUARD_QUERY_ADAPTER: 'demo-r8', RAGGUARD_KEYS_FILE: keysFile, RAGGUARD_API_KEY: OPERATOR });
    models = await loadModels(cfg);
    service = await RagService.start(cfg, models);
    ({ base, close } = await serveApp(service));
  });

  after(async () => {
    await close?.();
  });

  const q = { query: 'What is apt?', max_new_tokens: 2 };

  test('the default runs when none is named; null is the base model; a named one runs as named', async () => {
    assert.equal((await call(OPERATOR, '/healthz')).body['query_adapter'], 'demo-r8');
    const plain = await call(OPERATOR, '/query', q);
    assert.equal(plain.status, 200, plain.text);
    assert.equal(plain.body['adapter']['name'], 'demo-r8');
    const baseModel = await call(OPERATOR, '/query', { ...q, adapter: null });
    assert.equal(baseModel.status, 200, baseModel.text);
    assert.equal(baseModel.body['adapter'], undefined, 'the base model: no adapter in the reply');
    const other = await call(OPERATOR, '/query', { ...q, adapter: 'demo-qv-r4' });
    assert.equal(other.status, 200, other.text);
    assert.equal(other.body['adapter']['name'], 'demo-qv-r4');
    assert.equal((await call(OPERATOR, '/query', { ...q, adapter: 7 })).status, 400, 'not a name, not null');
  });

  test('streamed, the same; a key held to no adapters gets the default and may still not name one', async () => {
    const streamed = await call(OPERATOR, '/query', { ...q, stream: true });
    assert.equal(streamed.status, 200, streamed.text);
    const done = sseEvents(streamed.text).find(([event]) => event === 'done');
    assert.ok(done, streamed.text);
    assert.equal((JSON.parse(done[1]) as { adapter?: { name: string } }).adapter?.name, 'demo-r8');
    const scoped = await call(BASE_ONLY, '/query', q);
    assert.equal(scoped.status, 200, scoped.text);
    assert.equal(scoped.body['adapter']['name'], 'demo-r8', "the server's default, not the key's choice");
    const named = await call(BASE_ONLY, '/query', { ...q, adapter: 'demo-r8' });
    assert.equal(named.status, 403, named.text);
    assert.equal(named.body['error']['code'], 'adapter_forbidden');
  });

  test('auto on a decoder the grounded adapter does not fit: the base model; a name that cannot load stops the start', async () => {
    const auto = await RagService.start(await env({ RAGGUARD_QUERY_ADAPTER: 'auto' }), models);
    try {
      assert.equal(auto.queryAdapter, undefined);
      assert.equal(auto.queryAdapterFor(undefined), undefined);
      assert.equal(auto.queryAdapterFor('demo-r8'), 'demo-r8');
    } finally {
      await auto.close();
    }
    await assert.rejects(RagService.start(await env({ RAGGUARD_QUERY_ADAPTER: 'no-such-adapter' }), models),
      /RAGGUARD_QUERY_ADAPTER: adapter 'no-such-adapter' not found in /);
  });
});
