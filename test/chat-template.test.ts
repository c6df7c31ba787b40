/**
 * Chat templates: the fallback for the shipped decoder (which has none), a tokenizer_config.json
 * template rendered with @huggingface/jinja (ChatML and a Llama-2 style one that writes BOS itself),
 * one handed in, and BOS placed once, only where the tokenizer adds one.
 */
import assert from 'node:assert/strict';
import { copyFile, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, test } from 'node:test';
import { ChatTemplate, chatTemplateFrom, FALLBACK_CHAT_TEMPLATE, tokenizerAddsBos, type ChatMessage } from '../src/generate/chat-template.js';
import { TextTokenizer } from '../src/runtime/tokenizer.js';
import { ROOT, tempDir } from './helpers.js';

const DECODER = path.join(ROOT, 'models', 'decoder-gqa');
const BOS = 1;

const CHATML = "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
const LLAMA2 = "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}{{ '[INST] ' + m.content + ' [/INST]' }}" +
  "{% else %}{{ ' ' + m.content + eos_token }}{% endif %}{% endfor %}";

/** The shipped tokenizer with tokenizer_config.json's fields replaced by `patch`. */
async function tokenizerWith(patch: Record<string, unknown>): Promise<TextTokenizer> {
  const dir = await tempDir('ragguard-chat-');
  await copyFile(path.join(DECODER, 'tokenizer.json'), path.join(dir, 'tokenizer.json'));
  const config = JSON.parse(await readFile(path.join(DECODER, 'tokenizer_config.json'), 'utf8')) as Record<string, unknown>;
  await writeFile(path.join(dir, 'tokenizer_config.json'), JSON.stringify({ ...config, ...patch }));
  return TextTokenizer.load(dir);
}

const conversation: ChatMessage[] = [
  { role: 'system', content: 'Answer briefly.' },
  { role: 'user', content: 'What is apt?' },
  { role: 'assistant', content: 'A package tool.' },
  { role: 'user', content: 'And dpkg?' },
];

describe('chat templates', () => {
  test('the shipped decoder has none: the documented fallback, in the shape of its RAG prompt, BOS once', async () => {
    const tok = await TextTokenizer.load(DECODER);
    const t = ChatTemplate.forModel(tok, BOS);
    assert.equal(t.source.source, 'fallback');
    assert.equal(t.source.template, FALLBACK_CHAT_TEMPLATE);
    assert.equal(t.render(conversation), 'Answer briefly.\n\nQuestion: What is apt?\nAnswer: A package tool.\n\nQuestion: And dpkg?\nAnswer:');
    assert.equal(t.render(conversation, false).endsWith('Question: And dpkg?\n'), true);
    const ids = t.encode(conversation);
    assert.equal(ids[0], BOS);
    assert.equal(ids.filter((i) => i === BOS).length, 1);
    assert.deepEqual(ids.slice(1), tok.encode(t.render(conversation)));
  });

  test("tokenizer_config.json's chat_template (ChatML), add_generation_prompt", async () => {
    const tok = await tokenizerWith({ chat_template: CHATML });
    const t = ChatTemplate.forModel(tok, BOS);
    assert.equal(t.source.source, 'tokenizer_config');
    const msgs: ChatMessage[] = [{ role: 'user', content: 'hi' }];
    assert.equal(t.render(msgs), '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n');
    assert.equal(t.render(msgs, false), '<|im_start|>user\nhi<|im_end|>\n');
    assert.equal(t.encode(msgs)[0], BOS, 'the tokenizer adds BOS (add_bos_token): prepended');
  });

  test('a template that writes bos_token itself gets it once; eos_token is the config\'s', async () => {
    const tok = await tokenizerWith({ chat_template: LLAMA2 });
    const t = ChatTemplate.forModel(tok, BOS);
    const msgs: ChatMessage[] = [{ role: 'user', content: 'hi' }, { role: 'assistant', content: 'hello' }, { role: 'user', content: 'bye' }];
    assert.equal(t.render(msgs), '<s>[INST] hi [/INST] hello</s>[INST] bye [/INST]');
    const ids = t.encode(msgs);
    assert.equal(ids[0], BOS);
    assert.notEqual(ids[1], BOS, 'not doubled');
  });

  test('no BOS where the tokenizer adds none', async () => {
    const tok = await tokenizerWith({ chat_template: CHATML, add_bos_token: false });
    const ids = ChatTemplate.forModel(tok, BOS).encode([{ role: 'user', content: 'hi' }]);
    assert.notEqual(ids[0], BOS);
    assert.deepEqual(ids, tok.encode('<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n'));
  });

  test('a template handed in (e.g. from GGUF metadata) wins; the list form picks "default"', async () => {
    const tok = await tokenizerWith({ chat_template: LLAMA2 });
    assert.equal(ChatTemplate.forModel(tok, BOS, CHATML).source.source, 'given');
    assert.equal(ChatTemplate.forModel(tok, BOS, CHATML).render([{ role: 'user', content: 'x' }]), '<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n');
    const listed = chatTemplateFrom({ chat_template: [{ name: 'tool_use', template: 'T' }, { name: 'default', template: CHATML }] });
    assert.deepEqual(listed, { template: CHATML, source: 'tokenizer_config' });
  });
});

test('a prompt gets a BOS only where the tokenizer adds one (tokenizer_config add_bos_token, else a declared BOS)', () => {
  assert.equal(tokenizerAddsBos({ add_bos_token: false }, 1), false); // Qwen2's and SmolLM2's tokenizers
  assert.equal(tokenizerAddsBos({ add_bos_token: true }, 1), true);
  assert.equal(tokenizerAddsBos({}, 1), true);
  assert.equal(tokenizerAddsBos({ add_bos_token: true }, undefined), false); // no BOS token at all
});
