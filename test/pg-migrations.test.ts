/**
 * The Postgres store's schema under migrations, on a real server with real roles: `ragguard migrate` (the
 * CLI, as an operator runs it) creates the schema as the role that owns the database and grants a server
 * role select, insert, update and delete only; the store then opens, writes and searches as that role,
 * which cannot change the schema. Before the migration that role is refused, naming `ragguard migrate`.
 * The same role counts a key with limits (ragguard_key_usage).
 * A database made before migrations (the old schema, global BM25 figures, ASCII-only terms) is brought
 * forward at open and then scores exactly as a new database holding the same documents.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { promisify } from 'node:util';
import pg from 'pg';
import pgvector from 'pgvector';
import { normalize } from '../src/retrieval/embedder.js';
import { STOPWORDS } from '../src/retrieval/lexical.js';
import { MIGRATIONS, SCHEMA_VERSION } from '../src/retrieval/pg-schema.js';
import { PostgresStore } from '../src/retrieval/postgres-store.js';
import { HttpError } from '../src/server/errors.js';
import { PostgresUsageStore } from '../src/server/limit-store.js';
import { KeyLimits } from '../src/server/rate-limits.js';
import { keyTenant } from '../src/server/tenant.js';
import type { NewDocument } from '../src/retrieval/retrieval-store.js';
import { ROOT } from './helpers.js';
import { startTestPostgres, type TestPostgres } from './postgres.js';

const run = promisify(execFile);
const D = 8;
const BM25 = { k1: 1.2, b: 0.75 };
const quiet = () => undefined;

let server: TestPostgres;
const suffix = randomBytes(4).toString('hex');
const OWNER = `ragguard_owner_${suffix}`;
const APP = `ragguard_app_${suffix}`;
let admin: pg.Client;

before(async () => {
  server = await startTestPostgres();
  admin = new pg.Client({ connectionString: server.url });
  await admin.connect();
  await admin.query(`CREATE ROLE ${OWNER} LOGIN; CREATE ROLE ${APP} LOGIN`);
});
after(async () => {
  // On a server the caller runs (RAGGUARD_TEST_PG_URL), nothing of this file is left behind.
  await admin?.query(`DROP DATABASE IF EXISTS ragguard_lp_${suffix} WITH (FORCE)`).catch(() => undefined);
  await admin?.query(`DROP ROLE IF EXISTS ${APP}; DROP ROLE IF EXISTS ${OWNER}`).catch(() => undefined);
  await admin?.end();
  await server?.stop();
});

function as(url: string, role: string): string {
  const u = new URL(url);
  u.username = role;
  return u.toString();
}

function unit(seed: number): Float32Array {
  const v = Float32Array.from({ length: D }, (_, i) => Math.cos(seed * 1.7 + i * 0.9));
  normalize(v);
  return v;
}

const DOCS: NewDocument[] = [
  { doc: { docId: 'fr', title: 'École', bytes: 1, collection: 'a' }, chunks: [{ text: "L'élève étudie à l'école.", tokens: 5 }], vectors: unit(1) },
  { doc: { docId: 'zh', title: '机器学习', bytes: 1, collection: 'a' }, chunks: [{ text: '机器学习是人工智能的一个分支。', tokens: 9 }], vectors: unit(2) },
  { doc: { docId: 'en', title: 'Quotas', bytes: 1, collection: 'a' }, chunks: [{ text: 'Disk quotas limit the space a user may take.', tokens: 9 }], vectors: unit(3) },
  { doc: { docId: 'en2', title: 'Cron', bytes: 1, collection: 'b' }, chunks: [{ text: 'Cron runs jobs; quotas are checked nightly by a cron job.', tokens: 11 }], vectors: unit(4) },
];

async function ragguard(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await run(process.execPath, ['--import', 'tsx', path.join(ROOT, 'src/cli/main.ts'), ...args], { cwd: ROOT });
    return { code: 0, stdout, stderr };
  } catch (e) {
    const err = e as { code?: number; stdout?: string; stderr?: string };
    return { code: err.code ?? 1, stdout: err.stdout ?? '', stderr: err.stderr ?? '' };
  }
}

test('ragguard migrate as the owner; the server role with DML rights only opens, writes, searches and counts a limited key, and cannot change the schema', async () => {
  const db = `ragguard_lp_${suffix}`;
  await admin.query(`CREATE DATABASE ${db} OWNER ${OWNER}`);
  const base = new URL(server.url);
  base.pathname = `/${db}`;
  const ownerUrl = as(base.toString(), OWNER);
  const appUrl = as(base.toString(), APP);

  // Before any migration the server role may not create the schema: it is refused, told what to run.
  await assert.rejects(PostgresStore.open(appUrl, D, { bm25: BM25, log: quiet }), /schema is at version 0, this build needs \d+ .*ragguard migrate/s);

  const status = await ragguard(['migrate', '--store', ownerUrl, '--status', '--json']);
  assert.equal(status.code, 0, status.stderr);
  assert.deepEqual(JSON.parse(status.stdout), { store: ownerUrl.replace(/\/$/, ''), version: 0, latest: SCHEMA_VERSION });
  const migrated = await ragguard(['migrate', '--store', ownerUrl, '--dimension', String(D), '--grant', APP, '--json']);
  assert.equal(migrated.code, 0, migrated.stderr);
  const report = JSON.parse(migrated.stdout) as { from: number; to: number; applied: string[]; granted: string };
  assert.deepEqual([report.from, report.to, report.applied.length, report.granted], [0, SCHEMA_VERSION, MIGRATIONS.length, APP]);
  const again = await ragguard(['migrate', '--store', ownerUrl, '--json']);
  assert.deepEqual(JSON.parse(again.stdout).applied, [], 'a second run has nothing to do');
  // A dimension the database's vectors do not have is refused (a migration does not change it), as is one out of range.
  const other = await ragguard(['migrate', '--store', ownerUrl, '--dimension', String(D + 1)]);
  assert.equal(other.code, 2, other.stderr);
  assert.match(other.stderr, new RegExp(`vectors have ${D} dimensions, not ${D + 1}`));
  const same = await ragguard(['migrate', '--store', ownerUrl, '--dimension', String(D), '--json']);
  assert.equal(same.code, 0, same.stderr);
  for (const bad of ['abc', '0', '16001', '2.5']) {
    const r = await ragguard(['migrate', '--store', ownerUrl, '--dimension', bad]);
    assert.equal(r.code, 2, `${bad}: ${r.stderr}`);
    assert.match(r.stderr, new RegExp(`integer in 1\\.\\.16000, got "${bad.replace('.', '\\.')}"`));
  }

  const app = new pg.Client({ connectionString: appUrl });
  await app.connect();
  try {
    await assert.rejects(app.query('CREATE TABLE ragguard_extra (x int)'), /permission denied/, 'the server role may not create');
    await assert.rejects(app.query('ALTER TABLE ragguard_chunks ADD COLUMN x int'), /must be owner/, 'nor alter');
    await assert.rejects(app.query('DROP TABLE ragguard_terms'), /must be owner/, 'nor drop');
  } finally {
    await app.end();
  }

  const store = await PostgresStore.open(appUrl, D, { bm25: BM25, migrate: 'never', log: quiet });
  try {
    await store.addBatch(DOCS);
    assert.deepEqual(await store.counts('a'), { documents: 3, chunks: 3 });
    assert.deepEqual((await store.searchLexical('élève', 3, { collection: 'a' })).map((h) => h.chunk.docId), ['fr']);
    assert.equal((await store.searchDense(unit(2), 1, { collection: 'a' }))[0]?.chunk.docId, 'zh');
    await store.replaceBatch([DOCS[2]!]);
    assert.equal((await store.remove('a', 'fr'))?.docId, 'fr');
    assert.deepEqual(await store.counts(), { documents: 3, chunks: 3 });
  } finally {
    await store.close();
  }

  // A key with limits is counted through the same role (ragguard_key_usage is in --grant's rights): a
  // request counted, the next refused at its cap, tokens charged, and old windows deleted.
  const usage = new PostgresUsageStore(appUrl);
  try {
    const limits = new KeyLimits(usage, {}, (m) => assert.fail(m));
    const t = keyTenant({ name: 'lp', sha256: '', collections: '*', ratePerMinute: 1, tokensPerMinute: 1000, admin: false }, false);
    // Within one window of the database's clock (this machine's), so that the cap is not met in the next.
    const left = 60_000 - (Date.now() % 60_000);
    if (left < 5000) await new Promise((r) => setTimeout(r, left + 200));
    const first = await limits.admitRequest(t);
    assert.ok(first !== undefined && !(first instanceof HttpError), String(first));
    limits.chargeTokens(t, 7);
    await limits.settled('lp');
    const second = await limits.admitRequest(t);
    assert.ok(second instanceof HttpError && second.code === 'rate_limited', String(second));
    assert.deepEqual(await usage.usage('lp').then((u) => [u.requests, u.tokens]), [1, 7]);
  } finally {
    await usage.close();
  }
  const pruner = new pg.Client({ connectionString: appUrl });
  await pruner.connect();
  try {
    await pruner.query("DELETE FROM ragguard_key_usage WHERE window_start < clock_timestamp() - interval '1 hour'");
  } finally {
    await pruner.end();
  }
});

/** The old tokenizer (before Unicode terms): what a database made then holds. */
const oldTerms = (text: string) => text.toLowerCase().split(/[^a-z0-9]+/).filter((t) => t !== '' && !STOPWORDS.has(t));

test('a database made before migrations is brought forward at open and scores exactly as a new one', async () => {
  const oldUrl = await server.database();
  const c = new pg.Client({ connectionString: oldUrl });
  await c.connect();
  try {
    // The old schema and rows as the old code wrote them: terms without a collection, one global stats row.
    await MIGRATIONS[0]!.up(c, { dimension: D, hnswM: 16, hnswEfConstruction: 64 });
    let chunks = 0;
    let total = 0;
    for (const [seq, d] of DOCS.entries()) {
      const coll = d.doc.collection!;
      await c.query('INSERT INTO ragguard_documents (collection, doc_id, seq, title, bytes) VALUES ($1, $2, $3, $4, 1)', [coll, d.doc.docId, seq + 1, d.doc.title]);
      const terms = new Map<string, number>();
      for (const t of oldTerms(`${d.doc.title}\n${d.chunks[0]!.text}`)) terms.set(t, (terms.get(t) ?? 0) + 1);
      const { rows } = await c.query<{ id: string }>(
        'INSERT INTO ragguard_chunks (collection, doc_id, ord, text, tokens, nterms, embedding) VALUES ($1, $2, 0, $3, 1, $4, $5) RETURNING id',
        [coll, d.doc.docId, d.chunks[0]!.text, terms.size, pgvector.toSql(Array.from(d.vectors))]);
      for (const [term, tf] of terms) await c.query('INSERT INTO ragguard_terms (term, chunk_id, tf) VALUES ($1, $2, $3)', [term, rows[0]!.id, tf]);
      chunks += 1;
      total += terms.size;
    }
    await c.query('UPDATE ragguard_lexical_stats SET chunks = $1, total_terms = $2', [chunks, total]);
    await c.query("SELECT setval(pg_get_serial_sequence('ragguard_documents', 'seq'), 10)");
  } finally {
    await c.end();
  }
  const logged: string[] = [];
  const upgraded = await PostgresStore.open(oldUrl, D, { bm25: BM25, log: (m) => logged.push(m) });
  const fresh = await PostgresStore.open(await server.database(), D, { bm25: BM25, log: quiet });
  try {
    assert.match(logged.join('\n'), new RegExp(`from version 1 to ${SCHEMA_VERSION}`));
    await fresh.addBatch(DOCS);
    for (const collection of ['a', 'b']) {
      assert.deepEqual(await upgraded.counts(collection), await fresh.counts(collection), collection);
      for (const q of ['école élève', '学习', 'quotas', 'cron quotas job', 'disk user']) {
        const [u, f] = await Promise.all([upgraded, fresh].map((s) => s.searchLexical(q, 5, { collection })));
        assert.deepEqual(u!.map((h) => `${h.chunk.docId} ${h.score.toFixed(9)}`), f!.map((h) => `${h.chunk.docId} ${h.score.toFixed(9)}`), `${collection}: ${q}`);
      }
    }
    assert.deepEqual((await upgraded.searchLexical('学习', 5, { collection: 'a' })).map((h) => h.chunk.docId), ['zh'], 'the Chinese chunk has its terms now');
  } finally {
    await upgraded.close();
    await fresh.close();
  }
});
