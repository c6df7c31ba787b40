/**
 * Tenants kept apart (RAGGUARD_KEYS_FILE): over real HTTP on loopback, with the shipped test models and a
 * real faiss index, two keys each scoped to its own collection of many random documents. Neither ever
 * retrieves, cites, lists, reads or streams the other's chunks (/query whole and streamed, chat rag whole
 * and streamed, the documents routes), even when its question is written to pull the other's documents
 * up; a collection it may not use is 403 (a document there 404); keys over their request or token limit
 * get 429 with Retry-After; and an identical prompt finds no cached prefix blocks of another tenant.
 * Isolation and the 403/404s run on both stores (faiss, and a real PostgreSQL with pgvector started by
 * test/postgres.ts); over HTTP the limits count on a stopped clock (no test straddles two minutes' windows)
 * and their arithmetic is checked on a moving fake clock too; the keys file's validation through loadConfig.
 */
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { loadConfig } from '../src/config/config.js';
import { seededRandom } from '../src/generate/sampler.js';
import { createApp } from '../src/server/app.js';
import { HttpError } from '../src/server/errors.js';
import { MemoryUsageStore } from '../src/server/limit-store.js';
import { KeyLimits, limitsFor } from '../src/server/rate-limits.js';
import { keyTenant } from '../src/server/tenant.js';
import { loadModels, RagService, type Models } from '../src/service/rag.js';
import { createLogger } from '../src/server/logging.js';
import { callJson, smallCorpus, sseEvents, tempDir, TEST_ENV, testConfig } from './helpers.js';
import { startTestPostgres } from './postgres.js';

const KEY_A = 'tenant-a-key-000001';
const KEY_B = 'tenant-b-key-000002';
const KEY_SLOW = 'slow-key-000000003';
const KEY_THRIFTY = 'thrifty-key-000004';
const OPERATOR = 'operator-key-000005';
const ADMIN = 'admin-key-0000000006';
const sha = (k: string) => createHash('sha256').update(k).digest('hex');

const KEYS = [
  { name: 'alpha', key: KEY_A, collections: ['alpha'], admin: true },
  { name: 'beta', key_sha256: sha(KEY_B), collections: ['beta', 'beta-archive'], admin: true },
  { name: 'slow', key: KEY_SLOW, collections: ['alpha'], rate_per_minute: 1 },
  { name: 'thrifty', key_sha256: sha(KEY_THRIFTY), collections: ['alpha'], tokens_per_minute: 5 },
];

const SEED = Number(process.env['TENANTS_SEED'] ?? Math.floor(Math.random() * 2 ** 31));
const rand = seededRandom(SEED);
const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)]!;
const WORDS = ['kernel', 'disk', 'quota', 'cron', 'package', 'network', 'socket', 'memory', 'process', 'signal', 'mount', 'user',
  'group', 'permission', 'backup', 'archive', 'log', 'service', 'daemon', 'shell', 'printer', 'firewall', 'route', 'cache'];
const MARK = { alpha: 'alphazulu', beta: 'betayankee' } as const;
const DOCS = 30;

/** A random document of a tenant: shared words, its tenant's marker word, under an id both tenants use. */
function randomDoc(tenant: keyof typeof MARK, i: number) {
  const words = Array.from({ length: 30 + Math.floor(rand() * 30) }, () => pick(WORDS));
  return { doc_id: `doc-${i}`, title: `${tenant} note ${i}`, text: `${MARK[tenant]} note ${i}: ${words.join(' ')}. Filed under ${MARK[tenant]}.` };
}

let models: Models | undefined;
let base: string;

/**
 * The service on `store` behind a real HTTP server, the keys file and the operator key configured, and
 * each tenant's random documents ingested through its own key: A names no collection (its default), B
 * names its own. `clock`: what the per-key limits' windows are cut by (the faiss store's memory counts).
 */
async function startStack(store: 'faiss' | 'postgres', clock?: () => number): Promise<() => Promise<void>> {
  const dir = await tempDir();
  const keysFile = path.join(dir, 'keys.json');
  await writeFile(keysFile, JSON.stringify(KEYS));
  const pgServer = store === 'postgres' ? await startTestPostgres() : undefined;
  const cfg = testConfig({
    RAGGUARD_INDEX_DIR: path.join(dir, 'index'), RAGGUARD_CORPUS_DIR: await smallCorpus(0, ['apt-cache']), RAGGUARD_PROFILE_RUN: 'false',
    RAGGUARD_KEYS_FILE: keysFile, RAGGUARD_API_KEY: OPERATOR, RAGGUARD_ADMIN_KEY: ADMIN, ...(pgServer ? { RAGGUARD_STORE: await pgServer.database() } : {}),
  });
  models ??= await loadModels(cfg);
  const service = await RagService.start(cfg, models);
  assert.equal(service.store.kind, store);
  if (clock) limitsFor(service, { clock });
  const server: Server = createApp(service, { logger: createLogger('silent') }).listen(0, '127.0.0.1');
  await new Promise((r) => server.once('listening', r));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const a = await call(KEY_A, 'POST', '/documents', { documents: Array.from({ length: DOCS }, (_, i) => randomDoc('alpha', i)) });
  assert.equal(a.status, 201, JSON.stringify(a.body));
  const b = await call(KEY_B, 'POST', '/documents', { documents: Array.from({ length: DOCS }, (_, i) => ({ ...randomDoc('beta', i), collection: 'beta' })) });
  assert.equal(b.status, 201, JSON.stringify(b.body));
  return async () => {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
    await service.close();
    await pgServer?.stop();
  };
}

interface Reply {
  status: number;
  headers: Headers;
  body: Record<string, unknown>;
  text: string;
}

async function call(key: string | undefined, method: string, route: string, body?: unknown): Promise<Reply> {
  return callJson(base, key, method, route, body);
}

/** The data of each server-sent event, parsed where it is JSON. */
function events(text: string): { event: string | undefined; data: unknown }[] {
  return sseEvents(text).map(([event, data]) => {
    try {
      return { event, data: JSON.parse(data) as unknown };
    } catch {
      return { event, data };
    }
  });
}

interface Cited {
  doc_id: string;
  collection: string;
  text: string;
}

/** A question of shared words, often with the other tenant's marker in it to pull its documents up. */
function question(other: keyof typeof MARK): string {
  const words = Array.from({ length: 3 + Math.floor(rand() * 4) }, () => pick(WORDS));
  if (rand() < 0.6) words.splice(Math.floor(rand() * words.length), 0, MARK[other], MARK[other]);
  return words.join(' ');
}

function assertOwn(cited: readonly Cited[], own: keyof typeof MARK, where: string): void {
  const other = own === 'alpha' ? 'beta' : 'alpha';
  assert.ok(cited.length > 0, `${where}: something was retrieved (seed ${SEED})`);
  for (const c of cited) {
    assert.equal(c.collection, own, `${where}: a citation from '${c.collection}' (seed ${SEED})`);
    assert.ok(c.text.includes(MARK[own]) && !c.text.includes(MARK[other]), `${where}: chunk text ${JSON.stringify(c.text.slice(0, 80))} (seed ${SEED})`);
  }
}

const CHAT = { model: 'decoder-gqa', max_tokens: 2, temperature: 0 };

// The collections are kept apart inside each store's search: both stores are checked.
for (const store of ['faiss', 'postgres'] as const) {
  describe(`on the ${store} store`, () => {
    let stop: (() => Promise<void>) | undefined;
    before(async () => {
      stop = await startStack(store);
    });
    after(async () => {
      await stop?.();
    });

    describe('tenant isolation', () => {
      for (const [own, key] of [['alpha', KEY_A], ['beta', KEY_B]] as const) {
        const other = own === 'alpha' ? 'beta' : 'alpha';
        test(`${own}'s key retrieves, cites and streams only ${own}'s chunks (random documents and questions)`, async () => {
          for (let round = 0; round < 3; round++) {
            const q = question(other);
            const where = (route: string) => `${route} '${q}'`;
            const whole = await call(key, 'POST', '/query', { query: q, top_k: 20, rerank_top_n: 5, max_new_tokens: 1 });
            assert.equal(whole.status, 200, whole.text);
            assertOwn(whole.body['citations'] as Cited[], own, where('/query'));

            const streamed = await call(key, 'POST', '/query', { query: q, top_k: 20, rerank_top_n: 5, max_new_tokens: 1, stream: true });
            assert.equal(streamed.status, 200);
            const ev = events(streamed.text);
            const cites = ev.find((e) => e.event === 'citations')?.data as { citations: Cited[] } | undefined;
            assert.ok(cites, streamed.text);
            assertOwn(cites.citations, own, where('/query stream'));
            assert.ok(ev.some((e) => e.event === 'done'));

            const messages = [{ role: 'user', content: q }];
            const chat = await call(key, 'POST', '/v1/chat/completions', { ...CHAT, messages, rag: { top_k: 20, rerank_top_n: 5 } });
            assert.equal(chat.status, 200, chat.text);
            assertOwn(chat.body['citations'] as Cited[], own, where('chat rag'));

            const chatStream = await call(key, 'POST', '/v1/chat/completions', { ...CHAT, messages, stream: true, rag: { top_k: 20, rerank_top_n: 5 } });
            assert.equal(chatStream.status, 200);
            const first = events(chatStream.text)[0]!.data as { citations: Cited[] };
            assertOwn(first.citations, own, where('chat rag stream'));
          }
        });

        test(`${own}'s key lists and reads only ${own}'s documents, under ids the other tenant uses too`, async () => {
          const list = await call(key, 'GET', '/documents?limit=1000');
          assert.equal(list.status, 200, list.text);
          assert.equal(list.body['total'], DOCS);
          const docs = list.body['documents'] as { doc_id: string; collection: string; title: string }[];
          assert.ok(docs.every((d) => d.collection === own && d.title.startsWith(own)), JSON.stringify(docs.slice(0, 3)));
          const i = Math.floor(rand() * DOCS);
          const doc = await call(key, 'GET', `/documents/doc-${i}`);
          assert.equal(doc.status, 200);
          assert.equal(doc.body['collection'], own);
          for (const ch of doc.body['chunks'] as { text: string }[]) assert.ok(ch.text.includes(MARK[own]) && !ch.text.includes(MARK[other]));
        });
      }

      test('the operator key (RAGGUARD_API_KEY) keeps every collection: the filter, not the index, kept the tenants apart', async () => {
        const r = await call(OPERATOR, 'POST', '/query', { query: `${MARK.beta} ${MARK.beta} disk quota`, collection: 'beta', top_k: 20, rerank_top_n: 5, max_new_tokens: 1 });
        assert.equal(r.status, 200, r.text);
        assertOwn(r.body['citations'] as Cited[], 'beta', 'operator');
        const list = await call(OPERATOR, 'GET', '/documents?collection=alpha&limit=1');
        assert.equal(list.body['total'], DOCS);
      });

      test("a key's second collection is open to it, its first is its default", async () => {
        const r = await call(KEY_B, 'GET', '/documents?collection=beta-archive');
        assert.equal(r.status, 200);
        assert.equal(r.body['total'], 0);
      });
    });

    describe('collections a key may not use', () => {
      const forbidden = (r: Reply, param = 'collection') => {
        assert.equal(r.status, 403, r.text);
        const e = r.body['error'] as Record<string, unknown>;
        assert.equal(e['code'], 'collection_forbidden');
        assert.equal(e['param'], param);
      };

      test('/query, its stream and chat rag naming another collection: 403 before anything runs', async () => {
        forbidden(await call(KEY_B, 'POST', '/query', { query: 'disk', collection: 'alpha' }));
        forbidden(await call(KEY_B, 'POST', '/query', { query: 'disk', filter: { collection: 'alpha' } }), 'filter.collection');
        forbidden(await call(KEY_B, 'POST', '/query', { query: 'disk', collection: 'alpha', stream: true }));
        forbidden(await call(KEY_B, 'POST', '/query', { query: 'disk', collection: 'default' }));
        const chat = await call(KEY_B, 'POST', '/v1/chat/completions', { ...CHAT, messages: [{ role: 'user', content: 'disk' }], rag: { collection: 'alpha' } });
        forbidden(chat);
        assert.equal((chat.body['error'] as Record<string, unknown>)['type'], 'permission_error');
        forbidden(await call(KEY_B, 'POST', '/v1/chat/completions', { ...CHAT, stream: true, messages: [{ role: 'user', content: 'disk' }], rag: { collection: 'alpha' } }));
      });

      test('listing another collection: 403; reading or deleting a document there: the 404 of a missing one', async () => {
        forbidden(await call(KEY_B, 'GET', '/documents?collection=alpha'));
        const there = await call(KEY_B, 'GET', '/documents/doc-1?collection=alpha');
        const nowhere = await call(KEY_B, 'GET', '/documents/no-such-doc?collection=alpha');
        assert.equal(there.status, 404);
        assert.equal(nowhere.status, 404);
        const strip = (b: Record<string, unknown>) => JSON.stringify(b).replaceAll('doc-1', 'X').replaceAll('no-such-doc', 'X');
        assert.equal(strip(there.body), strip(nowhere.body), 'an existing id looks like a missing one');
        assert.equal((await call(KEY_B, 'DELETE', '/documents/doc-1?collection=alpha')).status, 404);
        assert.equal((await call(KEY_A, 'GET', '/documents/doc-1')).status, 200, 'still there for its own tenant');
      });

      test('writes into another collection: 403 and nothing written (a batch with one such document included)', async () => {
        forbidden(await call(KEY_B, 'POST', '/documents', { doc_id: 'intruder', text: 'intruding text', collection: 'alpha' }));
        forbidden(await call(KEY_B, 'POST', '/documents', { documents: [{ doc_id: 'ok-1', text: 'fine text' }, { doc_id: 'bad-1', text: 'bad text', collection: 'alpha' }] }),
          'documents[1].collection');
        forbidden(await call(KEY_B, 'PUT', '/documents/doc-2', { text: 'overwrite', collection: 'alpha' }));
        forbidden(await call(KEY_B, 'PUT', '/documents/doc-2?collection=alpha', { text: 'overwrite' }));
        assert.equal((await call(KEY_A, 'GET', '/documents?limit=1')).body['total'], DOCS);
        assert.equal((await call(KEY_B, 'GET', '/documents?limit=1')).body['total'], DOCS, 'the batch wrote nothing');
        const doc = await call(KEY_A, 'GET', '/documents/doc-2');
        assert.ok(((doc.body['chunks'] as { text: string }[])[0]!.text).includes(MARK.alpha));
      });

      test('a key without admin may not write even its own collection; unknown keys are 401', async () => {
        const r = await call(KEY_THRIFTY, 'POST', '/documents', { doc_id: 'x', text: 'some text' });
        assert.equal(r.status, 403);
        assert.equal((r.body['error'] as Record<string, unknown>)['code'], 'forbidden');
        assert.equal((await call('not-a-key-at-all', 'GET', '/documents')).status, 401);
        assert.equal((await call(undefined, 'GET', '/documents')).status, 401);
      });
    });
  });
}

/**
 * The limits' clock over HTTP: stopped 10 s into a minute, so that the requests of a test never straddle
 * two windows (on a loaded machine a minute may turn between a key's first request and its second) and
 * Retry-After is known exactly.
 */
const STOPPED_CLOCK = Date.UTC(2026, 11, 5, 12, 0, 10);

describe('on the faiss store: limits and the prefix cache', () => {
  let stop: (() => Promise<void>) | undefined;
  before(async () => {
    stop = await startStack('faiss', () => STOPPED_CLOCK);
  });
  after(async () => {
    await stop?.();
  });

  describe('per-key limits', () => {
    test('over its requests per minute: 429 rate_limited with Retry-After', async () => {
      assert.equal((await call(KEY_SLOW, 'GET', '/documents')).status, 200);
      const r = await call(KEY_SLOW, 'GET', '/documents');
      assert.equal(r.status, 429);
      assert.equal((r.body['error'] as Record<string, unknown>)['code'], 'rate_limited');
      assert.equal(r.headers.get('retry-after'), '50', 'the seconds to the window\'s end');
      assert.equal((r.body['error'] as Record<string, unknown>)['retry_after_seconds'], 50);
      // Other keys are not held back by it.
      assert.equal((await call(KEY_A, 'GET', '/documents?limit=1')).status, 200);
    });

    test('over its tokens per minute: the next generation gets 429 token_limit with Retry-After; /metrics counts by key name', async () => {
      const first = await call(KEY_THRIFTY, 'POST', '/query', { query: 'disk quota', max_new_tokens: 2 });
      assert.equal(first.status, 200, first.text);
      const u = first.body['usage'] as { prompt_tokens: number; completion_tokens: number };
      const used = u.prompt_tokens + u.completion_tokens;
      assert.ok(used > 5);
      for (const [route, body] of [['/query', { query: 'disk' }], ['/v1/completions', { model: 'decoder-gqa', prompt: 'disk', max_tokens: 1 }],
        ['/v1/chat/completions', { ...CHAT, messages: [{ role: 'user', content: 'disk' }], rag: {} }]] as const) {
        const r = await call(KEY_THRIFTY, 'POST', route, body);
        assert.equal(r.status, 429, `${route}: ${r.text}`);
        assert.equal((r.body['error'] as Record<string, unknown>)['code'], 'token_limit');
        // Until the minute's window ends.
        assert.equal(r.headers.get('retry-after'), '50', `Retry-After for ${used} tokens`);
      }
      // /metrics is an admin route: the operator's API key is not an admin key here.
      assert.equal((await call(OPERATOR, 'GET', '/metrics')).status, 403);
      const metrics = await call(ADMIN, 'GET', '/metrics');
      assert.match(metrics.text, new RegExp(`^ragguard:key_tokens_total\\{key="thrifty"[^}]*\\} ${used}$`, 'm'));
      assert.match(metrics.text, /^ragguard:key_limited_total\{key="thrifty",code="token_limit"[^}]*\} 3$/m);
      assert.match(metrics.text, /^ragguard:key_limited_total\{key="slow",code="rate_limited"[^}]*\} 1$/m);
      assert.match(metrics.text, /^ragguard:key_requests_total\{key="alpha"[^}]*\} \d+$/m);
      for (const secret of [KEY_A, KEY_B, KEY_SLOW, KEY_THRIFTY, OPERATOR, ADMIN, sha(KEY_B)]) assert.ok(!metrics.text.includes(secret), 'no key in /metrics');
    });

    test('the windows on a fake clock: a key\'s requests and tokens start again with each minute; a refused request takes nothing', async () => {
      let now = 10_000;
      const limits = new KeyLimits(new MemoryUsageStore(() => now));
      const t = keyTenant({ name: 'k', sha256: '', collections: '*', ratePerMinute: 2, tokensPerMinute: 100, admin: false }, false);
      const ok = (r: unknown) => assert.ok(!(r instanceof HttpError), String((r as HttpError | undefined)?.message));
      ok(await limits.admitRequest(t));
      const second = await limits.admitRequest(t);
      ok(second);
      const refused = await limits.admitRequest(t);
      assert.ok(refused instanceof HttpError);
      assert.equal(refused.status, 429);
      assert.equal(refused.code, 'rate_limited');
      assert.equal(refused.headers['Retry-After'], '50');
      now = 59_500;
      assert.equal(((await limits.admitRequest(t)) as HttpError).headers['Retry-After'], '1');
      now = 60_000;
      const fresh = await limits.admitRequest(t);
      ok(fresh);
      assert.equal(limits.checkGeneration(t, fresh as Exclude<typeof fresh, HttpError>), undefined);
      limits.chargeTokens(t, 250); // over the allowance: charged all the same
      await limits.settled('k');
      now = 90_000;
      const after = await limits.admitRequest(t);
      ok(after);
      assert.equal((await limits.store.usage('k')).tokens, 250);
      const spent = limits.checkGeneration(t, after as Exclude<typeof after, HttpError>);
      assert.equal(spent?.code, 'token_limit');
      assert.equal(spent?.headers['Retry-After'], '30');
      now = 120_000;
      const next = await limits.admitRequest(t);
      assert.equal(limits.checkGeneration(t, next as Exclude<typeof next, HttpError>), undefined);
    });
  });

  describe('prefix cache per tenant', () => {
    test("an identical prompt finds no cached blocks of another tenant's; the same tenant's repeat does", async () => {
      const prompt = `Context:\n${Array.from({ length: 40 }, () => pick(WORDS)).join(' ')}\n\nQuestion: which words are listed?\nAnswer:`;
      const cached = async (key: string) => {
        const r = await call(key, 'POST', '/v1/completions', { model: 'decoder-gqa', prompt, max_tokens: 1, temperature: 0 });
        assert.equal(r.status, 200, r.text);
        const guard = (r.body['ragguard'] as { guard: { as_run: { cached_prompt_tokens: number; prompt_tokens: number } } }).guard;
        return guard.as_run;
      };
      const a1 = await cached(KEY_A);
      assert.equal(a1.cached_prompt_tokens, 0);
      assert.ok(a1.prompt_tokens >= 48, 'several blocks of prompt');
      const b1 = await cached(KEY_B);
      assert.equal(b1.cached_prompt_tokens, 0, "B gets none of A's blocks");
      assert.equal((await cached(OPERATOR)).cached_prompt_tokens, 0, "nor does the operator's unsalted prompt");
      const a2 = await cached(KEY_A);
      assert.ok(a2.cached_prompt_tokens >= 32, `A's repeat hits its own blocks (${a2.cached_prompt_tokens})`);
      assert.ok((await cached(KEY_B)).cached_prompt_tokens >= 32, "B's repeat hits B's");
    });
  });
});


describe('the keys file at start-up', () => {
  const load = async (content: string, env: Record<string, string> = {}) => {
    const f = path.join(await tempDir(), 'keys.json');
    await writeFile(f, content);
    return () => loadConfig({ ...TEST_ENV, RAGGUARD_KEYS_FILE: f, ...env });
  };
  const good = { name: 'ok', key: 'a-good-key-123', collections: ['x'] };

  test('a bad entry stops the start, naming it', async () => {
    const cases: [unknown, RegExp][] = [
      [[good, { name: 'bad', key: 'short', collections: ['x'] }], /RAGGUARD_KEYS_FILE: .*entry 1 \('bad'\): key must have at least 8/],
      [[{ name: 'nocol', key: 'a-good-key-999' }], /entry 0 \('nocol'\): collections must be/],
      [[{ name: 'both', key: 'a-good-key-999', key_sha256: sha('x'), collections: '*' }], /entry 0 \('both'\): needs exactly one of key and key_sha256/],
      [[{ name: 'hash', key_sha256: 'abc', collections: '*' }], /key_sha256 must be 64 hex digits/],
      [[{ name: 'typo', key: 'a-good-key-999', collections: '*', rate_per_minut: 3 }], /entry 0 \('typo'\): unknown field rate_per_minut/],
      [[{ name: 'lim', key: 'a-good-key-999', collections: '*', tokens_per_minute: 0 }], /tokens_per_minute must be an integer/],
      [[good, { ...good, key: 'another-key-123' }], /entry 1 \('ok'\): the name is given twice/],
      [[good, { ...good, name: 'twin' }], /entry 1 \('twin'\): the same key as 'ok'/],
      [[{ key: 'a-good-key-999', collections: '*' }], /entry 0: name must match/],
      [{ keys: [] }, /expected a JSON array/],
    ];
    for (const [content, message] of cases) assert.throws(await load(JSON.stringify(content)), message, JSON.stringify(content));
    assert.throws(await load('[{'), /RAGGUARD_KEYS_FILE: .*not JSON/);
    assert.throws(() => loadConfig({ ...TEST_ENV, RAGGUARD_KEYS_FILE: '/nonexistent/keys.json' }), /RAGGUARD_KEYS_FILE: cannot read/);
    assert.throws(await load(JSON.stringify([good]), { RAGGUARD_API_KEY: good.key }), /'ok' has the same key as RAGGUARD_API_KEY/);
  });

  test('a good file loads: hashed keys kept as given, plain ones hashed', async () => {
    const cfg = (await load(JSON.stringify([good, { name: 'h', key_sha256: sha('zz').toUpperCase(), collections: '*', rate_per_minute: 3, admin: true }])))();
    assert.deepEqual(cfg.keys.map((k) => [k.name, k.sha256, k.collections, k.ratePerMinute, k.admin]),
      [['ok', sha(good.key), ['x'], undefined, false], ['h', sha('zz'), '*', 3, true]]);
  });
});
