/**
 * Structured outputs compiled into the grammar the engine's constrained decoding walks: an output
 * format (a JSON schema, any JSON object) or a forced tool call (the call's schema, tool-calls.ts)
 * into a TokenGrammar over the decoder's vocabulary (token-mask.ts).
 *
 * Compiled grammars are kept by schema (least recently used out past MAX_GRAMMARS), so a schema asked
 * for again reuses its cached masks. The tokenizer's vocabulary is built once, at start-up in the
 * background (warm()), or by the first request that needs it.
 *
 * Refusals are this module's own errors: a schema outside the supported subset is a
 * SchemaNotSupportedError (naming the keyword and where it is), a decoder whose vocabulary cannot be
 * read token by token a ConstrainedDecodingUnavailableError. The server says what they are in HTTP.
 */
import type { ModelRunner } from '../model-runner.js';
import { forcedCallSchema, type ToolFormat, type ToolFunction } from '../tool-calls.js';
import { anyObjectSchema, compileSchema, type CompiledSchema } from './json-schema.js';
import { TokenGrammar, vocabularyFor, type TokenVocabulary } from './token-mask.js';

export { SchemaNotSupportedError } from './json-schema.js';

const MAX_GRAMMARS = 64;

/** What the output must be (OpenAI's response_format): free text, any JSON object, or JSON under a schema. */
export type OutputFormat =
  | { type: 'text' }
  | { type: 'json_object' }
  | { type: 'json_schema'; json_schema: { schema?: unknown } };

/** The decoder's vocabulary could not be made into token texts: no constrained decoding for it. */
export class ConstrainedDecodingUnavailableError extends Error {
  constructor(cause: Error) {
    super(`constrained decoding is not available for this decoder: ${cause.message}`, { cause });
    this.name = 'ConstrainedDecodingUnavailableError';
  }
}

export class GrammarCompiler {
  private readonly grammars = new Map<string, TokenGrammar>();

  constructor(private readonly runner: Pick<ModelRunner, 'tokenizer' | 'eosIds' | 'shape'>) {}

  /** Starts building the vocabulary (a failure is reported to the request that needs it). */
  warm(): void {
    this.vocabulary().catch(() => {});
  }

  private vocabulary(): Promise<TokenVocabulary> {
    return vocabularyFor(this.runner.tokenizer, this.runner.shape.vocabSize, this.runner.eosIds);
  }

  /** The grammar of an output format (undefined for text or none). */
  async forFormat(f: OutputFormat | undefined): Promise<TokenGrammar | undefined> {
    if (!f || f.type === 'text') return undefined;
    if (f.type === 'json_object') return this.grammar('json_object', () => anyObjectSchema());
    return this.forSchema(f.json_schema.schema ?? {}, 'response_format.json_schema.schema');
  }

  /** The grammar of a JSON schema; `param` names where the schema came from in a refusal. */
  async forSchema(schema: unknown, param: string): Promise<TokenGrammar> {
    return this.grammar(JSON.stringify(schema), () => compileSchema(schema, param));
  }

  /** The grammar of a forced call to one of `tools` (to `name` where the request names it). */
  async forToolCall(tools: readonly ToolFunction[], format: ToolFormat, name?: string): Promise<TokenGrammar> {
    return this.forSchema(forcedCallSchema(tools, format, name), 'tools');
  }

  private async grammar(key: string, compile: () => CompiledSchema): Promise<TokenGrammar> {
    const hit = this.grammars.get(key);
    if (hit) {
      this.grammars.delete(key);
      this.grammars.set(key, hit);
      return hit;
    }
    const schema = compile();
    let vocab: TokenVocabulary;
    try {
      vocab = await this.vocabulary();
    } catch (e) {
      throw new ConstrainedDecodingUnavailableError(e as Error);
    }
    const g = new TokenGrammar(schema, vocab);
    this.grammars.set(key, g);
    if (this.grammars.size > MAX_GRAMMARS) this.grammars.delete(this.grammars.keys().next().value!);
    return g;
  }
}
