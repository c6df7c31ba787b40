/**
 * A real PgBouncer (Debian's `pgbouncer`, installed by npm run setup) in transaction pooling mode on a
 * free loopback port, in front of a test PostgreSQL (test/postgres.ts), for this test file; stopped when
 * it ends. Every database of the server is reachable through it by name.
 *
 * server_reset_query_always with DISCARD ALL: a server connection forgets every session setting when a
 * transaction hands it back, so a setting made with a session SET is gone by the next transaction
 * whichever connection that one gets (in plain transaction mode it would be kept on one server
 * connection and missing on the others: the same loss, but by chance).
 */
import { execFile, spawn } from 'node:child_process';
import { chmod, chown, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { freePort } from './helpers.js';

const run = promisify(execFile);

export interface TestPgBouncer {
  /** The URL of `database` through the pooler. */
  url(database: string): string;
  port: number;
  stop(): Promise<void>;
}

const BINARY = ['/usr/sbin/pgbouncer', '/usr/bin/pgbouncer'];

async function binary(): Promise<string> {
  for (const b of BINARY) {
    if (await run(b, ['--version']).then(() => true, () => false)) return b;
  }
  throw new Error('pgbouncer is not installed: run npm run setup (it installs Debian\'s pgbouncer), or apt-get install pgbouncer');
}

/** Whether a statement goes through `url` (tried up to 600 times, 100 ms apart: a daemon still starting, on a loaded machine). */
async function accepts(url: string): Promise<boolean> {
  for (let i = 0; i < 600; i++) {
    const c = new pg.Client({ connectionString: url });
    try {
      await c.connect();
      await c.query('SELECT 1');
      return true;
    } catch {
      await new Promise((r) => setTimeout(r, 100));
    } finally {
      await c.end().catch(() => undefined);
    }
  }
  return false;
}

/** Starts PgBouncer in front of the server at `serverUrl` (its host, port and user). */
export async function startPgBouncer(serverUrl: string, settings: Record<string, string | number> = {}): Promise<TestPgBouncer> {
  const bin = await binary();
  const server = new URL(serverUrl);
  const dir = await mkdtemp(path.join(tmpdir(), 'ragguard-pgbouncer-'));
  // PgBouncer refuses to run as root: as root it runs as `postgres` (the package's user), else as the
  // user scripts/postgres.sh runs the test server as, else nobody.
  const asRoot = process.getuid?.() === 0;
  let osUser = '';
  if (asRoot) {
    for (const candidate of ['postgres', 'ragguard-pg', 'nobody']) {
      const ids = await Promise.all([run('id', ['-u', candidate]), run('id', ['-g', candidate])]).catch(() => undefined);
      if (!ids) continue;
      osUser = candidate;
      await chown(dir, Number(ids[0].stdout.trim()), Number(ids[1].stdout.trim()));
      break;
    }
    if (!osUser) throw new Error('running as root, and no unprivileged user (postgres, ragguard-pg, nobody) to run pgbouncer as');
  }
  await chmod(dir, 0o755);
  const user = decodeURIComponent(server.username || 'postgres');
  await writeFile(path.join(dir, 'users.txt'), `"${user}" ""\n`, { mode: 0o644 });
  for (let attempt = 0; ; attempt++) {
    const port = await freePort();
    const conf = {
      listen_addr: '127.0.0.1', listen_port: port, unix_socket_dir: '', auth_type: 'trust', auth_file: path.join(dir, 'users.txt'),
      pool_mode: 'transaction', default_pool_size: 4, max_client_conn: 200, server_reset_query: 'DISCARD ALL', server_reset_query_always: 1,
      ignore_startup_parameters: 'extra_float_digits', logfile: path.join(dir, 'pgbouncer.log'), pidfile: path.join(dir, 'pgbouncer.pid'),
      ...settings,
    };
    await writeFile(path.join(dir, 'pgbouncer.ini'),
      `[databases]\n* = host=${server.hostname} port=${server.port || 5432}\n\n[pgbouncer]\n` +
      Object.entries(conf).map(([k, v]) => `${k} = ${v}`).join('\n') + '\n', { mode: 0o644 });
    const args = ['-d', path.join(dir, 'pgbouncer.ini')];
    const child = asRoot ? spawn('runuser', ['-u', osUser, '--', bin, ...args], { stdio: 'ignore' }) : spawn(bin, args, { stdio: 'ignore' });
    const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
    const url = (db: string) => `postgres://${encodeURIComponent(user)}@127.0.0.1:${port}/${db}`;
    // Daemonised: ready once it accepts a connection and passes a statement through.
    const ready = code === 0 && await accepts(url(server.pathname.slice(1) || 'postgres'));
    if (ready) {
      return {
        port,
        url,
        async stop() {
          const pid = Number((await readFile(path.join(dir, 'pgbouncer.pid'), 'utf8').catch(() => '')).trim());
          if (pid > 0) {
            try {
              process.kill(pid, 'SIGINT');
            } catch { /* gone already */ }
            for (let i = 0; i < 100; i++) {
              try {
                process.kill(pid, 0);
              } catch {
                break;
              }
              await new Promise((r) => setTimeout(r, 50));
            }
          }
          await rm(dir, { recursive: true, force: true });
        },
      };
    }
    const log = await readFile(path.join(dir, 'pgbouncer.log'), 'utf8').catch(() => '');
    if (attempt >= 4) throw new Error(`pgbouncer did not start (exit ${code}): ${log.slice(-2000)}`);
  }
}
