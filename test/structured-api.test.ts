/**
 * Structured outputs and tool calls through the real app on loopback with the official `openai`
 * client (the tests' small decoder, whose chat template has no tools format: the tools go in a
 * system message in the hermes format): json_schema replies that parse and validate, alone and in a
 * batch mixed with free requests; a schema outside the subset refused naming the keyword; a named
 * tool_choice giving a call whose arguments validate; streamed calls reassembled; /query's schema.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import OpenAI from 'openai';
import type { Config } from '../src/config/config.js';
import { advanceText, initialState } from '../src/generate/structured/json-automaton.js';
import { anyObjectSchema, validates } from '../src/generate/structured/json-schema.js';
import type { RagService } from '../src/service/rag.js';
import { openaiFixture, type OpenAiFixture } from './openai-fixture.js';

let fx: OpenAiFixture;
let cfg: Config;
let service: RagService;
let base: string;
let client: OpenAI;
const MODEL = 'decoder-gqa';

before(async () => {
  fx = await openaiFixture(['apt-cache', 'quotas']);
  ({ cfg, service, base, client } = fx);
});

after(() => fx.close());

/** JSON.parse, failing with the text. */
function parse(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new Error(`${(e as Error).message}: ${JSON.stringify(text)}`);
  }
}

const post = (path: string, body: unknown) => fx.post(path, body);

/**
 * Schemas without free strings: the small decoder, trained on prose, writes a string until max_tokens
 * (the grammar lets it); enums, numbers, booleans and lists it closes. Free strings are the bench's
 * (bench/structured.ts, on the default model).
 */
const SCHEMAS: Record<string, unknown>[] = [
  { type: 'object', properties: { answer: { enum: ['yes', 'no', 'unsure'] }, confidence: { type: 'number' } }, required: ['answer', 'confidence'], additionalProperties: false },
  { type: 'object', properties: { yes: { type: 'boolean' }, count: { type: 'integer' }, unit: { enum: ['kb', 'mb', 'gb'] } }, required: ['yes', 'count', 'unit'], additionalProperties: false },
  { type: 'object', properties: { citations: { type: 'array', items: { type: 'integer' } }, note: { type: ['null', 'boolean'] } }, required: ['citations', 'note'], additionalProperties: false },
  { type: 'object', properties: { step: { type: 'object', properties: { cmd: { enum: ['apt-cache search', 'quota -v', 'repquota'] }, sudo: { type: 'boolean' } }, required: ['cmd', 'sudo'], additionalProperties: false }, level: { type: 'integer' } }, required: ['step'], additionalProperties: false },
  { anyOf: [{ type: 'array', items: { enum: [1, 2, 3] } }, { type: 'object', properties: { none: { type: 'null' } }, required: ['none'], additionalProperties: false }] },
];
const QUESTIONS = ['How do I search the apt cache?', 'What does a disk quota limit?', 'Which command shows package details?', 'How are quotas reported?'];

async function structured(k: number, maxTokens = 200) {
  const schema = SCHEMAS[k % SCHEMAS.length]!;
  const r = await client.chat.completions.create({
    model: MODEL, max_tokens: maxTokens, temperature: 1, seed: k,
    messages: [{ role: 'user', content: QUESTIONS[k % QUESTIONS.length]! }],
    response_format: { type: 'json_schema', json_schema: { name: `s${k % SCHEMAS.length}`, schema, strict: true } },
  });
  return { schema, choice: r.choices[0]! };
}

describe('response_format', () => {
  test('json_schema replies parse and validate for varied prompts and schemas, one at a time', async () => {
    for (let k = 0; k < 8; k++) {
      const { schema, choice } = await structured(k);
      assert.equal(choice.finish_reason, 'stop', choice.message.content ?? '');
      assert.ok(validates(parse(choice.message.content!), schema), choice.message.content!);
    }
  });

  test('in a batch mixed with free requests, the constrained rows validate and the free ones are left free', async () => {
    const free = (k: number) => client.chat.completions.create({
      model: MODEL, max_tokens: 24, temperature: 1, seed: 100 + k, messages: [{ role: 'user', content: QUESTIONS[k % QUESTIONS.length]! }],
    });
    const [constrained, frees] = await Promise.all([
      Promise.all([0, 1, 2, 3, 4, 5].map((k) => structured(20 + k))),
      Promise.all([0, 1, 2, 3].map(free)),
    ]);
    for (const { schema, choice } of constrained) {
      assert.equal(choice.finish_reason, 'stop');
      assert.ok(validates(parse(choice.message.content!), schema), choice.message.content!);
    }
    // The small decoder's free text is prose: at least one of the free replies is not JSON.
    assert.ok(frees.some((r) => { try { JSON.parse(r.choices[0]!.message.content!); return false; } catch { return true; } }));
    assert.ok(service.engine.stats.decodeRows > 0);
  });

  test('/v1/completions takes response_format too, streamed: the chunks join into a reply that validates', async () => {
    const schema = SCHEMAS[1]!;
    const stream = await client.completions.create({
      model: MODEL, prompt: 'Question: How big is the apt cache?\nAnswer:', max_tokens: 200, temperature: 1, seed: 2, stream: true,
      response_format: { type: 'json_schema', json_schema: { name: 'size', schema } },
    } as OpenAI.CompletionCreateParamsStreaming);
    let text = '';
    let finish: string | null = null;
    for await (const c of stream) {
      text += c.choices[0]?.text ?? '';
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(finish, 'stop');
    assert.ok(validates(parse(text.trim()), schema), text);
  });

  test('json_object: an object; max_tokens below the schema\'s shortest document ends with finish_reason length', async () => {
    const r = await client.chat.completions.create({ model: MODEL, max_tokens: 200, temperature: 1, seed: 5, messages: [{ role: 'user', content: 'Describe apt.' }], response_format: { type: 'json_object' } });
    const text = r.choices[0]!.message.content!;
    // The small decoder writes a long key; cut or not, what it wrote is the start of a JSON object.
    assert.ok(advanceText(initialState(anyObjectSchema().root), text).length > 0 && text.startsWith('{'), text);
    if (r.choices[0]!.finish_reason === 'stop') assert.equal(typeof JSON.parse(text), 'object');
    const cut = await client.chat.completions.create({ model: MODEL, max_tokens: 3, temperature: 1, seed: 5, messages: [{ role: 'user', content: 'Describe apt.' }], response_format: { type: 'json_schema', json_schema: { name: 'x', schema: SCHEMAS[0]! } } });
    assert.equal(cut.choices[0]!.finish_reason, 'length');
    assert.ok(cut.choices[0]!.message.content!.startsWith('{'));
  });

  test('json_schema with free strings closes within max_tokens: a whole document, finish_reason stop', async () => {
    // The small decoder, trained on prose, would write the summary until max_tokens; the budget ends it in time.
    const schema = { type: 'object', properties: { summary: { type: 'string' }, tags: { type: 'array', items: { type: 'string' } } }, required: ['summary', 'tags'], additionalProperties: false };
    let steered = 0;
    for (const [maxTokens, seed] of [[24, 1], [40, 2], [64, 3]] as const) {
      const r = await client.chat.completions.create({ model: MODEL, max_tokens: maxTokens, temperature: 1, seed, messages: [{ role: 'user', content: 'Describe apt-cache.' }],
        response_format: { type: 'json_schema', json_schema: { name: 'summary', schema, strict: true } } });
      const text = r.choices[0]!.message.content!;
      assert.equal(r.choices[0]!.finish_reason, 'stop', `max_tokens ${maxTokens}: ${text}`);
      assert.ok(r.usage!.completion_tokens <= maxTokens, `${r.usage!.completion_tokens} tokens under max_tokens ${maxTokens}`);
      assert.ok(validates(parse(text), schema), text);
      // A reply the budget shaped says so (the schema allowed a longer summary).
      const extra = (r.choices[0] as { ragguard?: unknown }).ragguard;
      if (extra !== undefined) assert.deepEqual(extra, { steered_to_close: true });
      if (extra !== undefined) steered++;
    }
    assert.ok(steered > 0, 'the budget shaped a reply at the tighter max_tokens');
  });

  test('a schema outside the supported subset is refused with 400 naming the keyword', async () => {
    const res = await post('/v1/chat/completions', {
      model: MODEL, messages: [{ role: 'user', content: 'hi' }],
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { d: { type: 'string', format: 'date-time' } } } } },
    });
    assert.equal(res.status, 400);
    const body = await res.json() as { error: { code: string; message: string; param: string; keyword: string } };
    assert.equal(body.error.code, 'unsupported_schema');
    assert.equal(body.error.keyword, 'format');
    assert.match(body.error.message, /'format'/);
    assert.equal(body.error.param, 'response_format.json_schema.schema.properties.d');
  });

  test('/query takes a response_format: an answer and the citation numbers it used', async () => {
    const schema = { type: 'object', properties: { answer: { type: 'string' }, citations: { type: 'array', items: { type: 'integer' } } }, required: ['answer', 'citations'], additionalProperties: false };
    const res = await post('/query', { query: 'How do I search the apt cache?', max_new_tokens: 200, temperature: 1, seed: 3, response_format: { type: 'json_schema', json_schema: { name: 'cited', schema } } });
    assert.equal(res.status, 200);
    const body = await res.json() as { answer: string; finish_reason: string };
    assert.equal(body.finish_reason, 'stop');
    assert.ok(validates(JSON.parse(body.answer), schema), body.answer);
    // A tight max_new_tokens (the shortest document is 27 tokens of this tokenizer's): the answer string ends
    // early so that the JSON closes, and the reply says so.
    const tight = await post('/query', { query: 'How do I search the apt cache?', max_new_tokens: 40, temperature: 1, seed: 3, response_format: { type: 'json_schema', json_schema: { name: 'cited', schema } } });
    const short = await tight.json() as { answer: string; finish_reason: string; usage: { completion_tokens: number }; steered_to_close?: boolean };
    assert.equal(short.finish_reason, 'stop', short.answer);
    assert.ok(short.usage.completion_tokens <= 40);
    assert.ok(validates(JSON.parse(short.answer), schema), short.answer);
    assert.equal(short.steered_to_close, true, short.answer);
  });
});

const WEATHER = {
  type: 'function' as const,
  function: {
    name: 'get_weather', description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { enum: ['Oslo', 'Rome', 'Lima'] }, unit: { enum: ['c', 'f'] }, days: { type: 'integer' } }, required: ['city', 'unit', 'days'], additionalProperties: false },
  },
};
const QUOTA = {
  type: 'function' as const,
  function: { name: 'set_quota', parameters: { type: 'object', properties: { user: { enum: ['alice', 'bob'] }, mb: { type: 'integer' }, hard: { type: 'boolean' } }, required: ['user', 'mb'], additionalProperties: false } },
};

describe('tool calls', () => {
  test('tool_choice naming a function gives one parsed call whose arguments validate', async () => {
    for (let k = 0; k < 4; k++) {
      const r = await client.chat.completions.create({
        model: MODEL, max_tokens: 200, temperature: 1, seed: k, tools: [WEATHER, QUOTA],
        tool_choice: { type: 'function', function: { name: k % 2 ? 'set_quota' : 'get_weather' } },
        messages: [{ role: 'user', content: 'What is the weather in Oslo?' }],
      });
      const c = r.choices[0]!;
      assert.equal(c.finish_reason, 'stop');
      assert.equal(c.message.tool_calls?.length, 1);
      const call = c.message.tool_calls![0]!;
      assert.ok(call.type === 'function');
      const fn = k % 2 ? QUOTA : WEATHER;
      assert.equal(call.function.name, fn.function.name);
      assert.match(call.id, /^call_/);
      assert.ok(validates(JSON.parse(call.function.arguments), fn.function.parameters), call.function.arguments);
    }
  });

  test('tool_choice required: a call of one of the tools (finish_reason tool_calls); a tool message is taken back', async () => {
    const r = await client.chat.completions.create({
      model: MODEL, max_tokens: 200, temperature: 1, seed: 9, tools: [WEATHER, QUOTA], tool_choice: 'required',
      messages: [{ role: 'user', content: 'Give alice 100 MB.' }],
    });
    const c = r.choices[0]!;
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
    const call = c.message.tool_calls![0]!;
    assert.ok(call.type === 'function');
    const fn = [WEATHER, QUOTA].find((t) => t.function.name === call.function.name)!;
    assert.ok(validates(JSON.parse(call.function.arguments), fn.function.parameters));
    const back = await client.chat.completions.create({
      model: MODEL, max_tokens: 8, temperature: 0, tools: [WEATHER, QUOTA],
      messages: [{ role: 'user', content: 'Give alice 100 MB.' }, c.message, { role: 'tool', tool_call_id: call.id, content: 'done' }],
    });
    assert.ok(['stop', 'length', 'tool_calls'].includes(back.choices[0]!.finish_reason));
  });

  test('streamed tool calls reassemble into the call a plain reply gives', async () => {
    const body = {
      model: MODEL, max_tokens: 200, temperature: 1, seed: 4, tools: [WEATHER],
      tool_choice: { type: 'function' as const, function: { name: 'get_weather' } },
      messages: [{ role: 'user' as const, content: 'Weather in Rome for 3 days?' }],
    };
    const plain = await client.chat.completions.create(body);
    const stream = await client.chat.completions.create({ ...body, stream: true });
    const calls: { id?: string; name?: string; args: string }[] = [];
    let finish: string | null = null;
    let chunks = 0;
    for await (const chunk of stream) {
      const ch = chunk.choices[0];
      if (!ch) continue;
      finish = ch.finish_reason ?? finish;
      for (const d of ch.delta.tool_calls ?? []) {
        chunks++;
        const c = (calls[d.index] ??= { args: '' });
        if (d.id) c.id = d.id;
        if (d.function?.name) c.name = d.function.name;
        c.args += d.function?.arguments ?? '';
      }
    }
    assert.equal(finish, 'stop');
    assert.equal(calls.length, 1);
    assert.ok(chunks > 2, `${chunks} tool_calls deltas`);
    assert.equal(calls[0]!.name, 'get_weather');
    assert.match(calls[0]!.id!, /^call_/);
    const expected = plain.choices[0]!.message.tool_calls![0]!;
    assert.ok(expected.type === 'function');
    assert.deepEqual(JSON.parse(calls[0]!.args), JSON.parse(expected.function.arguments));
  });

  test('tool_choice naming a function that is not among tools is refused', async () => {
    const res = await post('/v1/chat/completions', { model: MODEL, messages: [{ role: 'user', content: 'hi' }], tools: [WEATHER], tool_choice: { type: 'function', function: { name: 'nope' } } });
    assert.equal(res.status, 400);
    assert.match(((await res.json()) as { error: { message: string } }).error.message, /nope/);
  });
});
