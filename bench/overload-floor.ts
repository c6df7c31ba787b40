/**
 * The floor under bench:overload's `send -> 503 queue_full` figure: the same client code (a burst of
 * BENCH_OVERLOAD_BURST requests sent at once, keep-alive off, time from each request's creation to its
 * status line) against a trivial Node HTTP server in its own process that answers every POST with 503
 * at once. What is left is Node's own cost of a burst on this machine: the client making 200 requests
 * in one turn, the server reading one connection per turn of its event loop (libuv >= 1.45), both
 * processes on the same cores. Three bursts against one fresh server (the first pays for compiling
 * both sides' code). Last line: JSON.
 */
import { spawn } from 'node:child_process';
import http from 'node:http';
import os from 'node:os';

const BURST = Number(process.env['BENCH_OVERLOAD_BURST'] ?? 200);
const ROUNDS = 3;
const SERVER = `
const http = require('node:http');
const s = http.createServer((req, res) => {
  req.resume();
  res.writeHead(503, { 'content-type': 'application/json', 'retry-after': '1' }).end('{"error":{"code":"queue_full","message":"full"}}');
});
s.listen(0, '127.0.0.1', () => console.log('port ' + s.address().port));
`;

const server = spawn(process.execPath, ['-e', SERVER], { stdio: ['ignore', 'pipe', 'inherit'] });
try {
  const port = await new Promise<number>((resolve, reject) => {
    server.stdout.on('data', (c: Buffer) => {
      const m = /port (\d+)/.exec(c.toString());
      if (m) resolve(Number(m[1]));
    });
    server.on('exit', (code) => reject(new Error(`server exited (${code})`)));
  });
  const agent = new http.Agent({ keepAlive: false, maxSockets: Infinity });
  // As bench/overload.ts sends a query: t0 before the request is made, the time at its status line.
  const send = (i: number) => new Promise<number>((resolve, reject) => {
    const data = Buffer.from(JSON.stringify({ query: `What is the sticky bit used for on /tmp? (${i})`, max_new_tokens: 16 }));
    const t0 = performance.now();
    const req = http.request({
      host: '127.0.0.1', port, method: 'POST', path: '/query', agent,
      headers: { 'content-type': 'application/json', 'content-length': data.length },
    }, (res) => {
      const ms = performance.now() - t0;
      res.resume();
      res.on('end', () => resolve(ms));
    });
    req.on('error', reject);
    req.end(data);
  });
  const r1 = (x: number) => Math.round(x * 10) / 10;
  const rounds = [];
  for (let round = 0; round < ROUNDS; round++) {
    const ms = (await Promise.all(Array.from({ length: BURST }, (_, i) => send(i)))).sort((a, b) => a - b);
    const q = (p: number) => ms[Math.min(ms.length - 1, Math.ceil(p * ms.length) - 1)]!;
    const r = { round, p50: r1(q(0.5)), p99: r1(q(0.99)), max: r1(ms[ms.length - 1]!) };
    console.log(`burst ${round + 1} of ${BURST} against a server that sheds everything at once: send -> 503 (ms) p50 ${r.p50}, p99 ${r.p99}, max ${r.max}`);
    rounds.push(r);
    await new Promise((res) => setTimeout(res, 300));
  }
  console.log(JSON.stringify({ bench: 'overload-floor', cpu: os.cpus()[0]?.model, cores: os.cpus().length, burst: BURST, loadavg: os.loadavg().map(r1), rounds }));
} finally {
  server.kill('SIGKILL');
}
