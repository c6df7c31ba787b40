/**
 * The cluster as scripts/cluster.sh starts it, real processes on loopback: PostgreSQL, two replicas
 * (the small test models) and HAProxy in front. A document ingested through the router is cited by a
 * query through the router whichever replica answers; prefix hashing sends one body to one replica.
 * Which replica served what is read from the router's own counters (its stats page), not guessed.
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
let dir: string;
let base: string;
let started = false;

const cluster = (...args: string[]) => run('bash', ['scripts/cluster.sh', ...args, '--dir', dir], {
  cwd: ROOT, env: { ...process.env, ...TEST_ENV, RAGGUARD_CORPUS_DIR: '', RAGGUARD_PROFILE_RUN: 'false' }, maxBuffer: 1 << 24,
});

async function call(method: string, p: string, body?: unknown): Promise<{ status: number; body: any }> {
  const res = await fetch(base + p, {
    method, headers: body === undefined ? {} : { 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: res.status, body: await res.json() };
}

/** Requests each replica was sent by the router (HAProxy's stot), and its state. */
async function routed(): Promise<Record<string, { sent: number; status: string }>> {
  const port = readFileSync(path.join(dir, 'stats_port'), 'utf8').trim();
  const csv = await (await fetch(`http://127.0.0.1:${port}/stats;csv`)).text();
  const out: Record<string, { sent: number; status: string }> = {};
  for (const f of csv.split('\n').map((l) => l.split(','))) {
    if (f[0] === 'replicas' && f[1] !== 'BACKEND') out[f[1]!] = { sent: Number(f[7]), status: f[17]! };
  }
  return out;
}

/** Until the router's health checks put replica `name` in `state` (UP or DOWN); fails after ~60 s of polls. */
async function routerSees(name: string, state: 'UP' | 'DOWN'): Promise<void> {
  for (let i = 0; i < 300; i++) {
    if ((await routed())[name]?.status === state) return;
    await new Promise((r) => setTimeout(r, 200));
  }
  assert.fail(`the router never saw ${name} ${state}: ${JSON.stringify(await routed())}`);
}

/**
 * Asks n times through the router (the i-th ask: asks(i), ASK by default), each reply citing zorblax first;
 * how many each replica answered.
 */
/**
 * Sends n queries one after another; how many each replica answered, by the router's x-ragguard-replica
 * header on each reply. Not by HAProxy's session counters: a request retried on a fresh connection (an idle
 * keep-alive connection the replica had just closed: retry-on conn-failure) counts a session on each try.
 */
async function askCited(n: number, asks: (i: number) => object = () => ASK, headers: Record<string, string> = {}): Promise<Record<string, number>> {
  const answered: Record<string, number> = Object.fromEntries(Object.keys(await routed()).map((s) => [s, 0]));
  for (let i = 0; i < n; i++) {
    const res = await fetch(base + '/query', { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(asks(i)) });
    assert.equal(res.status, 200);
    const replica = res.headers.get('x-ragguard-replica');
    assert.ok(replica, 'the router names the replica that answered');
    answered[replica] = (answered[replica] ?? 0) + 1;
    assert.equal(((await res.json()) as { citations: { doc_id: string }[] }).citations[0]!.doc_id, 'zorblax');
  }
  return answered;
}

before(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'ragguard-cluster-test-'));
  try {
    base = (await cluster('start', '--replicas', '2', '--policy', 'roundrobin')).stdout.trim().split('\n').pop()!;
  } catch (e) {
    throw new Error(`scripts/cluster.sh start failed (npm run setup installs haproxy and PostgreSQL): ${(e as { stderr?: string }).stderr ?? (e as Error).message}`);
  }
  started = true;
});

after(async () => {
  if (started) await cluster('stop');
});

const ZORBLAX = 'The zorblaxd daemon listens on TCP port 4711 and writes its journal to /var/log/zorblax.log.';
const ASK = { query: 'Which port does zorblaxd listen on?', max_new_tokens: 2 };

describe('replicas behind the router', () => {
  test('both replicas are up in the router and share one Postgres', async () => {
    const r = await routed();
    assert.deepEqual(Object.keys(r).sort(), ['r1', 'r2']);
    for (const s of Object.values(r)) assert.equal(s.status, 'UP');
    const h = await call('GET', '/healthz');
    assert.equal(h.body.store, 'postgres');
  });

  test('a document ingested through the router is cited through the router by either replica', async () => {
    const ingest = await call('PUT', '/documents/zorblax', { title: 'The zorblaxd daemon', text: ZORBLAX });
    assert.equal(ingest.status, 201);
    const answered = await askCited(4);
    // Round robin: each replica answered some of them.
    for (const s of ['r1', 'r2']) assert.ok(answered[s]! > 0, `${s} answered none of the queries`);
  });

  test('prefix hashing sends one body to one replica', async () => {
    // Unbounded consistent hashing: this asserts where a key goes, not the load bound. With the default bound
    // (150% of the average in-flight load) a request sent right after the previous reply may find that
    // reply's stream still counted on the key's replica and go to the other (1 of 6 keyed requests did in a
    // loaded clean-clone run); the bound's spread is test/prefix-routing.test.ts's subject.
    await cluster('router', '--policy', 'prefix', '--balance-factor', '0');
    // The script returns once the new router's checks have both replicas UP: were one down, every request
    // would go to the other and the assertion below would hold for the wrong reason.
    for (const s of Object.values(await routed())) assert.equal(s.status, 'UP');
    const answered = await askCited(4);
    assert.deepEqual([answered['r1'], answered['r2']].sort(), [0, 4]);
    // Different questions (different bodies) with one X-Prefix-Key: one replica too.
    const paraphrases = ['Which port does zorblaxd listen on?', 'On what TCP port is zorblaxd listening?', 'zorblaxd port number?',
      'Tell me the port of the zorblaxd daemon.', 'Where does zorblaxd write its journal, and on which port does it listen?', 'zorblaxd: port?'];
    // Without the key these bodies hash to both replicas (the hash is deterministic: this holds every run), so the
    // keyed run below shows the key at work, not a lucky draw.
    const unkeyed = await askCited(paraphrases.length, (i) => ({ query: paraphrases[i], max_new_tokens: 2 }));
    assert.ok(unkeyed['r1']! > 0 && unkeyed['r2']! > 0, `unkeyed: ${JSON.stringify(unkeyed)}`);
    const keyed = await askCited(paraphrases.length, (i) => ({ query: paraphrases[i], max_new_tokens: 2 }), { 'x-prefix-key': 'tenant-zorblax' });
    assert.deepEqual([keyed['r1'], keyed['r2']].sort(), [0, paraphrases.length]);
  });

  test('a replica killed with -9 is taken out, the router answers 503 JSON with none left, and both rejoin', async () => {
    const kill = (i: number) => process.kill(Number(readFileSync(path.join(dir, `replica-${i}`, 'pid'), 'utf8')), 'SIGKILL');
    kill(2);
    await routerSees('r2', 'DOWN');
    // The one left answers everything, citing what is in Postgres.
    const answered = await askCited(3);
    assert.equal(answered['r1'], 3);
    kill(1);
    await routerSees('r1', 'DOWN');
    const res = await fetch(base + '/query', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(ASK) });
    assert.equal(res.status, 503);
    assert.equal(res.headers.get('retry-after'), '1');
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, 'no_replica');
    await cluster('replica', '1');
    await cluster('replica', '2');
    await routerSees('r1', 'UP');
    await routerSees('r2', 'UP');
    const back = await askCited(1);
    assert.equal(back['r1']! + back['r2']!, 1);
  });
});
