/** Tool calls read from a model's text: whole replies and streams cut at every place, both formats. */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { forcedCallSchema, parseToolCalls, toolFormatOf, ToolCallStream, type ToolStreamEvent } from '../src/generate/tool-calls.js';

const HERMES = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>';

/** A stream's events folded into content and calls. */
function fold(events: ToolStreamEvent[]): { content: string; calls: { name: string; args: string }[] } {
  const out = { content: '', calls: [] as { name: string; args: string }[] };
  for (const e of events) {
    if (e.kind === 'content') out.content += e.text;
    else if (e.kind === 'call') out.calls[e.index] = { name: e.name, args: '' };
    else out.calls[e.index]!.args += e.text;
  }
  return out;
}

function streamIn(pieces: string[], format: 'hermes' | 'json', forced: boolean) {
  const s = new ToolCallStream(format, forced);
  return fold([...pieces.flatMap((p) => s.push(p)), ...s.finish()]);
}

describe('tool calls', () => {
  test('the format is told from the template', () => {
    assert.deepEqual(toolFormatOf('{{- "<tool_call>" }} {% if tools %}'), { format: 'hermes', native: true });
    assert.deepEqual(toolFormatOf('{%- if tools is not none %}{{ "parameters" }}{% endif %}'), { format: 'json', native: true });
    assert.deepEqual(toolFormatOf('{% for m in messages %}{{ m.content }}{% endfor %}'), { format: 'hermes', native: false });
  });

  test('hermes replies: calls read, the text around them kept, a broken call left as text', () => {
    const r = parseToolCalls(HERMES, 'hermes');
    assert.deepEqual(r.calls, [{ name: 'get_weather', arguments: '{"city":"Oslo","days":2}' }, { name: 'get_time', arguments: '{}' }]);
    assert.equal(r.content?.trim(), 'Let me check.');
    assert.deepEqual(parseToolCalls('<tool_call>\n{"name": "x"\n</tool_call>', 'hermes').calls, []);
    assert.deepEqual(parseToolCalls('no calls', 'hermes'), { content: 'no calls', calls: [] });
    assert.deepEqual(parseToolCalls(' {"name": "f", "parameters": {"a": 1}} ', 'json'), { content: null, calls: [{ name: 'f', arguments: '{"a":1}' }] });
  });

  test('a free stream cut anywhere gives the same calls and text as the whole reply', () => {
    const whole = parseToolCalls(HERMES, 'hermes');
    for (let cut = 1; cut < HERMES.length; cut++) {
      for (const size of [1, 3, 7]) {
        const pieces: string[] = [HERMES.slice(0, cut)];
        for (let k = cut; k < HERMES.length; k += size) pieces.push(HERMES.slice(k, k + size));
        const got = streamIn(pieces, 'hermes', false);
        assert.deepEqual(got.calls.map((c) => ({ name: c.name, arguments: c.args })), whole.calls, `cut ${cut} size ${size}`);
        assert.equal(got.content.trim(), whole.content?.trim());
      }
    }
    assert.deepEqual(streamIn(['<tool', '_ca', 'x'], 'hermes', false), { content: '<tool_cax', calls: [] });
  });

  test('a forced call streams its arguments as they come and reassembles to the call', () => {
    const text = '{"name": "get_weather", "arguments": {"city": "Oslo", "nested": {"a": [1, {}]}}  }';
    for (const size of [1, 2, 5]) {
      const s = new ToolCallStream('hermes', true);
      const events: ToolStreamEvent[] = [];
      for (let k = 0; k < text.length; k += size) events.push(...s.push(text.slice(k, k + size)));
      const beforeEnd = events.filter((e) => e.kind === 'arguments').length;
      events.push(...s.finish());
      const got = fold(events);
      assert.equal(got.calls.length, 1);
      assert.equal(got.calls[0]!.name, 'get_weather');
      assert.deepEqual(JSON.parse(got.calls[0]!.args), { city: 'Oslo', nested: { a: [1, {}] } });
      assert.ok(beforeEnd > 1, 'arguments stream before the end');
    }
  });

  test('a forced call\'s schema: the name constant and the parameters, one function or any of several', () => {
    const f = { name: 'f', parameters: { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] } };
    const g = { name: 'g' };
    assert.deepEqual(forcedCallSchema([f, g], 'hermes', 'f'), {
      type: 'object', properties: { name: { const: 'f' }, arguments: f.parameters }, required: ['name', 'arguments'], additionalProperties: false,
    });
    const any = forcedCallSchema([f, g], 'json') as { anyOf: { properties: Record<string, unknown> }[] };
    assert.equal(any.anyOf.length, 2);
    assert.ok('parameters' in any.anyOf[1]!.properties);
  });
});
