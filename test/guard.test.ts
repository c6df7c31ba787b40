/** The memory guard: workspace reservations, and its decisions as the HTTP API reports them. */
import assert from 'node:assert/strict';
import { before, describe, test } from 'node:test';
import request from 'supertest';
import { MemoryGuard } from '../src/guards/guard.js';
import { MemoryModel } from '../src/guards/memory-model.js';
import { BusyError } from '../src/runtime/errors.js';
import { toHttpError } from '../src/server/errors.js';
import { RagService } from '../src/service/rag.js';
import { createApp } from '../src/server/app.js';
import { smallCorpus, tempDir, testConfig } from './helpers.js';

describe('reservations', () => {
  const model = new MemoryModel({ numLayers: 1, hiddenSize: 8, numHeads: 1, intermediateSize: 8 },
    { numLayers: 1, hiddenSize: 8, numHeads: 1, numKvHeads: 1, headDim: 8, intermediateSize: 8, vocabSize: 8 }, 16);
  const guard = () => new MemoryGuard(model, () => ({ workspaceTotal: 100, kvFreeBlocks: 10, kvTotalBlocks: 10 }), [], { minPromptTokens: 8, minNewTokens: 1 });

  test('reservations wait in FIFO order for room and are released once', async () => {
    const g = guard();
    const a = await g.reserve(60, 1000);
    const order: string[] = [];
    const b = g.reserve(50, 1000).then((r) => (order.push('b'), r));
    const c = g.reserve(10, 1000).then((r) => (order.push('c'), r));
    await new Promise((r) => setTimeout(r, 10));
    assert.deepEqual(order, [], 'c fits but does not overtake b');
    assert.equal(g.waiting, 2);
    a();
    a();
    const [rb, rc] = await Promise.all([b, c]);
    assert.deepEqual(order, ['b', 'c']);
    assert.equal(g.reserved, 60);
    rb();
    rc();
    assert.equal(g.reserved, 0);
  });

  test('a wait past the deadline is a 503 with Retry-After; the queue moves on', async () => {
    const g = guard();
    const a = await g.reserve(90, 1000);
    await assert.rejects(g.reserve(50, 20), (e: unknown) => e instanceof BusyError && e.code === 'memory_busy' && e.retryAfterSeconds === 1 &&
      e.details['predicted_bytes'] === 50 && e.details['budget_bytes'] === 100 &&
      toHttpError(e).status === 503 && toHttpError(e).headers['Retry-After'] === '1');
    assert.equal(g.waiting, 0);
    a();
  });
});

describe('decisions over HTTP', () => {
  let service: RagService;

  before(async () => {
    const cfg = testConfig({ RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, ['apt-cache', 'quotas', 'ipv6']) });
    service = await RagService.start(cfg);
  });

  /** The same models and index under a budget that leaves exactly `workspace` bytes for runs. */
  function withWorkspace(workspace: number, promptBudgetTokens = service.cfg.promptBudgetTokens, reshapeOrder = service.cfg.reshapeOrder) {
    const fixed = service.weightBytes + service.adapterSlotBytes + service.store.indexBytes + service.engine.pool.bytes + service.allocatorWarmBytes;
    const cfg = { ...service.cfg, memoryBudget: { bytes: fixed + workspace }, kvCacheBytes: service.engine.pool.bytes, promptBudgetTokens, reshapeOrder };
    const s = new RagService(cfg, service.models, service.store);
    s.guard.model.calibrate(service.guard.model.calibration, service.guard.model.headroom);
    assert.equal(s.workspaceBytes, workspace);
    return { s, app: createApp(s) };
  }

  test('with room, requests are admitted as asked', async () => {
    const res = await request(createApp(service)).post('/query').send({ query: 'apt-cache policy', max_new_tokens: 4 }).expect(200);
    assert.equal(res.body.guard.decision, 'admit');
    assert.deepEqual(res.body.guard.reshaped, []);
    assert.ok(res.body.guard.predicted_bytes > 0);
  });

  test('a request that can never fit is reshaped (fewer reranked candidates, when the order says so) and served that way', async () => {
    const asked = { query: 'How do I set disk quotas for a user?', top_k: 40, rerank_top_n: 2, max_new_tokens: 8 };
    // A short prompt budget makes reranking the peak stage.
    const shape = { ...service.requestShape({ query: asked.query, topK: 40, rerankTopN: 2, maxNewTokens: 8, temperature: 0 }), promptTokens: 128 };
    const room = service.guard.model.predict({ ...shape, topK: 5 }).reserveBytes;
    assert.equal(service.guard.model.predict(shape).peakStage, 'rerank');
    assert.ok(service.guard.model.predict(shape).reserveBytes > room, 'as asked it needs more than the room');
    const { app } = withWorkspace(room, 128, ['rerank', 'context', 'new_tokens']);
    const res = await request(app).post('/query').send(asked).expect(200);
    assert.equal(res.body.guard.decision, 'admit');
    assert.deepEqual(res.body.guard.reshaped, [{ field: 'top_k', from: 40, to: 5 }]);
    assert.ok(res.body.retrieval.hits <= 5, 'the query ran with the reshaped top_k');
    assert.ok(res.body.guard.reserved_bytes <= room);
    assert.equal(res.body.guard.reserved_bytes, Math.ceil(res.body.guard.predicted_workspace_bytes * (1 + service.guard.model.headroom)));
  });

  test('by default smaller reranker batches come first: every candidate is still reranked', async () => {
    const asked = { query: 'How do I set disk quotas for a user?', top_k: 40, rerank_top_n: 2, max_new_tokens: 8 };
    const shape = { ...service.requestShape({ query: asked.query, topK: 40, rerankTopN: 2, maxNewTokens: 8, temperature: 0 }), promptTokens: 128 };
    const room = service.guard.model.predict({ ...shape, rerankBatch: 4 }).reserveBytes;
    const { app } = withWorkspace(room, 128);
    const res = await request(app).post('/query').send(asked).expect(200);
    assert.deepEqual(res.body.guard.reshaped, [{ field: 'rerank_batch', from: 16, to: 4 }]);
    assert.equal(res.body.retrieval.hits, 40, 'top_k as asked');
    assert.equal(res.body.guard.as_run.reranked_pairs, res.body.retrieval.after_dedupe);
    // The reranker ran in batches of at most 4 pairs, each padded to its own longest pair.
    const runs = res.body.guard.as_run.rerank_runs as [number, number][];
    assert.equal(runs.reduce((n, [pairs]) => n + pairs, 0), res.body.retrieval.after_dedupe);
    assert.ok(runs.every(([pairs, width]) => pairs <= 4 && width <= res.body.guard.as_run.pair_tokens));
  });

  test('a request that cannot fit even reshaped is a 413 with predicted and budget bytes', async () => {
    const { app, s } = withWorkspace(1024);
    const res = await request(app).post('/query').send({ query: 'ipv6 tunnel', max_new_tokens: 8 });
    assert.equal(res.status, 413);
    assert.equal(res.body.error.code, 'request_too_large');
    assert.ok(res.body.error.predicted_bytes > 1024);
    assert.equal(res.body.error.budget_bytes, s.budget.budgetBytes);
  });

  test('the reply predicts the request as it ran: pairs reranked, prompt assembled, prefix found in the cache', async () => {
    const app = createApp(service);
    const ask = { query: 'Which options does apt-cache policy print?', top_k: 12, max_new_tokens: 4 };
    const first = (await request(app).post('/query').send(ask).expect(200)).body;
    const asRun = first.guard.as_run;
    assert.equal(asRun.prompt_tokens, first.usage.prompt_tokens);
    assert.equal(asRun.reranked_pairs, first.retrieval.after_dedupe);
    assert.ok(asRun.pair_tokens > 0 && asRun.pair_tokens <= service.models.reranker.maxTokens);
    assert.ok(asRun.predicted_workspace_bytes <= first.guard.predicted_workspace_bytes, 'as run never exceeds the worst case reserved');
    const again = (await request(app).post('/query').send(ask).expect(200)).body.guard.as_run;
    assert.ok(again.cached_prompt_tokens >= service.cfg.kvBlockSize, 'the same prompt again starts from cached blocks');
    assert.ok(again.predicted_stage_bytes.prefill < asRun.predicted_stage_bytes.prefill);
  });

  test('guards off: a request the guards would turn away runs as asked', async () => {
    const { s } = withWorkspace(1024);
    const off = createApp(new RagService({ ...s.cfg, guards: false }, service.models, service.store));
    const res = await request(off).post('/query').send({ query: 'ipv6 tunnel', max_new_tokens: 4 }).expect(200);
    assert.equal(res.body.guard.decision, 'off');
    assert.ok(res.body.answer.length > 0);
  });

  test('/debug/memory reports the budget split', async () => {
    const m = (await request(createApp(service)).get('/debug/memory').expect(200)).body;
    assert.equal(m.budget.source, 'host');
    assert.equal(m.budget.kv_pool_bytes, m.kv.pool_bytes);
    assert.equal(m.budget.workspace_bytes, service.workspaceBytes);
    assert.equal(m.budget.workspace_reserved_bytes, 0);
    assert.ok(m.budget.bytes <= m.budget.host_total_bytes);
  });
});
