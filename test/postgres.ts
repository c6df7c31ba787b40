/**
 * A real PostgreSQL (with pgvector) for the Postgres store's tests: RAGGUARD_TEST_PG_URL when set (a
 * server the caller runs; its role must be allowed CREATE DATABASE), else one started by
 * scripts/postgres.sh on loopback for this test file and stopped when it ends. Each call of database()
 * gives a new, empty database on it (dropped at the end), so tests never see each other's rows.
 * Never skipped: without a server the tests fail, saying how to get one.
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { ROOT } from './helpers.js';

const run = promisify(execFile);

export interface TestPostgres {
  /** The server's URL (its maintenance database). */
  url: string;
  /** A new empty database's URL. */
  database(): Promise<string>;
  stop(): Promise<void>;
}

function withDatabase(url: string, db: string): string {
  const u = new URL(url);
  u.pathname = `/${db}`;
  return u.toString();
}

export async function startTestPostgres(): Promise<TestPostgres> {
  const given = process.env['RAGGUARD_TEST_PG_URL'];
  let url: string;
  let dir: string | undefined;
  if (given) {
    url = given;
  } else {
    dir = await mkdtemp(path.join(tmpdir(), 'ragguard-pg-test-'));
    try {
      url = (await run('bash', [path.join(ROOT, 'scripts', 'postgres.sh'), 'start', dir], { cwd: ROOT })).stdout.trim();
    } catch (e) {
      throw new Error(`could not start PostgreSQL (run npm run setup, or set RAGGUARD_TEST_PG_URL): ${(e as { stderr?: string }).stderr ?? (e as Error).message}`);
    }
  }
  const created: string[] = [];
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  return {
    url,
    async database() {
      const name = `ragguard_test_${randomBytes(6).toString('hex')}`;
      await admin.query(`CREATE DATABASE ${name}`);
      created.push(name);
      return withDatabase(url, name);
    },
    async stop() {
      if (dir) {
        await admin.end().catch(() => undefined);
        await run('bash', [path.join(ROOT, 'scripts', 'postgres.sh'), 'stop', dir], { cwd: ROOT });
        return;
      }
      for (const name of created) await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).catch(() => undefined);
      await admin.end();
    },
  };
}
