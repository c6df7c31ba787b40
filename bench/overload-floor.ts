/**
 * The floor under bench:overload's figures: the same client (bench/burst-client.ts: a burst of
 * BENCH_OVERLOAD_BURST requests sent at once, one connection each, while GET /healthz is probed one
 * request after the other, 10 ms apart) against a trivial Node HTTP server in its own process that
 * answers every POST with 503 and every GET with 200, at once. What is left is Node's own cost of a
 * burst on this machine: the client making 200 requests in one turn, the server reading one
 * connection per turn of its event loop (libuv >= 1.45), both processes on the same cores. Three
 * bursts against one fresh server (the first pays for compiling both sides' code).
 *
 * Each time two ways (burst-client.ts): `ms` from the request written to its socket (bench:overload's
 * figure since 2026-12-04), `callMs` from the call that made it (the figure before; the floor's p50
 * of 45-105 ms on 2026-12-03 was this one). Also the client's own event-loop delay over the burst
 * (its largest stall: a reply's callback waits that long). Last line: JSON.
 */
import { spawn } from 'node:child_process';
import os from 'node:os';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { r1, send, summary } from './burst-client.js';

const BURST = Number(process.env['BENCH_OVERLOAD_BURST'] ?? 200);
const ROUNDS = 3;
const SERVER = `
const http = require('node:http');
const s = http.createServer((req, res) => {
  req.resume();
  if (req.method === 'GET') res.writeHead(200, { 'content-type': 'application/json' }).end('{"status":"ok"}');
  else res.writeHead(503, { 'content-type': 'application/json', 'retry-after': '1' }).end('{"error":{"code":"queue_full","message":"full"}}');
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
  const query = (i: number) => ({ query: `What is the sticky bit used for on /tmp? (${i})`, max_new_tokens: 16 });
  const rounds = [];
  for (let round = 0; round < ROUNDS; round++) {
    const lag = monitorEventLoopDelay({ resolution: 1 });
    lag.enable();
    const probes: { ms: number; callMs: number }[] = [];
    let done = false;
    const prober = (async () => {
      while (!done) {
        probes.push(await send(port, 'GET', '/healthz'));
        await new Promise((res) => setTimeout(res, 10));
      }
    })();
    const replies = await Promise.all(Array.from({ length: BURST }, (_, i) => send(port, 'POST', '/query', query(i))));
    done = true;
    await prober;
    lag.disable();
    const r = {
      round,
      queue_full_ms: summary(replies.map((x) => x.ms)),
      queue_full_ms_from_call: summary(replies.map((x) => x.callMs)),
      healthz_ms: summary(probes.map((x) => x.ms)),
      healthz_ms_from_call: summary(probes.map((x) => x.callMs)),
      client_loop_delay_max_ms: r1(lag.max / 1e6),
    };
    console.log(`burst ${round + 1} of ${BURST} against a server that sheds everything at once (ms): ` +
      `send -> 503 p50 ${r.queue_full_ms.p50}, max ${r.queue_full_ms.max} (from the call: p50 ${r.queue_full_ms_from_call.p50}, max ${r.queue_full_ms_from_call.max}); ` +
      `/healthz p99 ${r.healthz_ms.p99}, max ${r.healthz_ms.max} (${r.healthz_ms.n} probes); client loop's largest delay ${r.client_loop_delay_max_ms}`);
    rounds.push(r);
    await new Promise((res) => setTimeout(res, 300));
  }
  console.log(JSON.stringify({ bench: 'overload-floor', timing: 'from_write', cpu: os.cpus()[0]?.model, cores: os.cpus().length, burst: BURST, loadavg: os.loadavg().map(r1), rounds }));
} finally {
  server.kill('SIGKILL');
}
