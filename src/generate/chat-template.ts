/**
 * Chat messages to prompt ids through the model's chat template: a Jinja template string, rendered
 * with @huggingface/jinja as transformers' apply_chat_template renders it (messages, bos_token,
 * eos_token, add_generation_prompt).
 *
 * Where the template comes from: one handed in (another source of metadata, such as a GGUF file's
 * `tokenizer.chat_template`), else tokenizer_config.json's `chat_template` (a string, or a list of
 * named templates, of which 'default' is taken), else FALLBACK_CHAT_TEMPLATE below.
 *
 * BOS: a template that writes `bos_token` itself gets it once (its text encodes to the BOS id); one
 * that does not gets the BOS id prepended only where the tokenizer adds one (tokenizer_config's
 * `add_bos_token`, or, where that is absent, a BOS the model declares).
 */
import { Template } from '@huggingface/jinja';
import type { TextTokenizer } from '../runtime/tokenizer.js';

export type ChatRole = 'system' | 'developer' | 'user' | 'assistant' | 'tool';

export interface ChatMessage {
  role: ChatRole;
  content: string;
  /** An assistant's calls; arguments as objects, as transformers' templates read them. */
  tool_calls?: readonly { id: string; type: 'function'; function: { name: string; arguments: unknown } }[];
  /** A tool message: the call it answers. */
  tool_call_id?: string;
}

/** What a render adds beyond the messages. */
export interface RenderExtras {
  /** OpenAI's tools, handed to a template that writes them (tool-calls.ts). */
  tools?: readonly object[];
  /** Text after the generation prompt (a forced tool call's opening). */
  suffix?: string;
}

/**
 * For a model without a chat template (the shipped tiny decoder has none): the question-and-answer
 * shape its RAG prompt uses (prompt.ts's default tail, "\nQuestion: ...\nAnswer:"), so a chat reads
 * as the text the model was trained to continue. System (and developer) messages come first as
 * plain lines; each user turn is a Question, each assistant turn an Answer.
 */
export const FALLBACK_CHAT_TEMPLATE =
  // Newlines as string literals: the renderer trims one after a block tag (as transformers' trim_blocks).
  "{% for m in messages %}{% if m.role == 'system' or m.role == 'developer' %}{{ m.content + '\\n' }}" +
  "{% elif m.role == 'user' %}{{ '\\nQuestion: ' + m.content + '\\n' }}{% else %}{{ 'Answer: ' + m.content + '\\n' }}{% endif %}{% endfor %}" +
  "{% if add_generation_prompt %}{{ 'Answer:' }}{% endif %}";

export interface ChatTemplateSource {
  template: string;
  /** 'tokenizer_config', 'given' (handed in) or 'fallback'. */
  source: 'tokenizer_config' | 'given' | 'fallback';
}

/** The template to use: handed in, else tokenizer_config.json's, else the fallback. */
export function chatTemplateFrom(config: Readonly<Record<string, unknown>>, given?: string): ChatTemplateSource {
  if (given) return { template: given, source: 'given' };
  const t = config['chat_template'];
  if (typeof t === 'string' && t.length > 0) return { template: t, source: 'tokenizer_config' };
  if (Array.isArray(t)) {
    // transformers' list form: [{name, template}], 'default' being the chat one.
    const named = t as { name?: unknown; template?: unknown }[];
    const d = named.find((x) => x.name === 'default') ?? named[0];
    if (d && typeof d.template === 'string') return { template: d.template, source: 'tokenizer_config' };
  }
  return { template: FALLBACK_CHAT_TEMPLATE, source: 'fallback' };
}

/** A special token's text from tokenizer_config.json (a string, or an AddedToken object with `content`). */
function tokenText(v: unknown): string | undefined {
  if (typeof v === 'string') return v;
  if (v && typeof v === 'object' && typeof (v as { content?: unknown }).content === 'string') return (v as { content: string }).content;
  return undefined;
}

/**
 * Whether a tokenizer adds BOS to what it encodes: tokenizer_config.json's `add_bos_token` where it
 * says, else yes when the model declares a BOS. Prompts get a BOS only where this holds (a Qwen2 or
 * SmolLM2 tokenizer adds none).
 */
export function tokenizerAddsBos(config: Readonly<Record<string, unknown>>, bosId: number | undefined): boolean {
  const add = config['add_bos_token'];
  return bosId !== undefined && (typeof add === 'boolean' ? add : true);
}

export class ChatTemplate {
  private readonly compiled: Template;
  readonly bosToken: string;
  readonly eosToken: string;
  /** Whether the tokenizer adds BOS to a text it encodes (so a rendered prompt starts with it). */
  readonly addsBos: boolean;

  constructor(
    private readonly tokenizer: TextTokenizer,
    private readonly bosId: number | undefined,
    readonly source: ChatTemplateSource,
  ) {
    this.compiled = new Template(source.template);
    const cfg = tokenizer.config;
    this.bosToken = tokenText(cfg['bos_token']) ?? '';
    this.eosToken = tokenText(cfg['eos_token']) ?? '';
    this.addsBos = tokenizerAddsBos(cfg, bosId);
  }

  static forModel(tokenizer: TextTokenizer, bosId: number | undefined, given?: string): ChatTemplate {
    return new ChatTemplate(tokenizer, bosId, chatTemplateFrom(tokenizer.config, given));
  }

  /** The rendered text (without a BOS the tokenizer would add). */
  render(messages: readonly ChatMessage[], addGenerationPrompt = true, extras: RenderExtras = {}): string {
    return this.compiled.render({
      messages: messages.map((m) => ({ role: m.role, content: m.content, ...(m.tool_calls ? { tool_calls: m.tool_calls } : {}),
        ...(m.tool_call_id !== undefined ? { tool_call_id: m.tool_call_id } : {}) })),
      bos_token: this.bosToken,
      eos_token: this.eosToken,
      add_generation_prompt: addGenerationPrompt,
      ...(extras.tools ? { tools: extras.tools } : {}),
    }) + (extras.suffix ?? '');
  }

  /** Prompt ids: the rendered text encoded, BOS first where the tokenizer adds one and the template did not write it. */
  encode(messages: readonly ChatMessage[], addGenerationPrompt = true, extras: RenderExtras = {}): number[] {
    const ids = this.tokenizer.encode(this.render(messages, addGenerationPrompt, extras));
    return this.withBos(ids);
  }

  /** A plain text prompt's ids (/v1/completions), BOS as the tokenizer adds it. */
  encodeText(text: string): number[] {
    return this.withBos(this.tokenizer.encode(text));
  }

  private withBos(ids: number[]): number[] {
    if (this.addsBos && this.bosId !== undefined && ids[0] !== this.bosId) return [this.bosId, ...ids];
    return ids;
  }
}
