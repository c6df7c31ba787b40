/**
 * The server as its own process, as `npm start` runs it (`scripts/tuned.sh node --import tsx
 * src/cli/serve.ts`, on a free port), for the benches that load it from outside (soak, overload). It
 * resolves once the server logs "ready on http://...:<port>" (the corpus ingested); its stderr's last 20 kB
 * are kept for the error when it exits first.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream } from 'node:fs';
import path from 'node:path';

const ROOT = path.resolve(import.meta.dirname, '..');

export interface ServerProcess {
  proc: ChildProcess;
  /** The server's own pid (tuned.sh execs node). */
  pid: number;
  port: number;
  /** Seconds from the spawn to "ready". */
  startS: number;
  /** The last 20 kB of its stderr. */
  log: () => string;
  /** SIGTERM (waiting up to 30 s for its exit, so that profiles are written) when `graceful`, then SIGKILL. */
  stop: (graceful?: boolean) => Promise<void>;
}

export async function startServerProcess(env: Record<string, string>, opts: { nodeFlags?: string[]; outFile?: string } = {}): Promise<ServerProcess> {
  const t0 = performance.now();
  const proc = spawn('sh', ['scripts/tuned.sh', process.execPath, ...(opts.nodeFlags ?? []), '--import', 'tsx', 'src/cli/serve.ts'], {
    cwd: ROOT,
    // Info level: the server says where it listens in an info line.
    env: { ...process.env, PORT: '0', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  proc.stderr!.on('data', (c: Buffer) => (stderr = (stderr + c.toString()).slice(-20000)));
  if (opts.outFile) {
    const out = createWriteStream(opts.outFile);
    proc.stdout!.pipe(out);
    proc.stderr!.pipe(out);
  }
  const stop = async (graceful = false) => {
    if (proc.exitCode === null && graceful) {
      const exited = new Promise((res) => proc.once('exit', res));
      proc.kill('SIGTERM');
      await Promise.race([exited, new Promise((res) => setTimeout(res, 30_000))]);
    }
    if (proc.exitCode === null) proc.kill('SIGKILL');
  };
  try {
    const port = await new Promise<number>((resolve, reject) => {
      let out = '';
      const look = (c: Buffer) => {
        out += c.toString();
        const m = /ready on http:\/\/[^:]+:(\d+)/.exec(out);
        if (!m) return;
        proc.stdout!.off('data', look);
        if (!opts.outFile) proc.stdout!.resume(); // the request log from here on is not read
        resolve(Number(m[1]));
      };
      proc.stdout!.on('data', look);
      proc.on('exit', (code) => reject(new Error(`server exited (${code}) before it was ready:\n${stderr}`)));
    });
    return { proc, pid: proc.pid!, port, startS: (performance.now() - t0) / 1000, log: () => stderr, stop };
  } catch (e) {
    await stop();
    throw e;
  }
}
