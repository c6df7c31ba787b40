/**
 * The copied-span constraint end to end (RAGGUARD_QUERY_COPY_SPAN=first, src/generate/span-answer.ts): the
 * real server on Qwen2.5-Coder-0.5B-Instruct Q4_K_M (whole chunks) and the default embedder, all-MiniLM-L6-v2, over loopback
 * HTTP. A /query whose retrieved chunk names a command (atrm) answers opening with a code span, and every code
 * span of the answer stands verbatim in a chunk it cites; /v1/chat/completions with rag, on the same
 * prompt, runs unconstrained and answers as it does with the constraint off. One question, greedy, no clock.
 */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { test } from 'node:test';
import { loadConfig } from '../src/config/config.js';
import { SpanAnswerGrammar, SPAN_MAX_CHARS } from '../src/generate/span-answer.js';
import { RagService } from '../src/service/rag.js';
import { createApp } from '../src/server/app.js';
import { QWEN_05B_GGUF, smallCorpus, tempDir } from './helpers.js';

const DEFAULTS = loadConfig({});
// The 0.5B (setup fetches it beside the default 1.5B), whose unconstrained answer below is known.
const DECODER = QWEN_05B_GGUF;
const missing = [DECODER, DEFAULTS.embedderPath].find((p) => !existsSync(p));
// Unconstrained, this model answers this one with a span the chunks do not hold (`atrm 1`, where the
// chunk says `atrm task-number`): the constraint is what keeps /query's spans copied.
const QUESTION = 'I queued a one-off job with at; how do I cancel it?';
const MAX_TOKENS = 48;

interface Cited { title: string; text: string }

/** The answer's code spans: the text between each pair of backticks (an odd count fails). */
function codeSpans(answer: string): string[] {
  const parts = answer.split('`');
  assert.equal(parts.length % 2, 1, `unbalanced backticks: ${JSON.stringify(answer)}`);
  return parts.filter((_, i) => i % 2 === 1);
}

test('RAGGUARD_QUERY_COPY_SPAN=first: /query code spans are copied from its citations; /v1/chat/completions is not constrained', { skip: missing ? `${missing} is missing: run npm run setup` : false }, async () => {
  const cfg = loadConfig({
    PORT: '0', RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(0, ['task-scheduling-cron-atd']), RAGGUARD_PROFILE_RUN: 'false',
    RAGGUARD_QUERY_COPY_SPAN: 'first', RAGGUARD_DECODER: DECODER, RAGGUARD_CONTEXT_SENTENCES: '0',
    // The conversion goes where the environment says (a worktree sharing models/gguf-cache points it at its own).
    ...(process.env['RAGGUARD_GGUF_CACHE'] ? { RAGGUARD_GGUF_CACHE: process.env['RAGGUARD_GGUF_CACHE'] } : {}),
  });
  assert.equal(cfg.decoderPath, DECODER);
  assert.equal(cfg.queryCopySpan, 'first');
  const service = await RagService.start(cfg);
  // The grammar each generation was given (the constraint is the engine's params.grammar).
  const grammars: unknown[] = [];
  const generate = service.engine.generate.bind(service.engine);
  service.engine.generate = ((...args: Parameters<typeof generate>) => {
    grammars.push(args[1].grammar);
    return generate(...args);
  }) as typeof generate;
  const server = createApp(service).listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  try {
    const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const post = async (path: string, body: unknown) => {
      const res = await fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
      const json = await res.json() as Record<string, unknown>;
      assert.equal(res.status, 200, JSON.stringify(json));
      return json;
    };

    const q = await post('/query', { query: QUESTION, max_new_tokens: MAX_TOKENS }) as { answer: string; citations: Cited[] };
    assert.ok(grammars[0] instanceof SpanAnswerGrammar, 'the /query generation ran under the span constraint');
    const cited = q.citations;
    assert.ok(cited.length > 0, 'chunks in the prompt');
    assert.ok(cited.some((c) => c.text.includes('atrm task-number')), `the retrieved chunks hold the command: ${JSON.stringify(cited.map((c) => c.title))}`);
    const answer = q.answer;
    assert.ok(answer.startsWith('`'), `mode first opens with a span: ${JSON.stringify(answer)}`);
    const spans = codeSpans(answer);
    assert.ok(spans.length >= 1, JSON.stringify(answer));
    for (const s of spans) {
      assert.ok(s.trim().length > 0 && s.length <= SPAN_MAX_CHARS && !/[\r\n]/.test(s), `span ${JSON.stringify(s)} in ${JSON.stringify(answer)}`);
      // The constraint's context is each cited chunk's title and text, one at a time (never across two).
      assert.ok(cited.some((c) => c.text.includes(s) || c.title.includes(s)), `span ${JSON.stringify(s)} is in no cited chunk: ${JSON.stringify(answer)}`);
    }

    // The same question as a grounded chat (the same prompt: the question as the one user message): no grammar.
    const chatBody = { model: path.basename(cfg.decoderPath), messages: [{ role: 'user', content: QUESTION }], rag: {}, temperature: 0, max_tokens: MAX_TOKENS };
    type Chat = { choices: { message: { content: string } }[]; citations: Cited[] };
    const chat = await post('/v1/chat/completions', chatBody) as Chat;
    assert.equal(grammars.length, 2);
    assert.equal(grammars[1], undefined, 'the chat generation ran unconstrained');
    assert.deepEqual(chat.citations.map((c) => c.text), cited.map((c) => c.text), 'the same chunks in the prompt');
    const content = chat.choices[0]!.message.content;
    assert.ok(content.length > 0);
    // Unchanged: the chat's answer is the one it gives with the constraint off (read per request).
    cfg.queryCopySpan = 'off';
    const off = await post('/v1/chat/completions', chatBody) as Chat;
    assert.equal(grammars[2], undefined);
    assert.equal(off.choices[0]!.message.content, content, 'the chat answer does not depend on RAGGUARD_QUERY_COPY_SPAN');
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
    await service.close();
  }
});
