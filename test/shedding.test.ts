/**
 * Load shedding: a query that finds every slot and queue place taken is answered 503 queue_full
 * from the counts alone, at once. Its body is not parsed, nothing of it is tokenized or embedded,
 * and its reply is written in the event-loop turn in which the request arrived: in a burst every
 * further turn is spent behind the admitted queries' model work, and that, not the decision, is what
 * made shed clients wait. The queries already let in still get their answers.
 *
 * No clocks: progress is held still by holding the run gate (no model runs while the test holds it),
 * and "at once" is asserted as "before the next turn of the event loop", not in milliseconds.
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { Writable } from 'node:stream';
import { after, before, test } from 'node:test';
import { loadModels, RagService } from '../src/service/rag.js';
import { createApp } from '../src/server/app.js';
import { createLogger } from '../src/server/logging.js';
import { Lifecycle } from '../src/server/shutdown.js';
import { holdRuns, smallCorpus, sseEvents, tempDir, testConfig, turn, faiss } from './helpers.js';


interface Reply {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
}

let server: http.Server;
let port: number;
let service: RagService;
/** Calls into the embedder's tokenizer and model since the test began counting. */
const calls = { inputIds: 0, embed: 0 };
/** For each request as it arrived: whether a turn of the event loop had passed when its status line was written. */
const turnBeforeReply = new Map<string, boolean>();
/** A log destination that parses each JSON line into `into`. */
function lineSink(into: Record<string, unknown>[]): Writable {
  return new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const l of chunk.toString('utf8').split('\n')) if (l.trim()) into.push(JSON.parse(l) as Record<string, unknown>);
      done();
    },
  });
}

/** The server's log lines. */
const lines: Record<string, unknown>[] = [];
const sink = lineSink(lines);

before(async () => {
  // One running, one waiting: a third query is shed.
  const cfg = testConfig({
    RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(3),
    RAGGUARD_MAX_CONCURRENT: '1', RAGGUARD_QUEUE_LENGTH: '1',
  });
  service = await RagService.start(cfg, await loadModels(cfg));
  const { embedder } = service.models;
  const inputIds = embedder.inputIds.bind(embedder);
  const embed = embedder.embed.bind(embedder);
  embedder.inputIds = (text) => (calls.inputIds++, inputIds(text));
  embedder.embed = (texts, batch) => (calls.embed++, embed(texts, batch));
  server = http.createServer();
  // Ahead of the app: note the turn each request arrives in, and whether it had ended by the reply.
  server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => {
    const id = String(req.headers['x-request-id']);
    let passed = false;
    setImmediate(() => (passed = true));
    const writeHead = res.writeHead.bind(res) as (...a: unknown[]) => http.ServerResponse;
    res.writeHead = ((...a: unknown[]) => (turnBeforeReply.set(id, passed), writeHead(...a))) as typeof res.writeHead;
  });
  server.on('request', createApp(service, { logger: createLogger('info', sink) }));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  port = (server.address() as AddressInfo).port;
});

after(() => {
  server.closeAllConnections();
  server.close();
});

function send(id: string, method: string, route: string, body?: string, headers: Record<string, string> = {}, to = port): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : Buffer.from(body);
    const req = http.request({
      host: '127.0.0.1', port: to, method, path: route, agent: false,
      headers: { 'x-request-id': id, ...headers, ...(data ? { 'content-type': 'application/json', 'content-length': data.length } : {}) },
    }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString() }));
    });
    req.on('error', reject);
    req.end(data);
  });
}

const health = async () => JSON.parse((await send(`h${Math.random()}`, 'GET', '/healthz')).body) as { queue: { running: number; waiting: number } };

test('start-up leaves the BM25 index level with the corpus it ingested: the first query does not build it', () => {
  assert.ok(faiss(service).chunkCount > 0);
  assert.ok(faiss(service).lexicalReady, 'built at start-up');
  assert.equal(faiss(service).lexicalIndex().size, faiss(service).chunkCount);
});

test('a full server answers a query 503 queue_full in the turn it arrives, without parsing, tokenizing or embedding it; the queries let in still get their answers', async () => {
  const release = await holdRuns();
  const query = JSON.stringify({ query: 'How do I set disk quotas for a user?', max_new_tokens: 4 });
  let admitted: Promise<Reply[]>;
  try {
    admitted = Promise.all([send('run', 'POST', '/query', query), send('wait', 'POST', '/query', query)]);
    // Until the one runs (held at its embedding, behind the gate) and the other waits for its slot.
    for (let h = await health(); h.queue.running + h.queue.waiting < 2; h = await health()) await turn();
    const before = { ...calls };

    // Not even valid JSON: parsed, it would be a 400. Shed, it is never read.
    const shed = await send('shed', 'POST', '/query', '{"query": "never parsed", ');
    assert.equal(shed.status, 503, shed.body);
    const body = JSON.parse(shed.body) as { error: { code: string; message: string } };
    assert.equal(body.error.code, 'queue_full');
    assert.ok(body.error.message.length > 0);
    assert.ok(Number(shed.headers['retry-after']) >= 1, 'with Retry-After');
    assert.equal(turnBeforeReply.get('shed'), false, 'its 503 written before the event loop turned');
    // A valid one is shed the same way: nothing of it tokenized or embedded.
    const shed2 = await send('shed2', 'POST', '/query', query);
    assert.equal(shed2.status, 503);
    assert.equal((JSON.parse(shed2.body) as { error: { code: string } }).error.code, 'queue_full');
    assert.equal(turnBeforeReply.get('shed2'), false);
    assert.deepEqual(calls, before, 'the embedder neither tokenized nor embedded anything for the shed queries');
    // Each logged as one line at warn with its code: a deliberate answer, not a bug (no stack).
    for (const id of ['shed', 'shed2']) {
      const mine = lines.filter((l) => l['req_id'] === id);
      assert.equal(mine.length, 1, id);
      assert.equal(mine[0]!['level'], 40);
      assert.equal(mine[0]!['status'], 503);
      assert.equal((mine[0]!['error'] as { code: string }).code, 'queue_full');
      assert.equal(mine[0]!['err'], undefined);
      assert.ok(!JSON.stringify(mine[0]).includes('    at '), 'no stack');
    }

    // Probes are answered while full, also in the turn they arrive.
    const ready = await send('ready', 'GET', '/readyz');
    assert.equal(ready.status, 200);
    assert.equal(turnBeforeReply.get('ready'), false);
  } finally {
    release();
  }
  for (const r of await admitted) {
    assert.equal(r.status, 200, r.body);
    assert.equal(typeof (JSON.parse(r.body) as { answer: unknown }).answer, 'string');
  }
  assert.deepEqual((await health()).queue, { running: 0, waiting: 0 });
});

test('shed queries and probes answered ahead of express keep what express gives them: keys checked first, CORS headers, request id, log line, metrics; draining refuses as before', async () => {
  // A second app over the same store and models with a key and CORS: its own admission (one running, one waiting).
  const keyed = new RagService({ ...service.cfg, apiKey: 'sekrit', corsOrigins: ['https://app.example'] }, service.models, service.store);
  const lifecycle = new Lifecycle();
  const own: Record<string, unknown>[] = [];
  const sink2 = lineSink(own);
  const srv = http.createServer(createApp(keyed, { logger: createLogger('info', sink2), lifecycle }));
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const to = (srv.address() as AddressInfo).port;
  const key = { authorization: 'Bearer sekrit' };
  const query = JSON.stringify({ query: 'Which daemon collects system log messages?', max_new_tokens: 2 });
  const release = await holdRuns();
  let admitted: Promise<Reply[]> | undefined;
  try {
    admitted = Promise.all([send('k-run', 'POST', '/query', query, key, to), send('k-wait', 'POST', '/query', query, key, to)]);
    const queue = async () => (JSON.parse((await send(`kh${Math.random()}`, 'GET', '/healthz', undefined, {}, to)).body) as { queue: { running: number; waiting: number } }).queue;
    for (let q = await queue(); q.running + q.waiting < 2; q = await queue()) await turn();

    // Full, but a query without a key, or with a wrong one, is refused for that first.
    const nokey = await send('k-nokey', 'POST', '/query', query, {}, to);
    assert.equal(nokey.status, 401, nokey.body);
    assert.equal((JSON.parse(nokey.body) as { error: { code: string } }).error.code, 'unauthorized');
    assert.match(String(nokey.headers['www-authenticate']), /Bearer/);
    const wrong = await send('k-wrong', 'POST', '/query', query, { authorization: 'Bearer nope' }, to);
    assert.equal((JSON.parse(wrong.body) as { error: { code: string } }).error.code, 'invalid_api_key');

    // With the key: shed, with the CORS headers of an allowed origin and the client's request id.
    const shed = await send('k-shed', 'POST', '/query', query, { ...key, origin: 'https://app.example' }, to);
    assert.equal(shed.status, 503, shed.body);
    assert.equal((JSON.parse(shed.body) as { error: { code: string } }).error.code, 'queue_full');
    assert.equal(shed.headers['access-control-allow-origin'], 'https://app.example');
    assert.match(String(shed.headers['vary']), /Origin/);
    assert.equal(shed.headers['x-request-id'], 'k-shed');
    assert.match(String(shed.headers['content-type']), /^application\/json/);
    assert.ok(Number(shed.headers['retry-after']) >= 1);
    const line = own.filter((l) => l['req_id'] === 'k-shed');
    assert.equal(line.length, 1);
    assert.deepEqual([line[0]!['level'], line[0]!['route'], line[0]!['status'], (line[0]!['error'] as { code: string }).code], [40, '/query', 503, 'queue_full']);
    // An origin not allowed gets no allow header.
    const other = await send('k-other', 'POST', '/query', query, { ...key, origin: 'https://evil.example' }, to);
    assert.equal(other.status, 503);
    assert.equal(other.headers['access-control-allow-origin'], undefined);

    // Probes: HEAD has the GET's headers and no body; a query string changes nothing.
    const head = await send('k-head', 'HEAD', '/healthz', undefined, {}, to);
    assert.equal(head.status, 200);
    assert.equal(head.body, '');
    assert.ok(Number(head.headers['content-length']) > 0);
    const got = await send('k-get', 'GET', '/healthz?verbose=1', undefined, {}, to);
    assert.equal((JSON.parse(got.body) as { status: string }).status, 'ok');
    assert.equal(got.headers['x-request-id'], 'k-get');

    // Counted in /metrics under the route, as express-answered requests are.
    const metrics = (await send('k-metrics', 'GET', '/metrics', undefined, key, to)).body;
    assert.match(metrics, /ragguard:http_requests_total\{[^}]*route="\/query"[^}]*status="503"[^}]*\} 2/);
    assert.match(metrics, /ragguard:http_requests_total\{[^}]*route="\/healthz"[^}]*status="200"/);

    // Draining: a new query is refused 503 shutting_down (not queue_full), the probe still answers.
    const drained = lifecycle.drain(600_000);
    const late = await send('k-late', 'POST', '/query', query, key, to);
    assert.equal((JSON.parse(late.body) as { error: { code: string } }).error.code, 'shutting_down');
    assert.equal((await send('k-probe', 'GET', '/healthz', undefined, {}, to)).status, 200);
    release();
    for (const r of await admitted) assert.equal(r.status, 200, r.body);
    assert.equal((await drained).dropped, 0);
  } finally {
    release();
    srv.closeAllConnections();
    srv.close();
  }
});

test('a query let in at the front door reaches express on a later turn: a drain begun meanwhile lets it finish, a client gone meanwhile frees its place and is logged', async () => {
  const lifecycle = new Lifecycle();
  const own: Record<string, unknown>[] = [];
  const sink2 = lineSink(own);
  const srv = http.createServer();
  srv.on('request', createApp(service, { logger: createLogger('info', sink2), lifecycle }));
  // After the app's handler, in the same turn: the front door has let the query in, express has not seen it.
  let meanwhile: ((req: http.IncomingMessage) => void) | undefined;
  srv.on('request', (req: http.IncomingMessage) => meanwhile?.(req));
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const to = (srv.address() as AddressInfo).port;
  const query = JSON.stringify({ query: 'Where does apt keep its list of package sources?', max_new_tokens: 2 });
  try {
    // The client leaves before the query's turn: nothing runs, its place is free again, one log line says so.
    meanwhile = (req) => req.socket.destroy();
    await assert.rejects(send('gone', 'POST', '/query', query, {}, to));
    meanwhile = undefined;
    for (let i = 0; i < 3; i++) await turn();
    const gone = own.filter((l) => l['req_id'] === 'gone');
    assert.equal(gone.length, 1);
    assert.deepEqual([gone[0]!['route'], gone[0]!['aborted']], ['/query', true]);
    assert.equal(lifecycle.inFlight, 0);
    // Its ticket came back: with one slot and one queue place, two held queries are let in, a third shed.
    const release = await holdRuns();
    let two: Promise<Reply[]>;
    try {
      let answered = false; // a reply while runs are held can only be a 503: a place was missing
      two = Promise.all([send('g1', 'POST', '/query', query, {}, to), send('g2', 'POST', '/query', query, {}, to)]);
      void two.finally(() => (answered = true));
      const queue = async () => (JSON.parse((await send(`gh${Math.random()}`, 'GET', '/healthz', undefined, {}, to)).body) as { queue: { running: number; waiting: number } }).queue;
      for (let q = await queue(); q.running + q.waiting < 2 && !answered; q = await queue()) await turn();
      assert.equal((await send('g3', 'POST', '/query', query, {}, to)).status, 503);
    } finally {
      release();
    }
    for (const r of await two) assert.equal(r.status, 200, r.body);

    // A drain that begins before the query reaches express: it was let in, so it is served, not refused.
    let drained: Promise<{ dropped: number; finished: number; refused: number }> | undefined;
    meanwhile = () => void (drained ??= lifecycle.drain(600_000));
    const served = await send('in', 'POST', '/query', query, {}, to);
    assert.equal(served.status, 200, served.body);
    const report = await drained!;
    assert.deepEqual([report.finished, report.dropped, report.refused], [1, 0, 0]);
  } finally {
    srv.closeAllConnections();
    srv.close();
  }
});

test('with 2 running and 4 waiting places, 6 streamed queries are let in like 6 plain ones and a 7th is shed: a stream hands its admission ticket over when it runs', async () => {
  // A second app over the same store and models, with its own admission: two run, four wait. The queue's
  // wait is long (an hour): what is measured is places, not time.
  const small = new RagService({ ...service.cfg, maxConcurrentQueries: 2, maxQueueLength: 4, queueTimeoutMs: 3_600_000 }, service.models, service.store);
  const srv = http.createServer(createApp(small, { logger: createLogger('error', lineSink([])) }));
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const to = (srv.address() as AddressInfo).port;
  const queue = async () => (JSON.parse((await send(`sq${Math.random()}`, 'GET', '/healthz', undefined, {}, to)).body) as { queue: { running: number; waiting: number } }).queue;
  try {
    for (const stream of [false, true]) {
      const query = JSON.stringify({ query: 'How do I set disk quotas for a user?', max_new_tokens: 2, stream });
      const release = await holdRuns();
      const sent: Promise<Reply>[] = [];
      let shed: Reply | undefined;
      let full: { running: number; waiting: number } | undefined;
      try {
        let answered = false; // a reply while runs are held can only be a 503: a place was missing
        // One after another, each counted as running or waiting before the next is sent.
        for (let i = 1; i <= 6 && !answered; i++) {
          const r = send(`${stream ? 's' : 'p'}${i}`, 'POST', '/query', query, {}, to);
          void r.finally(() => (answered = true));
          sent.push(r);
          for (let q = await queue(); q.running + q.waiting < i && !answered; q = await queue()) await turn();
        }
        full = await queue();
        if (!answered) shed = await send(`${stream ? 's' : 'p'}7`, 'POST', '/query', query, {}, to);
      } finally {
        release();
      }
      const replies = await Promise.all(sent);
      assert.deepEqual(replies.map((r) => r.status), [200, 200, 200, 200, 200, 200], `stream: ${stream}: ${replies.map((r) => r.body.slice(0, 120)).join('\n')}`);
      assert.deepEqual(full, { running: 2, waiting: 4 }, `stream: ${stream}`);
      for (const r of replies) {
        if (stream) assert.equal(sseEvents(r.body).at(-1)![0], 'done', r.body);
        else assert.equal(typeof (JSON.parse(r.body) as { answer: unknown }).answer, 'string');
      }
      assert.equal(shed?.status, 503, shed?.body);
      assert.equal((JSON.parse(shed!.body) as { error: { code: string } }).error.code, 'queue_full');
      assert.deepEqual(await queue(), { running: 0, waiting: 0 });

      // And 6 sent at once, in one burst: all served.
      const releaseBurst = await holdRuns();
      let burst: Promise<Reply[]>;
      try {
        burst = Promise.all([1, 2, 3, 4, 5, 6].map((i) => send(`${stream ? 's' : 'p'}b${i}`, 'POST', '/query', query, {}, to)));
        let answered = false;
        void burst.finally(() => (answered = true));
        for (let q = await queue(); q.running + q.waiting < 6 && !answered; q = await queue()) await turn();
      } finally {
        releaseBurst();
      }
      assert.deepEqual((await burst).map((r) => r.status), [200, 200, 200, 200, 200, 200], `burst, stream: ${stream}`);
    }
  } finally {
    srv.closeAllConnections();
    srv.close();
  }
});
