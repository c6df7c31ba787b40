/**
 * A PostgreSQL server for the scale benches: the one at `givenUrl` (a role that may CREATE DATABASE), else
 * a throwaway one started by scripts/postgres.sh with `sharedBuffers` of shared buffers and `maxWalSize` of
 * max_wal_size (8GB: fewer checkpoints during a load; less where the disk is short), stopped and removed by
 * stop(). Each database() is a new database, dropped by stop().
 */
import { execFile } from 'node:child_process';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';

const ROOT = path.resolve(import.meta.dirname, '..');
const run = promisify(execFile);

export interface PgServer {
  url: string;
  database(): Promise<string>;
  stop(): Promise<void>;
}

export async function startPostgres(givenUrl: string | undefined, sharedBuffers: string, maxWalSize = '8GB'): Promise<PgServer> {
  let dir: string | undefined;
  let url = givenUrl;
  if (!url) {
    dir = await mkdtemp(path.join(tmpdir(), 'ragguard-bench-scale-pg-'));
    url = (await run('bash', [path.join(ROOT, 'scripts', 'postgres.sh'), 'start', dir], {
      cwd: ROOT, env: { ...process.env, POSTGRES_SH_SETTINGS: `-c shared_buffers=${sharedBuffers} -c max_wal_size=${maxWalSize}` },
    })).stdout.trim();
  }
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  const created: string[] = [];
  return {
    url,
    async database() {
      const name = `ragguard_scale_${Date.now()}`;
      await admin.query(`CREATE DATABASE ${name}`);
      created.push(name);
      const u = new URL(url!);
      u.pathname = `/${name}`;
      return u.toString();
    },
    async stop() {
      for (const name of created) await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).catch(() => undefined);
      await admin.end();
      if (dir) await run('bash', [path.join(ROOT, 'scripts', 'postgres.sh'), 'stop', dir], { cwd: ROOT });
    },
  };
}
