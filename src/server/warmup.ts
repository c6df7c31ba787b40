/**
 * One query through the whole server before it says it is ready (RAGGUARD_WARMUP): HTTP parsing,
 * express, validation, tokenizers, retrieval, prompt assembly, the engine and the reply are each run
 * once, so that their code is compiled and their lazy state built before the first real client.
 *
 * Why: a fresh server's first burst was slower than its second by about as much as every other cost
 * together (bench:overload's shape, one server, two bursts of 200: 503 queue_full p50 175 ms then 78 ms,
 * max 232 then 111 ms; the first /healthz probe 240 then 75 ms): V8 compiles a function on its first
 * call, and every request path's first calls fell into the burst's first turns. The query is a real
 * one (one new token), so it is in the request log and /metrics like any other; it is sent over
 * loopback to the server's own port with the request id `warmup`.
 */
import http from 'node:http';

export interface WarmUp {
  ms: number;
  /** The reply's status (200 expected); 0 when no reply came. */
  status: number;
  error?: string;
}

/** Sends the warm-up query to host:port; resolves (never rejects) with how it went. */
export function warmUp(host: string, port: number, apiKey = '', query = 'What is the sticky bit used for on /tmp?'): Promise<WarmUp> {
  const t0 = performance.now();
  const body = Buffer.from(JSON.stringify({ query, max_new_tokens: 1 }));
  const target = host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host;
  return new Promise((resolve) => {
    const req = http.request({
      host: target, port, method: 'POST', path: '/query', agent: false,
      headers: {
        'content-type': 'application/json', 'content-length': body.length, 'x-request-id': 'warmup',
        ...(apiKey ? { authorization: `Bearer ${apiKey}` } : {}),
      },
    }, (res) => {
      res.resume();
      res.on('end', () => resolve({ ms: Math.round(performance.now() - t0), status: res.statusCode ?? 0 }));
      res.on('error', (e) => resolve({ ms: Math.round(performance.now() - t0), status: res.statusCode ?? 0, error: e.message }));
    });
    req.on('error', (e) => resolve({ ms: Math.round(performance.now() - t0), status: 0, error: e.message }));
    req.end(body);
  });
}
