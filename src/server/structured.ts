/**
 * The requests' structured-output fields as the engine takes them, and the model's reply back in
 * OpenAI's shapes: response_format and a forced tool call are handed to the grammar compiler
 * (generate/structured/grammars.ts), its refusals said in HTTP here; tools and tool_choice become the
 * messages and template extras of a chat (tool-calls.ts); the reply's text becomes OpenAI's message,
 * tool calls and stream deltas.
 */
import { randomBytes } from 'node:crypto';
import type { ChatMessage, ChatTemplate, RenderExtras } from '../generate/chat-template.js';
import type { ModelRunner } from '../generate/model-runner.js';
import {
  ConstrainedDecodingUnavailableError, GrammarCompiler, SchemaNotSupportedError, type OutputFormat,
} from '../generate/structured/grammars.js';
import type { TokenGrammar } from '../generate/structured/token-mask.js';
import {
  forcedCallOpening, parseToolCalls, toolFormatOf, toolSystemText, ToolCallStream,
  type ParsedToolCall, type ToolFormat, type ToolFunction, type ToolStreamEvent,
} from '../generate/tool-calls.js';
import { HttpError } from './errors.js';
import type { ChatCompletionBody } from './schemas.js';

export type ResponseFormat = NonNullable<ChatCompletionBody['response_format']>;

/** The grammar compiler's refusals in HTTP: 400 naming the schema's keyword, 422 for a decoder without constrained decoding. */
function asHttp(e: unknown): unknown {
  if (e instanceof SchemaNotSupportedError) return new HttpError(400, 'unsupported_schema', e.message, { param: e.at, keyword: e.keyword });
  if (e instanceof ConstrainedDecodingUnavailableError) return new HttpError(422, 'unsupported_sampling', e.message);
  return e;
}

/** The routes' grammars: the compiler's, with its refusals as HTTP errors. */
export class StructuredOutputs {
  private readonly compiler: GrammarCompiler;

  constructor(runner: Pick<ModelRunner, 'tokenizer' | 'eosIds' | 'shape'>) {
    this.compiler = new GrammarCompiler(runner);
  }

  /** Starts building the vocabulary (a failure is reported to the request that needs it). */
  warm(): void {
    this.compiler.warm();
  }

  /** The grammar of a response_format (undefined for text or none). */
  forFormat(f: ResponseFormat | OutputFormat | undefined): Promise<TokenGrammar | undefined> {
    return this.compiler.forFormat(f).catch((e: unknown) => { throw asHttp(e); });
  }

  /** The grammar of a JSON schema; a 400 naming the keyword where it is outside the supported subset. */
  forSchema(schema: unknown, param: string): Promise<TokenGrammar> {
    return this.compiler.forSchema(schema, param).catch((e: unknown) => { throw asHttp(e); });
  }

  /** The grammar of a forced call to one of `tools` (to `name` where the request names it). */
  forToolCall(tools: readonly ToolFunction[], format: ToolFormat, name?: string): Promise<TokenGrammar> {
    return this.compiler.forToolCall(tools, format, name).catch((e: unknown) => { throw asHttp(e); });
  }
}

type BodyMessage = ChatCompletionBody['messages'][number];

/** A message's text: a string, or its text parts joined. */
const textOf = (c: string | { text: string }[] | null | undefined) => (c == null ? '' : typeof c === 'string' ? c : c.map((p) => p.text).join(''));

/** Arguments as an object where they parse (transformers' templates write them with tojson). */
function argumentsValue(a: string): unknown {
  try {
    return JSON.parse(a);
  } catch {
    return a;
  }
}

/** A chat request as the engine runs it: messages, template extras, grammar, and how to read the reply's calls. */
export interface ChatPlan {
  messages: ChatMessage[];
  extras: RenderExtras;
  grammar?: TokenGrammar;
  /** Present where the reply is read for tool calls. */
  tools?: { format: ToolFormat; forced: boolean; named: boolean };
}

export async function planChat(b: ChatCompletionBody, chat: ChatTemplate, outputs: StructuredOutputs): Promise<ChatPlan> {
  const choice = b.tool_choice ?? (b.tools ? 'auto' : 'none');
  if (b.tool_choice !== undefined && b.tool_choice !== 'none' && !b.tools) {
    throw new HttpError(400, 'invalid_body', 'tool_choice needs tools', { param: 'tool_choice' });
  }
  const fns: ToolFunction[] = (b.tools ?? []).map((t) => t.function);
  const named = typeof choice === 'object' ? choice.function.name : undefined;
  if (named !== undefined && !fns.some((f) => f.name === named)) {
    throw new HttpError(400, 'invalid_body', `tool_choice names '${named}', which is not among tools`, { param: 'tool_choice' });
  }
  const forced = choice === 'required' || named !== undefined;
  if (forced && b.response_format && b.response_format.type !== 'text') {
    throw new HttpError(400, 'invalid_body', 'response_format cannot be combined with a forced tool call (tool_choice required or named): the call has its own schema', { param: 'response_format' });
  }
  if (b.rag && b.tools && choice !== 'none') throw new HttpError(400, 'invalid_body', 'tools cannot be combined with the rag extension', { param: 'tools' });
  const useTools = b.tools !== undefined && choice !== 'none';
  const { format, native } = toolFormatOf(chat.source.template);
  const messages: ChatMessage[] = b.messages.map((m: BodyMessage) => {
    if (m.role === 'assistant' && m.tool_calls?.length) {
      if (native) {
        return { role: 'assistant', content: textOf(m.content), tool_calls: m.tool_calls.map((c) => ({ ...c, function: { name: c.function.name, arguments: argumentsValue(c.function.arguments) } })) };
      }
      const calls = m.tool_calls.map((c) => `<tool_call>\n${JSON.stringify({ name: c.function.name, arguments: argumentsValue(c.function.arguments) })}\n</tool_call>`);
      return { role: 'assistant', content: [textOf(m.content), ...calls].filter(Boolean).join('\n') };
    }
    if (m.role === 'tool') {
      return native ? { role: 'tool', content: textOf(m.content), tool_call_id: m.tool_call_id }
        : { role: 'user', content: `<tool_response>\n${textOf(m.content)}\n</tool_response>` };
    }
    return { role: m.role, content: textOf(m.content) };
  });
  const plan: ChatPlan = { messages, extras: {} };
  if (useTools) {
    if (native) plan.extras.tools = b.tools;
    else {
      const sys = toolSystemText(fns);
      const first = messages[0];
      if (first && (first.role === 'system' || first.role === 'developer')) messages[0] = { ...first, content: `${first.content}\n\n${sys}` };
      else messages.unshift({ role: 'system', content: sys });
    }
    plan.tools = { format, forced, named: named !== undefined };
  }
  if (forced) {
    plan.grammar = await outputs.forToolCall(fns, format, named);
    plan.extras.suffix = forcedCallOpening(format);
  } else {
    plan.grammar = await outputs.forFormat(b.response_format);
  }
  return plan;
}

const callId = () => `call_${randomBytes(12).toString('hex')}`;

export interface OpenAiToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

/** A reply's message and finish reason, with its tool calls read (tools asked for) or as text. */
export function replyMessage(text: string, finish: string, tools: ChatPlan['tools']): { message: Record<string, unknown>; finishReason: string } {
  if (!tools) return { message: { role: 'assistant', content: text, refusal: null }, finishReason: finish };
  // A forced call's text is the call object alone (its opening was in the prompt).
  const { content, calls } = parseToolCalls(text, tools.forced ? 'json' : tools.format);
  if (calls.length === 0) return { message: { role: 'assistant', content: text, refusal: null }, finishReason: finish };
  const toolCalls: OpenAiToolCall[] = calls.map((c: ParsedToolCall) => ({ id: callId(), type: 'function', function: c }));
  // OpenAI: 'tool_calls' where the model chose to call, 'stop' for a call the request named.
  return { message: { role: 'assistant', content, refusal: null, tool_calls: toolCalls }, finishReason: finish === 'length' ? 'length' : tools.named ? 'stop' : 'tool_calls' };
}

/** Stream deltas for a reply read for tool calls: content deltas and OpenAI's tool_calls deltas. */
export class ToolDeltas {
  private readonly stream: ToolCallStream;
  private readonly ids: string[] = [];
  called = false;

  constructor(private readonly tools: NonNullable<ChatPlan['tools']>) {
    this.stream = new ToolCallStream(tools.forced ? 'json' : tools.format, tools.forced);
  }

  /** The deltas for more text (null: the end). */
  deltas(text: string | null): Record<string, unknown>[] {
    const events = text === null ? this.stream.finish() : this.stream.push(text);
    return events.map((e: ToolStreamEvent) => {
      if (e.kind === 'content') return { content: e.text };
      this.called = true;
      if (e.kind === 'call') {
        this.ids[e.index] = callId();
        return { tool_calls: [{ index: e.index, id: this.ids[e.index], type: 'function', function: { name: e.name, arguments: '' } }] };
      }
      return { tool_calls: [{ index: e.index, function: { arguments: e.text } }] };
    });
  }

  finishReason(finish: string): string {
    if (!this.called || finish === 'length') return finish;
    return this.tools.named ? 'stop' : 'tool_calls';
  }
}
