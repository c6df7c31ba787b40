/**
 * Tools through a real model's chat template: Qwen2.5-Coder's (read from the default GGUF's metadata)
 * renders the tools, an assistant's calls and the tool's answer in its own format.
 */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { test } from 'node:test';
import { ChatTemplate } from '../src/generate/chat-template.js';
import type { TextTokenizer } from '../src/runtime/tokenizer.js';
import { GgufFile } from '../src/runtime/gguf.js';
import { planChat, StructuredOutputs } from '../src/server/structured.js';
import type { ChatCompletionBody } from '../src/server/schemas.js';
import { QWEN_05B_GGUF } from './helpers.js';

const GGUF = QWEN_05B_GGUF;

test('Qwen2.5\'s template writes the tools, the calls and the tool\'s answer (tool_choice auto)', { skip: existsSync(GGUF) ? false : `${GGUF} is missing: run npm run setup` }, async () => {
  const f = GgufFile.open(GGUF);
  const template = String(f.metadata.get('tokenizer.chat_template'));
  // Rendering reads only the tokenizer's configuration (its special tokens).
  const chat = new ChatTemplate({ config: {} } as unknown as TextTokenizer, undefined, { template, source: 'given' });
  const weather = { type: 'function' as const, function: { name: 'get_weather', description: 'Weather', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } };
  const body = {
    model: 'm', tools: [weather],
    messages: [
      { role: 'user', content: 'Weather in Oslo?' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Oslo"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: 'sunny' },
    ],
  } as unknown as ChatCompletionBody;
  // Nothing forced and no response_format: no grammar, so no vocabulary is needed.
  const plan = await planChat(body, chat, new StructuredOutputs({} as never));
  assert.deepEqual(plan.tools, { format: 'hermes', forced: false, named: false });
  assert.equal(plan.grammar, undefined);
  const text = chat.render(plan.messages, true, plan.extras);
  assert.ok(text.includes('<tools>\n{"type": "function", "function": {"name": "get_weather"'), text);
  assert.ok(text.includes('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'), text);
  assert.ok(text.includes('<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>'), text);
  assert.ok(text.endsWith('<|im_start|>assistant\n'));
});
