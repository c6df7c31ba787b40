/**
 * The HTTP client of bench:overload and bench:overload-floor: one request per connection (keep-alive
 * off, as a burst of independent clients sends them), each timed two ways.
 *
 *   ms        from the moment the request's bytes were handed to its socket (its 'finish': the
 *             connection is established, on loopback by the kernel whether or not the server has
 *             accepted it yet, and the request written) to its status line. The time a connection
 *             waits in the server's accept queue counts; the client's own queue before the write
 *             does not.
 *   callMs    from the call that made the request to its status line (the figure's definition until
 *             2026-12-04). A burst makes all its requests in one turn of the client's event loop,
 *             and none is written before that turn ends and the client has processed each one's
 *             connect: that wait, in the client process, is part of this figure. Measured against a
 *             trivial server (bench:overload-floor) it was most of it.
 * Both end when the client's event loop runs the reply's status-line callback, so a client process
 * busy with other replies delays both alike.
 */
import http from 'node:http';

export interface Reply {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
  /** Request written to its socket -> status line (ms). */
  ms: number;
  /** Request made -> status line (ms): `ms` plus the client's own wait before the write. */
  callMs: number;
}

const agent = new http.Agent({ keepAlive: false, maxSockets: Infinity });

/** One request; resolves with its reply, or rejects on a socket error. `hangUpAfter` (ms) destroys it then. */
export function send(port: number, method: string, route: string, body?: unknown, hangUpAfter?: number): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const t0 = performance.now();
    let written: number | undefined;
    const req = http.request({
      host: '127.0.0.1', port, method, path: route, agent,
      headers: data ? { 'content-type': 'application/json', 'content-length': data.length } : {},
    }, (res) => {
      const t = performance.now(); // the reply's status line: what a client waits for
      // A reply before the request was all written (a server answering early): from the call.
      const ms = t - (written ?? t0);
      const callMs = t - t0;
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString(), ms, callMs }));
      res.on('error', reject);
    });
    // Emitted once the last of the request is handed to the socket (after its connect).
    req.on('finish', () => (written = performance.now()));
    req.on('error', reject);
    if (hangUpAfter !== undefined) setTimeout(() => req.destroy(new Error('hung up')), hangUpAfter);
    req.end(data);
  });
}

function quantile(xs: number[], q: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)]!;
}
export const r1 = (x: number) => Math.round(x * 10) / 10;
export const summary = (xs: number[]) => ({ n: xs.length, p50: r1(quantile(xs, 0.5)), p99: r1(quantile(xs, 0.99)), max: r1(Math.max(...xs)) });
