import assert from 'node:assert/strict';
import path from 'node:path';
import { before, test } from 'node:test';
import { chatContextPrompt } from '../src/generate/chat-prompt.js';
import { ChatTemplate } from '../src/generate/chat-template.js';
import { assemblePrompt, DEFAULT_TEMPLATE, GROUNDED_EXAMPLE, GROUNDED_SYSTEM, PromptTooLongError, templateFromConfig, type ContextChunk } from '../src/generate/prompt.js';
import { TextTokenizer } from '../src/runtime/tokenizer.js';
import { ROOT } from './helpers.js';

let tok: TextTokenizer;
const BOS = 1;
const words = (n: number, w = 'word') => Array.from({ length: n }, (_, i) => `${w}${i}`).join(' ');

before(async () => {
  tok = await TextTokenizer.load(path.join(ROOT, 'models', 'decoder'));
});

test('the shipped decoder carries the template it was trained on', () => {
  assert.deepEqual(templateFromConfig(tok.config), DEFAULT_TEMPLATE);
  assert.deepEqual(templateFromConfig({}), DEFAULT_TEMPLATE);
});

test('segments are encoded separately and concatenated in citation order', () => {
  const chunks: ContextChunk[] = [{ title: 'A', text: 'alpha text' }, { title: 'B', text: 'beta text' }];
  const p = assemblePrompt(tok, DEFAULT_TEMPLATE, BOS, 'why?', chunks, 500);
  const expected = [
    BOS,
    ...tok.encode('Context:\n'),
    ...tok.encode('[1] '), ...tok.encode('A: alpha text\n'),
    ...tok.encode('[2] '), ...tok.encode('B: beta text\n'),
    ...tok.encode('\nQuestion: why?\nAnswer:'),
  ];
  assert.deepEqual(p.ids, expected);
  assert.deepEqual(p.included, [0, 1]);
  assert.equal(tok.decode(p.ids), 'Context:\n[1] A: alpha text\n[2] B: beta text\n\nQuestion: why?\nAnswer:');
});

test('the budget is never exceeded; a chunk that does not fit gives way to a smaller one', () => {
  const chunks: ContextChunk[] = [
    { title: 'one', text: words(40) },
    { title: 'two', text: words(150, 'big') },
    { title: 'three', text: words(10) },
  ];
  const budget = 160;
  const p = assemblePrompt(tok, DEFAULT_TEMPLATE, BOS, 'q', chunks, budget);
  assert.ok(p.ids.length <= budget, `${p.ids.length} > ${budget}`);
  assert.deepEqual(p.included, [0, 2]);
  assert.deepEqual(p.truncated, []);
});

test('each body is cut to bodyMaxTokens; a lone first chunk is cut to fit rather than dropped', () => {
  const big = [{ title: 'big', text: words(400) }];
  const p = assemblePrompt(tok, DEFAULT_TEMPLATE, BOS, 'q', big, 1000);
  const fixed = 1 + tok.encode('Context:\n').length + tok.encode('\nQuestion: q\nAnswer:').length + tok.encode('[1] ').length;
  assert.equal(p.ids.length, fixed + DEFAULT_TEMPLATE.bodyMaxTokens);
  const tight = assemblePrompt(tok, DEFAULT_TEMPLATE, BOS, 'q', big, 60);
  assert.equal(tight.ids.length, 60);
  assert.deepEqual(tight.included, [0]);
  assert.deepEqual(tight.truncated, [0]);
});

test('a question that cannot fit the budget is an error, not a silent cut', () => {
  assert.throws(() => assemblePrompt(tok, DEFAULT_TEMPLATE, BOS, words(100), [], 50), PromptTooLongError);
});

test('a chat prompt opens its system message with the template\'s instruction, then the numbered context, then the worked example', async () => {
  const chat = ChatTemplate.forModel(tok, BOS); // the fallback template: system lines as they are
  const chunks: ContextChunk[] = [{ title: 'A', text: 'alpha text' }, { title: 'B', text: 'beta text' }];
  const user = [{ role: 'user' as const, content: 'why?' }];
  const shot = [{ role: 'user' as const, content: GROUNDED_EXAMPLE.question }, { role: 'assistant' as const, content: GROUNDED_EXAMPLE.answer }];
  const p = await chatContextPrompt(chat, DEFAULT_TEMPLATE, user, chunks, 500);
  const context = 'Context:\n[1] A: alpha text\n[2] B: beta text';
  assert.deepEqual(p.ids, chat.encode([{ role: 'system', content: `${GROUNDED_SYSTEM}\n\n${context}` }, ...shot, ...user]));
  assert.deepEqual(p.included, [0, 1]);
  // '' (a model's ragguard_prompt.system) leaves the context alone in the system message; example null, no example.
  const bare = templateFromConfig({ ragguard_prompt: { system: '', example: null } });
  assert.equal(bare.system, '');
  assert.equal(bare.example, null);
  assert.deepEqual((await chatContextPrompt(chat, bare, user, chunks, 500)).ids, chat.encode([{ role: 'system', content: context }, ...user]));
  // A model's own example replaces the default one; none given, the default stands.
  assert.deepEqual(templateFromConfig({ ragguard_prompt: { example: { question: 'q?', answer: 'a.' } } }).example, { question: 'q?', answer: 'a.' });
  assert.deepEqual(templateFromConfig({ ragguard_prompt: { system: 'x' } }).example, GROUNDED_EXAMPLE);
  // The instruction and the example count against the budget like the rest.
  const tight = chat.encode([{ role: 'system', content: `${GROUNDED_SYSTEM}\n\nContext:\n[1] A: alpha text` }, ...shot, ...user]).length;
  assert.deepEqual((await chatContextPrompt(chat, DEFAULT_TEMPLATE, user, chunks, tight)).included, [0]);
});

test('a chat prompt takes every chunk in one encoding where all fit, else searches chunk by chunk with a turn between encodings', async () => {
  const chat = ChatTemplate.forModel(tok, BOS);
  const user = [{ role: 'user' as const, content: 'why?' }];
  const big: ContextChunk = { title: 'Big', text: words(200, 'big') };
  const small: ContextChunk = { title: 'S', text: 'small text' };
  let turns = 0;
  const between = async () => void turns++;
  const all = await chatContextPrompt(chat, DEFAULT_TEMPLATE, user, [small, big], 5000, between);
  assert.deepEqual(all.included, [0, 1]);
  assert.equal(turns, 0, 'one encoding, no search');
  // The big one does not fit: it gives way to the smaller one after it, the same prompt as that one alone.
  const onlySmall = (await chatContextPrompt(chat, DEFAULT_TEMPLATE, user, [small], 5000)).ids;
  const p = await chatContextPrompt(chat, DEFAULT_TEMPLATE, user, [big, small], onlySmall.length, between);
  assert.deepEqual(p.included, [1]);
  assert.deepEqual(p.ids, onlySmall);
  assert.ok(turns >= 2, `a turn between the search's encodings (${turns})`);
});
