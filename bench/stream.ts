/**
 * Streaming latency: time to first token (TTFT) and inter-token latency (ITL), p50 and p95, at 1 and
 * 16 concurrent streams, next to the same requests not streamed (end-to-end latency), in one run.
 *
 * The real server (RagService + the express app) on loopback, an index of the shipped corpus in a
 * temporary directory; clients are fetch() calls in this process. Requests are POST /query (the
 * server's job: embed, search, rerank, prefill a ~450-token RAG prompt, decode) with the shipped
 * questions, greedy, max_new_tokens BENCH_NEW_TOKENS (default 32). Streamed: TTFT is from sending the
 * request to the first `token` event; ITL the gaps between a stream's successive `token` events (an
 * event carries the text a token makes final: a token inside a character or a held-back stop prefix
 * adds its time to the next gap). Not streamed: the reply's end-to-end latency. Each concurrency runs
 * BENCH_STREAM_REQUESTS requests (default 32) with that many in flight, a streamed pass and a
 * non-streamed one, BENCH_ROUNDS times (default 2; the order alternates, so that a machine whose speed
 * drifts favours neither; the percentiles pool every round's samples), on the same questions (and so the same greedy answers), with the prefix cache off
 * (RAGGUARD_PREFIX_CACHING=false): otherwise the second pass would find the first one's prompts cached
 * and look faster for it.
 *
 * Last line of stdout: JSON with ttft/itl/e2e p50 and p95 in milliseconds per concurrency, and the
 * machine's load average (1 min) before and after: on a shared machine it says how far to trust them.
 */
import type { AddressInfo } from 'node:net';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import { loadConfig } from '../src/config/config.js';
import { RagService } from '../src/service/rag.js';
import { createApp } from '../src/server/app.js';

const ROOT = path.resolve(import.meta.dirname, '..');
const REQUESTS = Number(process.env['BENCH_STREAM_REQUESTS'] ?? 32);
const NEW_TOKENS = Number(process.env['BENCH_NEW_TOKENS'] ?? 32);
const LEVELS = [1, 16];
const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 2);

const indexDir = await mkdtemp(path.join(tmpdir(), 'ragguard-bench-stream-'));
const cfg = loadConfig({ ...process.env, PORT: '0', RAGGUARD_INDEX_DIR: indexDir, RAGGUARD_MAX_CONCURRENT: '64', RAGGUARD_QUEUE_LENGTH: '256',
  RAGGUARD_PREFIX_CACHING: 'false' });
const service = await RagService.start(cfg);
const server = createApp(service).listen(0, '127.0.0.1');
await new Promise((r) => server.once('listening', r));
const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
const questions = (JSON.parse(await readFile(path.join(ROOT, 'data', 'questions.json'), 'utf8')) as { question: string }[]).map((q) => q.question);

interface StreamTiming {
  ttft: number;
  gaps: number[];
  e2e: number;
  tokens: number;
}

async function streamed(query: string): Promise<StreamTiming> {
  const t0 = performance.now();
  const res = await fetch(`${base}/query`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ query, max_new_tokens: NEW_TOKENS, stream: true }),
  });
  if (res.status !== 200) throw new Error(`status ${res.status}: ${await res.text()}`);
  const decoder = new TextDecoder();
  let buf = '';
  let last: number | undefined;
  let ttft = NaN;
  let tokens = 0;
  const gaps: number[] = [];
  for await (const chunk of res.body!) {
    buf += decoder.decode(chunk as Uint8Array, { stream: true });
    let end: number;
    while ((end = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, end);
      buf = buf.slice(end + 2);
      if (event.startsWith('event: token')) {
        const now = performance.now();
        if (last === undefined) ttft = now - t0;
        else gaps.push(now - last);
        last = now;
        tokens++;
      } else if (event.startsWith('event: error')) throw new Error(event);
    }
  }
  return { ttft, gaps, e2e: performance.now() - t0, tokens };
}

async function whole(query: string): Promise<{ e2e: number; tokens: number }> {
  const t0 = performance.now();
  const res = await fetch(`${base}/query`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ query, max_new_tokens: NEW_TOKENS }),
  });
  if (res.status !== 200) throw new Error(`status ${res.status}: ${await res.text()}`);
  const body = (await res.json()) as { usage: { completion_tokens: number } };
  return { e2e: performance.now() - t0, tokens: body.usage.completion_tokens };
}

/** Runs `n` requests with `concurrency` in flight. */
async function pool<T>(n: number, concurrency: number, run: (i: number) => Promise<T>): Promise<T[]> {
  const out: T[] = new Array(n);
  let next = 0;
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < n) {
      const i = next++;
      out[i] = await run(i);
    }
  }));
  return out;
}

const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)]!;
};
const r1 = (x: number) => Math.round(x * 10) / 10;

// Warm-up: the first runs of each shape are slower (allocations, caches).
await pool(4, 4, (i) => streamed(questions[i % questions.length]!));

const result: Record<string, number | string> = { requests_per_level: REQUESTS, rounds: ROUNDS, max_new_tokens: NEW_TOKENS, load_avg_before: loadavg()[0]! };
console.log(`POST /query, ${REQUESTS} requests per level and pass, ${ROUNDS} rounds, max_new_tokens ${NEW_TOKENS}, greedy; milliseconds`);
console.log('streams  ttft_p50  ttft_p95  itl_p50  itl_p95  stream_e2e_p50  whole_e2e_p50  whole_e2e_p95  tokens/s(whole)');
for (const c of LEVELS) {
  const s: StreamTiming[] = [];
  const w: { e2e: number; tokens: number }[] = [];
  let wholeSeconds = 0;
  const q = (i: number) => questions[(2 * i) % questions.length]!;
  for (let r = 0; r < ROUNDS; r++) {
    const streamPass = async () => s.push(...(await pool(REQUESTS, c, (i) => streamed(q(i)))));
    const wholePass = async () => {
      const t0 = performance.now();
      w.push(...(await pool(REQUESTS, c, (i) => whole(q(i)))));
      wholeSeconds += (performance.now() - t0) / 1000;
    };
    if (r % 2 === 0) {
      await streamPass();
      await wholePass();
    } else {
      await wholePass();
      await streamPass();
    }
  }
  const tokens = w.reduce((a, x) => a + x.tokens, 0);
  const ttft = s.map((x) => x.ttft);
  const itl = s.flatMap((x) => x.gaps);
  const row = {
    ttft_p50: pct(ttft, 50), ttft_p95: pct(ttft, 95), itl_p50: pct(itl, 50), itl_p95: pct(itl, 95),
    stream_e2e_p50: pct(s.map((x) => x.e2e), 50), whole_e2e_p50: pct(w.map((x) => x.e2e), 50), whole_e2e_p95: pct(w.map((x) => x.e2e), 95),
  };
  // Generated tokens of the non-streamed pass over its wall time.
  const rate = tokens / wholeSeconds;
  console.log(`${String(c).padStart(7)}  ${Object.values(row).map((v) => r1(v).toFixed(1).padStart(8)).join('  ')}  ${rate.toFixed(1).padStart(8)}`);
  for (const [k, v] of Object.entries(row)) result[`${k}_at_${c}`] = r1(v);
  result[`whole_tokens_per_s_at_${c}`] = r1(rate);
}

result['load_avg_after'] = loadavg()[0]!;
server.closeAllConnections();
await new Promise((r) => server.close(r));
await rm(indexDir, { recursive: true, force: true });
console.log(JSON.stringify(result));
process.exit(0);
