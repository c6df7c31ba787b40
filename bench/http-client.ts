/**
 * The benches' HTTP side: a POST whose event-stream reply is parsed as it comes (time to the first token,
 * every event), a GET of JSON, `c` clients in a closed loop, and a free loopback port for a server to start on.
 */
import http from 'node:http';
import { createServer } from 'node:net';

const agent = new http.Agent({ keepAlive: false, maxSockets: Infinity });

export interface SseEvent { event: string; data: string }
export interface StreamReply {
  status: number;
  /** Request made -> end of the reply (ms). */
  ms: number;
  /** Request made -> first token event (ms); null without one. */
  ttftMs: number | null;
  events: SseEvent[];
  /** The body of a reply that is not an event stream (an error, or a non-streamed answer). */
  body: string;
  error?: string;
}

/** POSTs `body` as JSON; an event-stream reply is parsed as it comes, `isToken` marking the first token. */
export function post(port: number, route: string, body: unknown, isToken: (e: SseEvent) => boolean, timeoutMs: number): Promise<StreamReply> {
  return new Promise((resolve) => {
    const data = Buffer.from(JSON.stringify(body));
    const t0 = performance.now();
    let ttft: number | null = null;
    const events: SseEvent[] = [];
    let raw = '';
    let status = 0;
    let done = false;
    const finish = (error?: string) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      resolve({ status, ms: performance.now() - t0, ttftMs: ttft, events, body: raw, ...(error ? { error } : {}) });
    };
    const req = http.request({
      host: '127.0.0.1', port, method: 'POST', path: route, agent,
      headers: { 'content-type': 'application/json', 'content-length': data.length },
    }, (res) => {
      status = res.statusCode ?? 0;
      const sse = String(res.headers['content-type'] ?? '').includes('text/event-stream');
      let buf = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => {
        if (!sse) {
          raw += c;
          return;
        }
        buf += c.replace(/\r/g, '');
        for (let k = buf.indexOf('\n\n'); k >= 0; k = buf.indexOf('\n\n')) {
          const block = buf.slice(0, k);
          buf = buf.slice(k + 2);
          let event = 'message';
          const lines: string[] = [];
          for (const line of block.split('\n')) {
            if (line.startsWith('event:')) event = line.slice(6).trim();
            else if (line.startsWith('data:')) lines.push(line.slice(5).replace(/^ /, ''));
          }
          if (lines.length === 0) continue;
          const e = { event, data: lines.join('\n') };
          if (ttft === null && isToken(e)) ttft = performance.now() - t0;
          events.push(e);
        }
      });
      res.on('end', () => finish());
      res.on('error', (e) => finish(e.message));
    });
    const timer = setTimeout(() => {
      req.destroy(new Error('timeout'));
      finish(`timeout after ${timeoutMs} ms`);
    }, timeoutMs);
    req.on('error', (e) => finish(e.message));
    req.end(data);
  });
}

export async function getJson<T>(port: number, route: string): Promise<T> {
  const r = await fetch(`http://127.0.0.1:${port}${route}`, { signal: AbortSignal.timeout(10_000) });
  return (await r.json()) as T;
}

/** `c` clients in a closed loop over requests 0..n-1. */
export async function closedLoop<T>(n: number, c: number, fn: (i: number) => Promise<T>): Promise<{ results: T[]; seconds: number }> {
  const results = new Array<T>(n);
  let next = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: Math.min(c, n) }, async () => {
    while (next < n) {
      const i = next++;
      results[i] = await fn(i);
    }
  }));
  return { results, seconds: (performance.now() - t0) / 1000 };
}

/** A port free on loopback now (the OS's pick), for a server a bench starts. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
    s.on('error', reject);
  });
}
