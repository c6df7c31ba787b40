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
  /**
   * For a decoder with a chat template: a worked question and answer put between the system message and
   * the conversation (null = none). The plain prompt does not use it.
   */
  example: PromptExample | null;
}

/**
 * What an instruct model is asked to do with the context: answer from it, the fact first (the command,
 * package, path or value as the context writes it), then at most one short sentence. The wording before
 * ("... name the exact command, file, package or value that the context gives") was read back by
 * Qwen2.5-Coder-0.5B-Instruct as the start of its answer ("The exact command, file, package or value that
 * the context gives is ..."); this one states what to write, not what the context holds.
 */
export const GROUNDED_SYSTEM = 'Answer the question using the context below. Start your answer with the exact command, ' +
  'package, file path or value, copied from the context, then add at most one short sentence.';

/**
 * One worked question and answer, shown to a chat model as a user and an assistant turn ahead of the
 * conversation: the shape of an answer (the fact first, in backticks, then one short clause) rather than a
 * description of it. Chosen on the tuning split (bench:rag BENCH_RAG_SPLIT=tune; docs/retrieval.md): the
 * same share of facts as the instruction alone within one question of 30, answers a third shorter
 * (25 words against 36 on average), none echoing the instruction.
 */
export const GROUNDED_EXAMPLE: PromptExample = {
  question: 'Which command shows the packages that depend on a given package?',
  answer: '`apt-cache rdepends package` lists the packages that depend on it.',
};

export interface PromptExample {
  question: string;
  answer: string;
}

export const DEFAULT_TEMPLATE: PromptTemplate = {
  head: 'Context:\n',
  marker: '[{i}] ',
  body: '{title}: {text}\n',
  tail: '\nQuestion: {question}\nAnswer:',
  bodyMaxTokens: 200,
  system: GROUNDED_SYSTEM,
  example: GROUNDED_EXAMPLE,
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
    example: exampleFrom(t['example']),
  };
}

/** ragguard_prompt.example: {question, answer}, or null for none; absent or malformed, the default. */
function exampleFrom(e: unknown): PromptExample | null {
  if (e === null) return null;
  const o = e as Partial<Record<string, unknown>> | undefined;
  return o && typeof o['question'] === 'string' && typeof o['answer'] === 'string' ? { question: o['question'], answer: o['answer'] } : DEFAULT_TEMPLATE.example;
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
