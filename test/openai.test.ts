/**
 * The OpenAI-compatible routes, checked with the official `openai` npm client against the real app on
 * loopback (shipped models, a real faiss index); the streamed /query; validation with every error at
 * once; /openapi.json; and a closed stream cancelling its sequence.
 */
import assert from 'node:assert/strict';
import type { Server } from 'node:http';
import { after, before, describe, test } from 'node:test';
import OpenAI from 'openai';
import type { Config } from '../src/config/config.js';
import { DecoderModel } from '../src/backends/ort/decoder-model.js';
import type { RagService } from '../src/service/rag.js';
import { openaiFixture, type OpenAiFixture } from './openai-fixture.js';
import { sseEvents } from './helpers.js';

const DOCS = ['task-scheduling-cron-atd', 'apt-cache', 'quotas', 'syslog'];
let fx: OpenAiFixture;
let cfg: Config;
let service: RagService;
let server: Server;
let base: string;
let client: OpenAI;
const MODEL = 'decoder-gqa';

before(async () => {
  fx = await openaiFixture(DOCS);
  ({ cfg, service, server, base, client } = fx);
});

after(() => fx.close());

/** Server-sent events of a response, as [event name or undefined, data] pairs. */
async function readEvents(res: Response): Promise<[string | undefined, string][]> {
  return sseEvents(await res.text());
}

const post = (path: string, body: unknown, signal?: AbortSignal) => fx.post(path, body, signal);

describe('OpenAI routes through the official client', () => {
  test('GET /v1/models lists the decoder, the embedder, the reranker and the LoRA adapters that fit the decoder (parent: the decoder)', async () => {
    const models: { id: string; parent?: string | null }[] = [];
    for await (const m of client.models.list()) models.push(m as { id: string; parent?: string | null });
    assert.deepEqual(models.map((m) => m.id), [MODEL, 'embedder', 'reranker', 'demo-qv-r4', 'demo-r8']);
    assert.deepEqual(models.map((m) => m.parent), [null, null, null, MODEL, MODEL]);
  });

  test('a LoRA adapter as the model: generated with it, deterministic, unloaded after', async () => {
    const body = { prompt: 'Context:\n[1] apt: a package tool\n\nQuestion: What is apt?\nAnswer:', max_tokens: 16, temperature: 0 };
    const base = await client.completions.create({ ...body, model: MODEL });
    const lora = await client.completions.create({ ...body, model: 'demo-r8' });
    assert.equal(lora.model, 'demo-r8');
    assert.notEqual(lora.choices[0]!.text, base.choices[0]!.text, 'the adapter changes the answer');
    const again = await client.chat.completions.create({ model: 'demo-r8', messages: [{ role: 'user', content: 'What is apt?' }], max_tokens: 8, temperature: 0 });
    const twice = await client.chat.completions.create({ model: 'demo-r8', messages: [{ role: 'user', content: 'What is apt?' }], max_tokens: 8, temperature: 0 });
    assert.equal(again.choices[0]!.message.content, twice.choices[0]!.message.content);
    assert.deepEqual(service.adapters.stats().loaded, [], 'nothing stays loaded');
  });

  test('chat completion: a reply with id, created, usage and finish_reason', async () => {
    const r = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'What does the cron daemon do?' }], max_tokens: 12, temperature: 0,
    });
    assert.match(r.id, /^chatcmpl-/);
    assert.equal(r.object, 'chat.completion');
    assert.ok(Math.abs(r.created - Date.now() / 1000) < 600);
    assert.equal(r.model, MODEL);
    const c = r.choices[0]!;
    assert.equal(c.message.role, 'assistant');
    assert.ok(c.message.content && c.message.content.length > 0);
    assert.ok(c.finish_reason === 'stop' || c.finish_reason === 'length');
    assert.ok(r.usage!.prompt_tokens > 5 && r.usage!.completion_tokens >= 1 && r.usage!.completion_tokens <= 12);
    assert.equal(r.usage!.total_tokens, r.usage!.prompt_tokens + r.usage!.completion_tokens);
  });

  test('streamed chat: the chunks add up to the non-streamed reply; usage last when asked', async () => {
    const body = { model: MODEL, messages: [{ role: 'user' as const, content: 'Where are the system logs kept?' }], max_tokens: 24, temperature: 0 };
    const whole = await client.chat.completions.create(body);
    const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
    let text = '';
    let role: string | undefined;
    let finish: string | null | undefined;
    let usage: OpenAI.CompletionUsage | undefined | null;
    let chunks = 0;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'chat.completion.chunk');
      assert.equal(chunk.id.startsWith('chatcmpl-'), true);
      if (chunk.usage) usage = chunk.usage;
      for (const ch of chunk.choices) {
        role ??= ch.delta.role;
        text += ch.delta.content ?? '';
        if (ch.finish_reason) finish = ch.finish_reason;
      }
      chunks++;
    }
    assert.equal(role, 'assistant');
    assert.equal(text, whole.choices[0]!.message.content);
    assert.equal(finish, whole.choices[0]!.finish_reason);
    assert.deepEqual(usage, whole.usage);
    assert.ok(chunks >= 3, 'more than one chunk');
  });

  test('chat with the rag extension: grounded on the index, citations returned', async () => {
    const r = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'How can I stop one particular user from scheduling cron jobs?' }],
      max_tokens: 16, temperature: 0,
      // @ts-expect-error: ragguard's extension field, not in OpenAI's types
      rag: { top_k: 8, rerank_top_n: 2 },
    });
    const citations = (r as unknown as { citations: { doc_id: string }[] }).citations;
    assert.ok(citations.length >= 1 && citations.length <= 2);
    assert.equal(citations[0]!.doc_id, 'task-scheduling-cron-atd');
    // The context is in the prompt: far more prompt tokens than the question alone.
    const bare = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'How can I stop one particular user from scheduling cron jobs?' }], max_tokens: 1,
    });
    assert.ok(r.usage!.prompt_tokens > bare.usage!.prompt_tokens + 50);
  });

  test('streamed rag chat: citations ride on the first chunk', async () => {
    const res = await post('/v1/chat/completions', {
      model: MODEL, messages: [{ role: 'user', content: 'disk quota limits' }], max_tokens: 8, temperature: 0, stream: true, rag: { rerank_top_n: 1 },
    });
    const events = await readEvents(res);
    assert.equal(events.at(-1)![1], '[DONE]');
    const first = JSON.parse(events[0]![1]) as { citations: { doc_id: string }[]; choices: { delta: { role: string } }[] };
    assert.equal(first.citations.length, 1);
    assert.equal(first.choices[0]!.delta.role, 'assistant');
  });

  test('completions, whole and streamed, agree', async () => {
    const body = { model: MODEL, prompt: 'Context:\n[1] apt: a package tool\n\nQuestion: What is apt?\nAnswer:', max_tokens: 20, temperature: 0 };
    const whole = await client.completions.create(body);
    assert.match(whole.id, /^cmpl-/);
    assert.equal(whole.object, 'text_completion');
    assert.ok(whole.choices[0]!.text.length > 0);
    let text = '';
    let finish: string | null = null;
    for await (const c of await client.completions.create({ ...body, stream: true })) {
      text += c.choices[0]?.text ?? '';
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(text, whole.choices[0]!.text);
    assert.equal(finish, whole.choices[0]!.finish_reason);
  });

  test('sampling fields reach the sampler: stop cuts, seed replays, top_k 1 is greedy', async () => {
    const body = { model: MODEL, prompt: 'Context:\n[1] apt: a package tool\n\nQuestion: What is apt?\nAnswer:', max_tokens: 30 };
    const greedy = (await client.completions.create({ ...body, temperature: 0 })).choices[0]!;
    const words = greedy.text.split(' ');
    assert.ok(words.length > 5, greedy.text);
    const stopped = (await client.completions.create({ ...body, temperature: 0, stop: [` ${words[3]}`] })).choices[0]!;
    assert.equal(stopped.text, words.slice(0, 3).join(' '));
    assert.equal(stopped.finish_reason, 'stop');
    const seeded = { ...body, temperature: 1, top_p: 0.9, seed: 5, presence_penalty: 0.5 };
    const a = await client.completions.create(seeded);
    const b = await client.completions.create(seeded);
    assert.equal(a.choices[0]!.text, b.choices[0]!.text);
    // @ts-expect-error: vLLM's top_k extension
    const k1 = await client.completions.create({ ...body, temperature: 1, seed: 5, top_k: 1 });
    assert.equal(k1.choices[0]!.text, greedy.text);
  });

  test('embeddings: the embedder\'s vectors, for a string and for an array (base64 and float)', async () => {
    const inputs = ['the sticky bit on /tmp', 'apt-cache search'];
    const want = await service.models.embedder.embed(inputs);
    const d = service.models.embedder.dimension;
    const r = await client.embeddings.create({ model: 'embedder', input: inputs }); // the client asks for base64
    assert.equal(r.data.length, 2);
    r.data.forEach((e, i) => {
      assert.equal(e.index, i);
      assert.deepEqual(Float32Array.from(e.embedding), want.subarray(i * d, (i + 1) * d));
    });
    assert.ok(r.usage.prompt_tokens > 4);
    const one = await client.embeddings.create({ model: 'embedder', input: inputs[0]!, encoding_format: 'float' });
    assert.deepEqual(Float32Array.from(one.data[0]!.embedding), want.subarray(0, d));
  });

  test('errors in OpenAI\'s shape: unknown model 404, bad body 400 with every problem', async () => {
    await assert.rejects(client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }), (e: unknown) => {
      assert.ok(e instanceof OpenAI.NotFoundError);
      assert.equal(e.code, 'model_not_found');
      assert.equal(e.type, 'not_found_error');
      return true;
    });
    await assert.rejects(
      // @ts-expect-error: deliberately invalid
      client.chat.completions.create({ model: MODEL, messages: [], temperature: -1, top_p: 3, colour: 'blue' }),
      (e: unknown) => {
        assert.ok(e instanceof OpenAI.BadRequestError);
        assert.equal(e.code, 'invalid_body');
        assert.equal(e.type, 'invalid_request_error');
        const errors = (e.error as { errors: { field: string; code: string }[] }).errors;
        assert.deepEqual(errors.map((x) => x.field).sort(), ['colour', 'messages', 'temperature', 'top_p']);
        assert.equal(errors.find((x) => x.field === 'colour')!.code, 'unknown_field');
        return true;
      },
    );
  });
});

describe('POST /query validation and streaming', () => {
  test('every problem of a body at once, unknown fields refused', async () => {
    const res = await post('/query', { query: '', top_k: 0, temperature: 'hot', stop: ['a', 3], topk: 3 });
    assert.equal(res.status, 400);
    const b = (await res.json()) as { error: { code: string; message: string; errors: { field: string; code: string }[] } };
    assert.equal(b.error.code, 'invalid_body');
    assert.deepEqual(b.error.errors.map((e) => `${e.field}:${e.code}`).sort(),
      ['query:invalid_field', 'stop:invalid_field', 'temperature:invalid_field', 'top_k:invalid_field', 'topk:unknown_field']);
    assert.match(b.error.message, /^5 problems/);
  });

  test('streamed: citations first, then tokens, then the rest; the tokens add up to the answer', async () => {
    const q = { query: 'What is the sticky bit used for on /tmp?', max_new_tokens: 24 };
    const whole = (await (await post('/query', q)).json()) as { answer: string; citations: unknown[] };
    const res = await post('/query', { ...q, stream: true });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /^text\/event-stream/);
    const events = await readEvents(res);
    assert.equal(events[0]![0], 'citations');
    assert.deepEqual((JSON.parse(events[0]![1]) as { citations: unknown[] }).citations, whole.citations);
    const tokens = events.slice(1, -1);
    assert.ok(tokens.length >= 2);
    assert.ok(tokens.every(([e]) => e === 'token'));
    const text = tokens.map(([, d]) => (JSON.parse(d) as { text: string }).text).join('');
    assert.equal(text, whole.answer);
    const [last, data] = events.at(-1)!;
    assert.equal(last, 'done');
    const done = JSON.parse(data) as { answer: string; usage: { completion_tokens: number }; guard: { decision: string }; finish_reason: string };
    assert.equal(done.answer, whole.answer);
    assert.ok(done.usage.completion_tokens >= 1);
    assert.ok(['admit', 'queue'].includes(done.guard.decision));
  });

  test('sampling fields on /query: stop cuts the answer, sample_top_k 1 is greedy', async () => {
    const q = { query: 'Where are the system logs kept?', max_new_tokens: 30 };
    const greedy = (await (await post('/query', q)).json()) as { answer: string };
    const words = greedy.answer.split(' ');
    assert.ok(words.length > 5, greedy.answer);
    const stopped = (await (await post('/query', { ...q, stop: ` ${words[2]}` })).json()) as { answer: string; finish_reason: string };
    assert.equal(stopped.answer, words.slice(0, 2).join(' '));
    assert.equal(stopped.finish_reason, 'stop');
    const k1 = (await (await post('/query', { ...q, temperature: 1.5, seed: 3, sample_top_k: 1 })).json()) as { answer: string };
    assert.equal(k1.answer, greedy.answer);
  });

  test('a streamed request that fails validation is an ordinary JSON 400', async () => {
    const res = await post('/query', { query: 'x', stream: 'yes' });
    assert.equal(res.status, 400);
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, 'invalid_body');
  });
});

describe('GET /openapi.json', () => {
  test('generated from the schemas: every route, its fields and their limits', async () => {
    const doc = (await (await fetch(`${base}/openapi.json`)).json()) as {
      openapi: string; paths: Record<string, unknown>; components: { schemas: Record<string, { properties?: Record<string, { maximum?: number }>; additionalProperties?: boolean }> };
    };
    assert.equal(doc.openapi, '3.1.0');
    for (const p of ['/query', '/documents', '/v1/chat/completions', '/v1/completions', '/v1/embeddings', '/v1/models']) assert.ok(doc.paths[p], p);
    const query = doc.components.schemas['query']!;
    assert.equal(query.additionalProperties, false);
    assert.equal(query.properties!['top_k']!.maximum, cfg.maxTopK);
    for (const f of ['top_p', 'sample_top_k', 'stop', 'seed', 'repetition_penalty', 'presence_penalty', 'frequency_penalty', 'stream']) {
      assert.ok(query.properties![f], f);
    }
    assert.ok(doc.components.schemas['chatCompletion']!.properties!['rag']);
  });
});

describe('a closed stream cancels its request', () => {
  test('the client closes after the first token: the sequence is finished at the barrier and its blocks freed', async () => {
    const body = { model: MODEL, prompt: 'Question: What is apt?\nAnswer:', max_tokens: 60, temperature: 0 };
    // Left alone, this request generates many tokens (so stopping early is the cancellation's doing).
    const whole = await client.completions.create(body);
    assert.ok(whole.usage!.completion_tokens > 20, `${whole.usage!.completion_tokens} tokens`);
    const decoder = service.models.decoder;
    assert.ok(decoder instanceof DecoderModel, 'the test server runs the decoder on ONNX Runtime');
    const forward = decoder.forward.bind(decoder);
    // Each model run after the first waits for the gate: so the client's close lands while the
    // sequence is mid-generation, however slow this machine is.
    let runs = 0;
    let open!: () => void;
    const gate = new Promise<void>((r) => (open = r));
    decoder.forward = async (args) => {
      if (runs++ > 0) await gate;
      return forward(args);
    };
    try {
      const rowsBefore = service.engine.stats.decodeRows;
      const closed = new Promise<void>((resolve) => server.once('request', (_req, res) => res.once('close', resolve)));
      const ac = new AbortController();
      const res = await post('/v1/completions', { ...body, stream: true }, ac.signal);
      const reader = res.body!.getReader();
      await reader.read(); // the first chunk: the prefill's token
      ac.abort();
      await closed; // the server has seen the client go
      open();
      await service.engine.idle();
      const kv = service.blocks.stats();
      assert.equal(kv.usedBlocks, 0, 'every block freed (or back in the prefix cache)');
      assert.equal(service.engine.scheduler.hasWork, false);
      // At most the step in flight when it closed went on: nowhere near what it generates alone.
      assert.ok(service.engine.stats.decodeRows - rowsBefore <= 2, `decoded ${service.engine.stats.decodeRows - rowsBefore} rows`);
    } finally {
      decoder.forward = forward;
      open();
    }
  });
});
