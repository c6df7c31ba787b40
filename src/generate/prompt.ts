/**
 * Prompt assembly inside a token budget.
 *
 * The prompt is a concatenation of separately encoded segments,
 *   <bos> head (marker body)* tail
 * so every chunk's token cost is known exactly before it is placed, and the decoder sees the same
 * segmentation it was trained on. Chunks go in rank order; one that does not fit is skipped for a
 * smaller one further down; the first chunk is cut to fit rather than leaving the prompt empty.
 */
import type { TextTokenizer } from '../runtime/tokenizer.js';

export interface PromptTemplate {
  head: string;
  /** '{i}' is the 1-based citation number. */
  marker: string;
  /** '{title}' and '{text}' of the chunk. */
  body: string;
  /** '{question}'. */
  tail: string;
  /** A chunk's body is cut to this many tokens. */
  bodyMaxTokens: number;
  /**
   * For a decoder with a chat template (chat-prompt.ts): the instruction ahead of the context in the
   * system message ('' = none). The plain prompt above does not use it.
   */
  system: string;
}

/**
 * What an instruct model is asked to do with the context: answer from it, briefly, with the exact
 * command, path or value it names (the facts a question about a handbook is after), and cite it.
 */
export const GROUNDED_SYSTEM = 'Answer the question from the context below. ' +
  'Answer briefly and name the exact command, file, package or value that the context gives.';

export const DEFAULT_TEMPLATE: PromptTemplate = {
  head: 'Context:\n',
  marker: '[{i}] ',
  body: '{title}: {text}\n',
  tail: '\nQuestion: {question}\nAnswer:',
  bodyMaxTokens: 200,
  system: GROUNDED_SYSTEM,
};

/** The template a model ships in tokenizer_config.json ('ragguard_prompt'), else the default. */
export function templateFromConfig(config: Readonly<Record<string, unknown>>): PromptTemplate {
  const t = config['ragguard_prompt'] as Partial<Record<string, unknown>> | undefined;
  if (!t) return DEFAULT_TEMPLATE;
  const s = (k: keyof PromptTemplate & string) => (typeof t[k] === 'string' ? (t[k] as string) : (DEFAULT_TEMPLATE[k] as string));
  return {
    head: s('head'),
    marker: s('marker'),
    body: s('body'),
    tail: s('tail'),
    bodyMaxTokens: typeof t['body_max_tokens'] === 'number' ? t['body_max_tokens'] : DEFAULT_TEMPLATE.bodyMaxTokens,
    system: s('system'),
  };
}

export interface ContextChunk {
  title: string;
  text: string;
}

export interface AssembledPrompt {
  ids: number[];
  /** Indices into the given chunks, in citation order ([1], [2], ...). */
  included: number[];
  /** Included chunks whose body was cut to fit. */
  truncated: number[];
}

export class PromptTooLongError extends Error {
  constructor(readonly needed: number, readonly budget: number) {
    super(`the question alone needs ${needed} prompt tokens; the budget is ${budget}`);
  }
}

const fill = (s: string, vars: Record<string, string>) => s.replace(/\{(\w+)\}/g, (m, k: string) => vars[k] ?? m);

export function assemblePrompt(
  tok: TextTokenizer,
  template: PromptTemplate,
  bosId: number | undefined,
  question: string,
  chunks: readonly ContextChunk[],
  budget: number,
): AssembledPrompt {
  const head = tok.encode(template.head);
  const tail = tok.encode(fill(template.tail, { question }));
  const fixed = (bosId === undefined ? 0 : 1) + head.length + tail.length;
  if (fixed > budget) throw new PromptTooLongError(fixed, budget);
  const ids = bosId === undefined ? [...head] : [bosId, ...head];
  const included: number[] = [];
  const truncated: number[] = [];
  let room = budget - fixed;
  for (let c = 0; c < chunks.length && room > 0; c++) {
    const marker = tok.encode(fill(template.marker, { i: String(included.length + 1) }));
    let body = tok.encode(fill(template.body, { title: chunks[c]!.title, text: chunks[c]!.text })).slice(0, template.bodyMaxTokens);
    if (marker.length + body.length > room) {
      // An empty context helps nobody: cut the best chunk rather than drop it.
      if (included.length > 0 || room - marker.length < 8) continue;
      body = body.slice(0, room - marker.length);
      truncated.push(c);
    }
    ids.push(...marker, ...body);
    included.push(c);
    room -= marker.length + body.length;
  }
  ids.push(...tail);
  return { ids, included, truncated };
}
