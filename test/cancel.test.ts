/**
 * Cancellation: an abandoned request leaves the admission queue and the memory guard's line at once,
 * and a sequence leaves the engine at the next step barrier with its blocks freed; over HTTP, a client
 * that hangs up frees its blocks and its reservation and stops its work. Nothing here waits on a clock:
 * progress is held still by holding the run gate (no model runs while a test holds it).
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { cp } from 'node:fs/promises';
import { AdapterRegistry } from '../src/generate/adapters.js';
import { BlockManager } from '../src/generate/block-manager.js';
import { DecoderModel } from '../src/backends/ort/decoder-model.js';

import { Admission } from '../src/guards/admission.js';
import { loadModels, RagService } from '../src/service/rag.js';
import { createApp } from '../src/server/app.js';
import { gateStats } from '../src/runtime/run-gate.js';
import { holdRuns, ROOT, smallCorpus, tempDir, testConfig, turn } from './helpers.js';
import { ortEngine } from '../src/backends/ort/ort-runner.js';


class Gone extends Error {}

test('a waiting request whose client leaves is taken out of the admission queue; its work never runs', async () => {
  const a = new Admission({ concurrency: 1, maxQueue: 4, timeoutMs: 600_000 });
  let open!: () => void;
  const first = a.run(() => new Promise<number>((r) => (open = () => r(1))));
  const ac = new AbortController();
  let ran = false;
  const second = a.run(async () => ((ran = true), 2), ac.signal);
  assert.equal(a.waiting, 1);
  ac.abort(new Gone('client left'));
  await assert.rejects(second, Gone);
  assert.equal(a.waiting, 0, 'out of the queue at once');
  open();
  assert.equal(await first, 1);
  await a.drain();
  assert.equal(ran, false);
});

describe('with the shipped decoder', () => {
  let model: DecoderModel;
  before(async () => {
    model = await DecoderModel.load(path.join(ROOT, 'models', 'decoder-gqa'), 'cpu');
  });

  test('a request waiting for an adapter slot leaves the line when its client goes away', async () => {
    const dir = await tempDir('ragguard-adapters-');
    for (const n of ['a1', 'a2', 'a3', 'a4', 'a5']) await cp(path.join(ROOT, 'models', 'adapters', 'demo-qv-r4'), path.join(dir, n), { recursive: true });
    const r = new AdapterRegistry(dir, model, { maxLoras: 4, maxRank: 16, waitMs: 600_000 });
    const held = await Promise.all(['a1', 'a2', 'a3', 'a4'].map((n) => r.acquire(n)));
    const ac = new AbortController();
    const fifth = r.acquire('a5', ac.signal);
    while (r.stats().waiting === 0) await turn();
    ac.abort(new Gone('client left'));
    await assert.rejects(fifth, Gone);
    assert.equal(r.stats().waiting, 0);
    for (const l of held) l.release();
    assert.equal(r.stats().slots.free, 4);
  });

  test('the engine drops an abandoned sequence at the next step barrier, waiting or running, and frees its blocks', async () => {
    const blocks = new BlockManager({ numBlocks: 128, blockSize: 16, watermark: 0.01, enablePrefixCaching: false });
    const engine = ortEngine(model, blocks, { numBlocks: 128, blockSize: 16, maxNumSeqs: 8, maxNumBatchedTokens: 4096 });
    const prompt = [1, ...model.tokenizer.encode('Context:\n[1] cron: users listed in cron.deny may not use crontab.\n\nQuestion: how do I stop a user from using cron?\nAnswer:')];
    const long = { maxNewTokens: 200, temperature: 0, ignoreEos: true };
    const keep = engine.generate(prompt, long);
    const running = new AbortController();
    const dropped = engine.generate(prompt, long, { signal: running.signal });
    // Both run: a few steps in, hold every model run still.
    while (engine.stats.decodeRows < 4) await turn();
    const release = await holdRuns();
    const queued = new AbortController();
    const never = engine.generate(prompt, long, { signal: queued.signal });
    queued.abort(new Gone('waiting client left'));
    running.abort(new Gone('running client left'));
    const before = blocks.stats().usedBlocks;
    release();
    await assert.rejects(dropped, Gone);
    await assert.rejects(never, Gone);
    assert.equal(engine.stats.cancelled, 2);
    assert.ok(blocks.stats().usedBlocks < before, `its blocks are free at once (${blocks.stats().usedBlocks} of ${before} in use)`);
    const g = await keep;
    assert.equal(g.ids.length, 200, 'the other sequence runs on to its end');
    assert.equal(engine.stats.prefills, 2, 'the queued one was never prefilled');
    await engine.idle();
    assert.equal(blocks.stats().usedBlocks, 0);
  });
  test('a step whose every sequence was abandoned stops: its run leaves the gate unrun, its blocks are freed and kept from prefix hits', async () => {
    const blocks = new BlockManager({ numBlocks: 128, blockSize: 16, watermark: 0.01, enablePrefixCaching: true });
    const engine = ortEngine(model, blocks, { numBlocks: 128, blockSize: 16, maxNumSeqs: 8, maxNumBatchedTokens: 4096 });
    const prompt = [1, ...model.tokenizer.encode('Context:\n[1] quota: edquota sets the limits of one user; repquota reports them all.\n\nQuestion: how do I set a disk quota?\nAnswer:')];
    assert.ok(prompt.length > 32, 'full blocks that a prefix hit could find');
    const release = await holdRuns();
    const runs = gateStats().runs;
    const ac = new AbortController();
    const gone = engine.generate(prompt, { maxNewTokens: 8, temperature: 0 }, { signal: ac.signal });
    while (gateStats().waiting === 0) await turn(); // its prefill waits for the gate
    ac.abort(new Gone('client left'));
    await assert.rejects(gone, Gone);
    assert.equal(gateStats().waiting, 0, 'its run left the line at once');
    assert.equal(engine.stats.cancelled, 1);
    assert.equal(blocks.stats().usedBlocks, 0, 'its blocks are free');
    release();
    await engine.idle();
    assert.equal(gateStats().runs, runs, 'no model run happened for it');
    // The same prompt again finds nothing cached: the stopped step's blocks never held its KV.
    const again = await engine.generate(prompt, { maxNewTokens: 4, temperature: 0 });
    assert.equal(again.cachedTokens, 0);
    assert.equal(again.ids.length, 4);
  });
});

describe('over HTTP', () => {
  let service: RagService;
  let server: http.Server;
  let port: number;
  before(async () => {
    const cfg = testConfig({
      RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, ['task-scheduling-cron-atd', 'quotas', 'syslog']),
      RAGGUARD_PROFILE_RUN: 'false', RAGGUARD_MAX_CONCURRENT: '1', RAGGUARD_QUEUE_LENGTH: '4', RAGGUARD_QUEUE_TIMEOUT_MS: '600000',
    });
    service = await RagService.start(cfg, await loadModels(cfg));
    server = createApp(service).listen(0, '127.0.0.1');
    await new Promise((r) => server.once('listening', r));
    port = (server.address() as AddressInfo).port;
  });
  after(() => new Promise<void>((r) => server.close(() => r())));

  /** A query (or another POST) whose client can hang up: destroy() closes the connection. */
  function send(body: unknown, route = '/query'): { req: http.ClientRequest; reply: Promise<number | Error> } {
    const data = Buffer.from(JSON.stringify(body));
    const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: route, headers: { 'content-type': 'application/json', 'content-length': data.length } });
    const reply = new Promise<number | Error>((resolve) => {
      req.on('response', (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode ?? 0));
      });
      req.on('error', resolve);
    });
    req.end(data);
    return { req, reply };
  }

  test('a client that hangs up while generating: its sequence stops at the next step, its blocks and reservation are freed; a queued one leaves the queue', async () => {
    const query = { query: 'How can I stop one particular user from scheduling cron jobs?', max_new_tokens: 200 };
    const cancelled = service.engine.stats.cancelled;
    const a = send(query);
    // A reaches the engine (its prompt is in the scheduler); B waits for A's admission slot.
    while (service.engine.scheduler.running.length + service.engine.scheduler.waiting.length === 0) await turn();
    const release = await holdRuns();
    const b = send(query);
    while (service.blocks.stats().usedBlocks === 0 || service.guard.reserved === 0) await turn();
    // The event loop answers while no model can run; B is seen waiting.
    let queue: unknown;
    do {
      queue = await new Promise<unknown>((resolve) => {
        http.get({ host: '127.0.0.1', port, path: '/healthz' }, (r) => {
          let s = '';
          r.on('data', (c: Buffer) => (s += c.toString()));
          r.on('end', () => resolve((JSON.parse(s) as { queue: unknown }).queue));
        });
      });
    } while ((queue as { waiting: number }).waiting === 0);
    assert.deepEqual(queue, { running: 1, waiting: 1 });
    b.req.destroy();
    a.req.destroy();
    assert.ok((await a.reply) instanceof Error);
    assert.ok((await b.reply) instanceof Error);
    release();
    // Nothing waits or runs any more: the engine dropped A at its barrier, B never started.
    while (service.engine.stats.cancelled === cancelled) await turn();
    await service.engine.idle();
    while (service.guard.reserved > 0) await turn();
    assert.equal(service.engine.stats.cancelled, cancelled + 1, 'A left the engine; B never reached it');
    assert.equal(service.blocks.stats().usedBlocks, 0, 'its blocks are free');
    assert.equal(service.guard.reserved, 0, 'its reservation is released');
    assert.equal(service.engine.scheduler.hasWork, false);
  });
  test('a client that hangs up while its query waits for a model run: the run never happens', async () => {
    const release = await holdRuns();
    const runs = gateStats().runs;
    const a = send({ query: 'Where does apt keep its list of package sources?', max_new_tokens: 8 });
    while (gateStats().waiting === 0) await turn(); // its embedding waits for the gate
    a.req.destroy();
    assert.ok((await a.reply) instanceof Error);
    while (gateStats().waiting > 0) await turn(); // it left the line
    release();
    while (service.guard.reserved > 0) await turn();
    await service.engine.idle();
    assert.equal(gateStats().runs, runs, 'nothing ran for it: not its embedding, its rerank nor its generation');
    assert.equal(service.engine.scheduler.hasWork, false);
  });
  test('a client that hangs up on a /v1 completion (not streamed) stops its generation at the next step', async () => {
    const cancelled = service.engine.stats.cancelled;
    const release = await holdRuns();
    const a = send({ model: 'decoder-gqa', prompt: 'Context:\n[1] apt: a package tool\n\nQuestion: What is apt?\nAnswer:', max_tokens: 200, temperature: 0 }, '/v1/completions');
    // Scheduled: its first step waits for the held gate.
    while (service.engine.scheduler.running.length === 0) await turn();
    a.req.destroy();
    assert.ok((await a.reply) instanceof Error);
    // Before any run is let through: the step, abandoned by its only request, leaves the gate's line.
    while (service.engine.stats.cancelled === cancelled) await turn();
    release();
    await service.engine.idle();
    while (service.guard.reserved > 0) await turn();
    assert.equal(service.blocks.stats().usedBlocks, 0, 'its blocks are free');
    assert.equal(service.engine.scheduler.hasWork, false);
  });
});
