/**
 * Prefix-aware routing through the real router: PostgreSQL, three replicas (the small test models) and
 * HAProxy as scripts/cluster.sh starts them, with the prefix policy (bounded-load consistent hashing).
 * 32 chats share one long system prompt and differ in their first user message: each asks POST
 * /v1/route-key for its key (the KV block chain through the first user message) and sends it in
 * x-ragguard-prefix-key. Every replica must get some of the chats (the long shared prefix does not pin
 * them all to one), and every replica must serve its later chats from its prefix cache (the shared
 * system prompt computed once per replica, then hit). A conversation's second turn has the same key as its
 * first, so it reaches the replica that holds its blocks and hits more of them. Which replica answered is
 * the router's response header x-ragguard-replica (%[srv_name]); the hits are each reply's
 * cached_prompt_tokens, and each replica's /metrics (kv_cache_blocks{state="cached"}) is read directly.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp } from 'node:fs/promises';
import { readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';
import { ROOT, TEST_ENV } from './helpers.js';

const run = promisify(execFile);
const REPLICAS = 3;
const CHATS = 32;
const CONCURRENCY = 4;
const BLOCK = 16; // RAGGUARD_KV_BLOCK_SIZE's default
let dir: string;
let base: string;
let started = false;
let model: string;

const cluster = (...args: string[]) => run('bash', ['scripts/cluster.sh', ...args, '--dir', dir], {
  cwd: ROOT, env: { ...process.env, ...TEST_ENV, RAGGUARD_CORPUS_DIR: '', RAGGUARD_PROFILE_RUN: 'false' }, maxBuffer: 1 << 24,
});

// One long system prompt (a few hundred tokens), shared by every chat.
const SYSTEM = Array.from({ length: 24 }, (_, i) =>
  `Rule ${i + 1}: the support assistant of the Northwind depot answers in short sentences, cites the ticket number, ` +
  `and never promises a delivery date before the warehouse confirms shelf ${i * 7 + 3}.`).join(' ');
const topics = ['invoice', 'pallet', 'forklift', 'refund', 'customs', 'barcode', 'shipment', 'inventory'];
const firstUser = (i: number) => `Ticket ${1000 + i}: my ${topics[i % topics.length]} number ${i * 37} is wrong, what now?`;
const chatBody = (i: number, turns: { role: string; content: string }[] = []) => ({
  model, max_tokens: 2, temperature: 0,
  messages: [{ role: 'system', content: SYSTEM }, { role: 'user', content: firstUser(i) }, ...turns],
});

async function post(p: string, body: unknown, headers: Record<string, string> = {}): Promise<{ status: number; body: any; headers: Headers }> {
  const res = await fetch(base + p, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
  return { status: res.status, body: await res.json(), headers: res.headers };
}

async function keyOf(body: unknown, query = ''): Promise<{ key: string; blocks: number; tokens: number; prompt_tokens: number }> {
  const r = await post(`/v1/route-key${query}`, body);
  assert.equal(r.status, 200, JSON.stringify(r.body));
  assert.equal(r.headers.get('x-ragguard-prefix-key'), r.body.key);
  return r.body;
}

interface Served { replica: string; prompt: number; cached: number }
async function chat(body: unknown, key: string): Promise<Served> {
  const r = await post('/v1/chat/completions', body, { 'x-ragguard-prefix-key': key });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  const asRun = r.body.ragguard.guard.as_run;
  return { replica: r.headers.get('x-ragguard-replica') ?? '?', prompt: asRun.prompt_tokens, cached: asRun.cached_prompt_tokens };
}

/** Each replica's cached KV blocks, from its own /metrics (its port in the cluster's directory). */
async function cachedBlocks(): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (let i = 1; i <= REPLICAS; i++) {
    const port = readFileSync(path.join(dir, `replica-${i}`, 'port'), 'utf8').trim();
    const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
    const line = text.split('\n').find((l) => l.startsWith('ragguard:kv_cache_blocks{') && l.includes('state="cached"'));
    out[`r${i}`] = Number(line?.split(' ').pop() ?? NaN);
  }
  return out;
}

before(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'ragguard-prefix-routing-'));
  try {
    base = (await cluster('start', '--replicas', String(REPLICAS), '--policy', 'prefix')).stdout.trim().split('\n').pop()!;
  } catch (e) {
    throw new Error(`scripts/cluster.sh start failed (npm run setup installs haproxy and PostgreSQL): ${(e as { stderr?: string }).stderr ?? (e as Error).message}`);
  }
  started = true;
  model = ((await (await fetch(base + '/v1/models')).json()) as { data: { id: string }[] }).data[0]!.id;
});

after(async () => {
  if (started) await cluster('stop');
});

describe('prefix-aware routing behind HAProxy (3 replicas)', () => {
  test('the key: per conversation, stable across turns, capped at N blocks on request', async () => {
    const a = await keyOf(chatBody(0));
    const b = await keyOf(chatBody(1));
    assert.notEqual(a.key, b.key, 'chats that differ after the shared system prompt have different keys');
    assert.ok(a.blocks * BLOCK > 200, `the key covers the long system prompt's blocks (${a.blocks} blocks)`);
    assert.ok(a.tokens < a.prompt_tokens, 'the key ends with the first user message, before the generation prompt');
    const turn2 = await keyOf(chatBody(0, [{ role: 'assistant', content: 'Which depot?' }, { role: 'user', content: 'Northwind, shelf 3.' }]));
    assert.equal(turn2.key, a.key, "a conversation's later turn has its first turn's key");
    // Capped at 4 blocks (inside the shared system prompt): the two chats share a key.
    const a4 = await keyOf(chatBody(0), '?max_blocks=4');
    const b4 = await keyOf(chatBody(1), '?max_blocks=4');
    assert.equal(a4.key, b4.key);
    assert.equal(a4.blocks, 4);
  });

  test('32 chats with one long system prompt spread over every replica, and each replica hits its prefix cache', async () => {
    const served: Served[] = new Array(CHATS);
    const keys: string[] = new Array(CHATS);
    let next = 0;
    await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
      for (let i = next++; i < CHATS; i = next++) {
        keys[i] = (await keyOf(chatBody(i))).key;
        served[i] = await chat(chatBody(i), keys[i]!);
      }
    }));
    const per: Record<string, { chats: number; hits: number; cached: number; prompt: number }> = {};
    for (const s of served) {
      const p = (per[s.replica] ??= { chats: 0, hits: 0, cached: 0, prompt: 0 });
      p.chats++;
      p.cached += s.cached;
      p.prompt += s.prompt;
      // A hit on the shared system prompt: at least most of its full blocks from the cache.
      if (s.cached >= 12 * BLOCK) p.hits++;
    }
    const blocks = await cachedBlocks();
    console.log(`[prefix-routing] per replica ${JSON.stringify(per)}; cached KV blocks ${JSON.stringify(blocks)}`);
    assert.deepEqual(Object.keys(per).sort(), ['r1', 'r2', 'r3'], `every replica gets some of the chats: ${JSON.stringify(per)}`);
    for (const [r, p] of Object.entries(per)) {
      assert.ok(p.hits >= 1, `${r} served ${p.chats} chats and hit its prefix cache in ${p.hits}`);
      // Every chat after a replica's first (and those running beside it) finds the system prompt cached.
      assert.ok(p.hits >= p.chats - CONCURRENCY, `${r}: ${p.hits} of ${p.chats} chats hit`);
      assert.ok(blocks[r]! > 0, `${r}'s /metrics shows cached blocks`);
    }
    const total = served.reduce((a, s) => a + s.cached, 0) / served.reduce((a, s) => a + s.prompt, 0);
    assert.ok(total > 0.5, `hit rate over the 32 chats ${total.toFixed(3)}`);

    // Second turns: the same key, so the replica that served the first turn, which holds more of its blocks.
    // New conversations, one request at a time: under the load above, bounded load may have sent a first
    // turn past its key's replica to the next one on the ring (affinity is kept while a replica is not
    // over 1.5x the mean); unloaded, both turns go to the key's own.
    for (const i of [100, 101, 102]) {
      const first = await chat(chatBody(i), (await keyOf(chatBody(i))).key);
      await new Promise((r) => setTimeout(r, 100));
      const body = chatBody(i, [{ role: 'assistant', content: 'Which depot?' }, { role: 'user', content: 'Northwind, shelf 3.' }]);
      const s = await chat(body, (await keyOf(body)).key);
      assert.equal(s.replica, first.replica, `chat ${i}'s second turn reached ${s.replica}, its first ${first.replica}`);
      assert.ok(s.cached >= Math.floor((first.prompt - 1) / BLOCK) * BLOCK - BLOCK,
        `chat ${i}'s second turn hit ${s.cached} tokens (its first turn's prompt: ${first.prompt})`);
    }
  });
});
