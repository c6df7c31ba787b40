/**
 * What applications reach for beyond plain completions, through the official `openai` client (and
 * fetch where it has no method) against the real app on loopback: logprobs and top_logprobs (streamed
 * too), n samples, embeddings of token ids and `dimensions`, POST /v1/rerank and /v1/score.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import OpenAI from 'openai';
import type { Config } from '../src/config/config.js';
import type { RagService } from '../src/service/rag.js';
import { openaiFixture, type OpenAiFixture } from './openai-fixture.js';
import { relevance } from '../src/retrieval/reranker.js';

let fx: OpenAiFixture;
let cfg: Config;
let service: RagService;
let base: string;
let client: OpenAI;
const MODEL = 'decoder-gqa';
const messages = [{ role: 'user' as const, content: 'What does the cron daemon do?' }];

before(async () => {
  fx = await openaiFixture(['apt-cache'], { RAGGUARD_MAX_N: '4' });
  ({ cfg, service, base, client } = fx);
});

after(() => fx.close());

const post = (path: string, body: unknown) => fx.post(path, body);

async function refused(path: string, body: unknown, status: number, param: string): Promise<string> {
  const res = await post(path, body);
  const b = await res.json() as { error: { param: string; message: string } };
  assert.equal(res.status, status, JSON.stringify(b));
  assert.equal(b.error.param, param);
  return b.error.message;
}

describe('logprobs', () => {
  test('chat: OpenAI\'s shape, each token\'s bytes spelling the answer, greedy tokens the top ones, streamed the same', async () => {
    const body = { model: MODEL, messages, max_tokens: 10, temperature: 0, logprobs: true, top_logprobs: 3 };
    const r = await client.chat.completions.create(body);
    const lp = r.choices[0]!.logprobs!;
    assert.equal(lp.refusal, null);
    assert.equal(lp.content!.length, r.usage!.completion_tokens);
    for (const t of lp.content!) {
      assert.equal(t.top_logprobs.length, 3);
      assert.equal(t.token, t.top_logprobs[0]!.token, 'greedy: the most likely token');
      assert.equal(t.logprob, t.top_logprobs[0]!.logprob);
      assert.ok(t.logprob <= 0 && t.top_logprobs[1]!.logprob <= t.top_logprobs[0]!.logprob);
    }
    // The tokens' own bytes; the reply's text is decoded with the tokenizer's clean-up (' .' -> '.').
    const squeeze = (t: string) => t.replace(/\s+/g, '');
    const text = Buffer.from(lp.content!.flatMap((t) => t.bytes!)).toString('utf8');
    assert.equal(squeeze(text), squeeze(r.choices[0]!.message.content!));

    const stream = await client.chat.completions.create({ ...body, stream: true });
    const streamed: typeof lp.content = [];
    let content = '';
    for await (const c of stream) {
      const ch = c.choices[0];
      if (!ch) continue;
      content += ch.delta.content ?? '';
      if (ch.logprobs?.content) streamed.push(...ch.logprobs.content);
    }
    assert.equal(content.trim(), r.choices[0]!.message.content);
    assert.deepEqual(streamed, lp.content, 'the chunks carry every token\'s logprobs, once');
  });

  test('completions: tokens, token_logprobs, top_logprobs and text_offset', async () => {
    const r = await client.completions.create({ model: MODEL, prompt: 'The cron daemon', max_tokens: 6, temperature: 0, logprobs: 2 });
    const lp = r.choices[0]!.logprobs!;
    assert.equal(lp.tokens!.length, r.usage!.completion_tokens);
    assert.equal(lp.token_logprobs!.length, lp.tokens!.length);
    assert.equal(lp.top_logprobs!.length, lp.tokens!.length);
    let offset = 0;
    lp.tokens!.forEach((t, i) => {
      assert.equal(lp.text_offset![i], offset);
      offset += t.length;
      const top = lp.top_logprobs![i]!;
      assert.ok(Object.keys(top).length >= 1 && Object.keys(top).length <= 2);
      assert.equal(top[t], lp.token_logprobs![i], 'the greedy token is the top one, at its own logprob');
    });
    assert.equal(lp.tokens!.join('').replace(/\s+/g, ''), r.choices[0]!.text.replace(/\s+/g, ''));
  });

  test('completions streamed: the chunks\' logprobs add up to the reply\'s, text_offset running on across chunks', async () => {
    const body = { model: MODEL, prompt: 'The cron daemon', max_tokens: 8, temperature: 0, logprobs: 1 };
    const whole = (await client.completions.create(body)).choices[0]!.logprobs!;
    const got = { tokens: [] as string[], token_logprobs: [] as number[], text_offset: [] as number[] };
    for await (const c of await client.completions.create({ ...body, stream: true })) {
      const lp = c.choices[0]?.logprobs;
      if (!lp) continue;
      got.tokens.push(...lp.tokens!);
      got.token_logprobs.push(...lp.token_logprobs!);
      got.text_offset.push(...lp.text_offset!);
    }
    assert.deepEqual(got, { tokens: whole.tokens, token_logprobs: whole.token_logprobs, text_offset: whole.text_offset });
  });

  test('no logprobs asked: null', async () => {
    const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 2, temperature: 0 });
    assert.equal(r.choices[0]!.logprobs, null);
  });

  test('top_logprobs without logprobs, or above 20: 400', async () => {
    await refused('/v1/chat/completions', { model: MODEL, messages, top_logprobs: 2 }, 400, 'top_logprobs');
    await refused('/v1/chat/completions', { model: MODEL, messages, logprobs: true, top_logprobs: 21 }, 400, 'top_logprobs');
    await refused('/v1/completions', { model: MODEL, prompt: 'x', logprobs: 21 }, 400, 'logprobs');
    await refused('/v1/chat/completions', { model: MODEL, messages, logprobs: true, rag: {} }, 400, 'logprobs');
  });
});

describe('n', () => {
  test('n = 3 with a seed: three choices, reproducible, the prompt counted once in the usage', async () => {
    const body = { model: MODEL, messages, max_tokens: 8, temperature: 1, seed: 11, n: 3 };
    const one = await client.chat.completions.create({ ...body, n: 1 });
    const r = await client.chat.completions.create(body);
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
    assert.equal(r.choices[0]!.message.content, one.choices[0]!.message.content, 'choice 0 is what n = 1 with the seed gives');
    assert.equal(r.usage!.prompt_tokens, one.usage!.prompt_tokens);
    const again = await client.chat.completions.create(body);
    assert.deepEqual(again.choices.map((c) => c.message.content), r.choices.map((c) => c.message.content));

    const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
    const texts = ['', '', ''];
    const finished = new Set<number>();
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const c of stream) {
      if (c.usage) usage = c.usage;
      for (const ch of c.choices) {
        texts[ch.index] += ch.delta.content ?? '';
        if (ch.finish_reason) finished.add(ch.index);
      }
    }
    assert.deepEqual(texts.map((t) => t.trim()), r.choices.map((c) => c.message.content));
    assert.deepEqual([...finished].sort(), [0, 1, 2]);
    assert.deepEqual(usage, r.usage);
  });

  test('completions with n = 2 and logprobs: each choice its own', async () => {
    const r = await client.completions.create({ model: MODEL, prompt: 'The cron daemon', max_tokens: 5, temperature: 1, seed: 5, n: 2, logprobs: 1 });
    assert.equal(r.choices.length, 2);
    for (const c of r.choices) assert.equal(c.logprobs!.tokens!.join('').replace(/\s+/g, ''), c.text.replace(/\s+/g, ''));
  });

  test('n above RAGGUARD_MAX_N: 400; n > 1 with rag: 400', async () => {
    const m = await refused('/v1/chat/completions', { model: MODEL, messages, n: 5 }, 400, 'n');
    assert.match(m, /4/);
    await refused('/v1/chat/completions', { model: MODEL, messages, n: 2, rag: {} }, 400, 'n');
  });
});

describe('embeddings', () => {
  test('token ids (the embedder\'s own) give the same vectors as the text they spell; a list of them too', async () => {
    const texts = ['the cron daemon runs jobs', 'apt installs packages'];
    const ids = texts.map((t) => service.models.embedder.tokenizer.encode(t, true));
    const byText = await client.embeddings.create({ model: 'embedder', input: texts });
    const byIds = await client.embeddings.create({ model: 'embedder', input: ids });
    byIds.data.forEach((d, i) => {
      const want = byText.data[i]!.embedding;
      d.embedding.forEach((x, k) => assert.ok(Math.abs(x - want[k]!) < 1e-5));
    });
    assert.equal(byIds.usage.prompt_tokens, byText.usage.prompt_tokens);
    const single = await client.embeddings.create({ model: 'embedder', input: ids[0]!, encoding_format: 'float' });
    assert.equal(single.data.length, 1);
    assert.deepEqual(single.data[0]!.embedding, byIds.data[0]!.embedding);
  });

  test('an id outside the vocabulary: 400 naming it; dimensions: the model\'s own accepted, any other 400', async () => {
    const v = service.models.embedder.vocabSize;
    const m = await refused('/v1/embeddings', { model: 'embedder', input: [101, v, 102] }, 400, 'input');
    assert.match(m, new RegExp(`input\\[0\\]\\[1\\] is token id ${v}`));
    const d = service.models.embedder.dimension;
    const ok = await client.embeddings.create({ model: 'embedder', input: 'x', dimensions: d });
    assert.equal(ok.data[0]!.embedding.length, d);
    await refused('/v1/embeddings', { model: 'embedder', input: 'x', dimensions: d - 1 }, 400, 'dimensions');
  });
});

describe('rerank and score', () => {
  const query = 'How do I search the package cache?';
  const docs = ['apt-cache search finds packages by name or description.', 'The cron daemon runs scheduled jobs.', 'Quotas limit disk use per user.'];

  test('POST /v1/rerank: the reranker\'s own scores (sigmoid of its logits), most relevant first', async () => {
    const direct = (await service.models.reranker.score(query, docs)).scores.map(relevance);
    const res = await post('/v1/rerank', { model: 'reranker', query, documents: docs });
    assert.equal(res.status, 200);
    const b = await res.json() as { model: string; results: { index: number; relevance_score: number; document?: { text: string } }[]; usage: { total_tokens: number } };
    assert.equal(b.model, 'reranker');
    assert.equal(b.results.length, 3);
    for (const r of b.results) {
      assert.ok(Math.abs(r.relevance_score - direct[r.index]!) < 1e-6, `document ${r.index}: ${r.relevance_score} against ${direct[r.index]}`);
      assert.equal(r.document?.text, docs[r.index]);
    }
    assert.deepEqual(b.results.map((r) => r.index), [0, 1, 2].sort((a, c) => direct[c]! - direct[a]!));
    assert.ok(b.usage.total_tokens > 0);

    const top = await (await post('/v1/rerank', { model: 'reranker', query, documents: docs.map((text) => ({ text })), top_n: 1, return_documents: false })).json() as typeof b;
    assert.deepEqual(top.results, [{ index: b.results[0]!.index, relevance_score: b.results[0]!.relevance_score }]);
  });

  test('POST /v1/score: one text against a list, and two lists in order, as vLLM pairs them', async () => {
    const direct = (await service.models.reranker.score(query, docs)).scores.map(relevance);
    const one = await (await post('/v1/score', { model: 'reranker', text_1: query, text_2: docs })).json() as { data: { index: number; object: string; score: number }[] };
    assert.deepEqual(one.data.map((d) => [d.index, d.object]), [[0, 'score'], [1, 'score'], [2, 'score']]);
    one.data.forEach((d, i) => assert.ok(Math.abs(d.score - direct[i]!) < 1e-6));
    const zipped = await (await post('/v1/score', { model: 'reranker', text_1: [query, 'cron jobs'], text_2: [docs[0], docs[1]] })).json() as typeof one;
    assert.ok(Math.abs(zipped.data[0]!.score - direct[0]!) < 1e-6);
    const cron = (await service.models.reranker.score('cron jobs', [docs[1]!])).scores.map(relevance);
    assert.ok(Math.abs(zipped.data[1]!.score - cron[0]!) < 1e-6);
    await refused('/v1/score', { model: 'reranker', text_1: ['a', 'b'], text_2: ['c', 'd', 'e'] }, 400, 'text_2');
  });

  test('a model that is not the reranker: 404; no documents: 400; listed in /openapi.json and /v1/models, counted in /metrics', async () => {
    await refused('/v1/rerank', { model: MODEL, query, documents: docs }, 404, 'model');
    await refused('/v1/rerank', { model: 'reranker', query, documents: [] }, 400, 'documents');
    const doc = await (await fetch(`${base}/openapi.json`)).json() as { paths: Record<string, unknown>; components: { schemas: Record<string, unknown> } };
    assert.ok(doc.paths['/v1/rerank'] && doc.paths['/v1/score']);
    assert.ok(doc.components.schemas['rerank'] && doc.components.schemas['score']);
    const metrics = await (await fetch(`${base}/metrics`)).text();
    assert.match(metrics, /rerank_pairs_total\{[^}]*route="\/v1\/rerank"[^}]*\} [1-9]/);
    assert.match(metrics, /http_requests_total\{[^}]*route="\/v1\/rerank"[^}]*status="200"/);
  });
});
