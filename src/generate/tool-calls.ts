/**
 * Tool calling through a model's chat template: how the template asks for calls, what schema a forced
 * call follows, and the model's call text read back into OpenAI's `tool_calls` (whole, or as stream
 * deltas).
 *
 * Formats, told from the template's text:
 *   hermes  Qwen2.5's (and Hermes'): each call is `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.
 *   json    Llama 3.1/3.2's: the whole reply is one `{"name": ..., "parameters": {...}}`.
 * A template that does not take `tools` at all (the tests' tiny decoder's fallback) gets the tools in a
 * system message written in the hermes format, which the reply is then read in.
 *
 * A forced call (tool_choice required or a named function) is generated under a JSON schema (the
 * call's object: the name as a constant, the arguments as the function's parameters), after the
 * format's opening text put at the end of the prompt (hermes: `<tool_call>\n`), so the arguments
 * validate by construction. It is one call (parallel calls come only from tool_choice auto).
 */

export interface ToolFunction {
  name: string;
  description?: string;
  parameters?: Record<string, unknown>;
  strict?: boolean | null;
}

export type ToolChoice = 'none' | 'auto' | 'required' | { type: 'function'; function: { name: string } };

export type ToolFormat = 'hermes' | 'json';

export interface ParsedToolCall {
  name: string;
  /** The arguments as a JSON text (OpenAI's shape). */
  arguments: string;
}

const OPEN = '<tool_call>';
const CLOSE = '</tool_call>';

/** How a template writes calls, and whether it takes `tools` itself. */
export function toolFormatOf(template: string): { format: ToolFormat; native: boolean } {
  if (template.includes(OPEN)) return { format: 'hermes', native: true };
  if (/\btools\b/.test(template)) return { format: 'json', native: true };
  return { format: 'hermes', native: false };
}

/** The system text for a template without a tools format (hermes, as Qwen2.5's template writes it). */
export function toolSystemText(tools: readonly ToolFunction[]): string {
  return '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' +
    'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' +
    tools.map((t) => '\n' + JSON.stringify({ type: 'function', function: t })).join('') +
    '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n' +
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>';
}

const argsKey = (format: ToolFormat) => (format === 'json' ? 'parameters' : 'arguments');

/** The schema a forced call is generated under: one function (named) or any of them (required). */
export function forcedCallSchema(tools: readonly ToolFunction[], format: ToolFormat, name?: string): Record<string, unknown> {
  const one = (t: ToolFunction) => ({
    type: 'object',
    properties: { name: { const: t.name }, [argsKey(format)]: t.parameters ?? { type: 'object', properties: {}, additionalProperties: false } },
    required: ['name', argsKey(format)],
    additionalProperties: false,
  });
  const chosen = name === undefined ? tools : tools.filter((t) => t.name === name);
  return chosen.length === 1 ? one(chosen[0]!) : { anyOf: chosen.map(one) };
}

/** The text a forced call's generation continues from (put after the generation prompt). */
export function forcedCallOpening(format: ToolFormat): string {
  return format === 'hermes' ? `${OPEN}\n` : '';
}

/** A call object's fields, or undefined where `text` is not one. */
function callOf(text: string, format: ToolFormat): ParsedToolCall | undefined {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (!v || typeof v !== 'object' || Array.isArray(v)) return undefined;
  const o = v as Record<string, unknown>;
  const args = o[argsKey(format)] ?? o['arguments'] ?? o['parameters'];
  if (typeof o['name'] !== 'string' || !args || typeof args !== 'object' || Array.isArray(args)) return undefined;
  return { name: o['name'], arguments: JSON.stringify(args) };
}

/** A reply's calls and the text around them (null where there is none); a call that does not parse stays text. */
export function parseToolCalls(text: string, format: ToolFormat): { content: string | null; calls: ParsedToolCall[] } {
  if (format === 'json') {
    const call = callOf(text.trim(), format);
    return call ? { content: null, calls: [call] } : { content: text, calls: [] };
  }
  const calls: ParsedToolCall[] = [];
  let content = '';
  let at = 0;
  for (;;) {
    const open = text.indexOf(OPEN, at);
    if (open < 0) break;
    const close = text.indexOf(CLOSE, open);
    const body = text.slice(open + OPEN.length, close < 0 ? text.length : close);
    const call = callOf(body.trim(), format);
    if (!call) break;
    content += text.slice(at, open);
    calls.push(call);
    at = close < 0 ? text.length : close + CLOSE.length;
  }
  content += text.slice(at);
  const trimmed = content.trim();
  return { content: trimmed === '' && calls.length > 0 ? null : content, calls };
}

/** What a stream of reply text gives as it comes: text deltas, and calls (announced, then their arguments in pieces). */
export type ToolStreamEvent =
  | { kind: 'content'; text: string }
  | { kind: 'call'; index: number; name: string }
  | { kind: 'arguments'; index: number; text: string };

/**
 * Reads a reply's text as it is generated. Free (tool_choice auto): text passes as content, except a
 * tail that may begin a call's opening, held until it is told apart; a call is given whole once it is
 * closed and parses (a broken one is passed on as text). Forced: the text is one call object, whose
 * name is announced as soon as it is read and whose arguments are passed on as they come (the
 * grammar guarantees they complete), less a tail of closing braces and blanks that may be the call
 * object's own end.
 */
export class ToolCallStream {
  private buf = '';
  private index = 0;
  private argsFrom = -1;
  private sent = 0;
  private done = false;

  constructor(private readonly format: ToolFormat, private readonly forced: boolean) {}

  push(text: string): ToolStreamEvent[] {
    this.buf += text;
    return this.forced ? this.forcedEvents(false) : this.freeEvents(false);
  }

  finish(): ToolStreamEvent[] {
    return this.forced ? this.forcedEvents(true) : this.freeEvents(true);
  }

  private forcedEvents(end: boolean): ToolStreamEvent[] {
    if (this.done) return [];
    const out: ToolStreamEvent[] = [];
    if (this.argsFrom < 0) {
      const m = /^\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*/.exec(this.buf);
      if (!m) return end ? [{ kind: 'content', text: this.buf }] : [];
      out.push({ kind: 'call', index: 0, name: JSON.parse(m[1]!) as string });
      this.argsFrom = this.sent = m[0].length;
    }
    let upTo: number;
    if (end) {
      this.done = true;
      upTo = this.buf.trimEnd().length - 1; // the call object's closing brace
    } else {
      upTo = this.buf.length;
      while (upTo > this.sent && /[\s}]/.test(this.buf[upTo - 1]!)) upTo--;
    }
    if (upTo > this.sent) {
      out.push({ kind: 'arguments', index: 0, text: this.buf.slice(this.sent, upTo).trimEnd() });
      this.sent = upTo;
    }
    return out;
  }

  private freeEvents(end: boolean): ToolStreamEvent[] {
    const out: ToolStreamEvent[] = [];
    if (this.format === 'json') {
      // A reply that opens with '{' may be the call: held to the end.
      if (!end && /^\s*(\{|$)/.test(this.buf)) return out;
      const call = end ? callOf(this.buf.trim(), this.format) : undefined;
      if (call) return this.whole(call);
      if (this.buf) out.push({ kind: 'content', text: this.buf });
      this.buf = '';
      return out;
    }
    for (;;) {
      const open = this.buf.indexOf(OPEN);
      if (open < 0) {
        // Hold a tail that may be the start of an opening tag.
        let keep = end ? 0 : Math.min(OPEN.length - 1, this.buf.length);
        while (keep > 0 && !OPEN.startsWith(this.buf.slice(this.buf.length - keep))) keep--;
        const text = this.buf.slice(0, this.buf.length - keep);
        if (text) out.push({ kind: 'content', text });
        this.buf = this.buf.slice(this.buf.length - keep);
        return out;
      }
      if (open > 0) out.push({ kind: 'content', text: this.buf.slice(0, open) });
      this.buf = this.buf.slice(open);
      const close = this.buf.indexOf(CLOSE);
      if (close < 0 && !end) return out;
      const body = this.buf.slice(OPEN.length, close < 0 ? undefined : close);
      const call = callOf(body.trim(), this.format);
      const rest = close < 0 ? '' : this.buf.slice(close + CLOSE.length);
      if (call) out.push(...this.whole(call));
      else out.push({ kind: 'content', text: this.buf.slice(0, close < 0 ? undefined : close + CLOSE.length) });
      this.buf = rest;
      if (close < 0) return out;
    }
  }

  private whole(call: ParsedToolCall): ToolStreamEvent[] {
    const index = this.index++;
    return [{ kind: 'call', index, name: call.name }, { kind: 'arguments', index, text: call.arguments }];
  }
}
