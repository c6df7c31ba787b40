/**
 * A Hugging Face tokenizer.json (+ tokenizer_config.json) loaded with @huggingface/tokenizers.
 * Thin on purpose: the callers decide truncation and special tokens, so that they can count tokens
 * exactly (prompt budget, chunking).
 */
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { Tokenizer } from '@huggingface/tokenizers';

export interface PairEncoding {
  ids: number[];
  typeIds: number[];
}

export class TextTokenizer {
  private constructor(
    private readonly tok: Tokenizer,
    /** tokenizer_config.json, for fields such as model_max_length and the prompt template. */
    readonly config: Readonly<Record<string, unknown>>,
  ) {}

  static async load(dir: string): Promise<TextTokenizer> {
    const json = JSON.parse(await readFile(path.join(dir, 'tokenizer.json'), 'utf8')) as object;
    let config: Record<string, unknown> = {};
    try {
      config = JSON.parse(await readFile(path.join(dir, 'tokenizer_config.json'), 'utf8')) as Record<string, unknown>;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
    }
    return new TextTokenizer(new Tokenizer(json, config), config);
  }

  /** Token ids of `text`; with special tokens the post-processor's template applies ([CLS] ... [SEP]). */
  encode(text: string, addSpecialTokens = false): number[] {
    return this.tok.encode(text, { add_special_tokens: addSpecialTokens }).ids;
  }

  /** A text pair through the post-processor's pair template, with token type ids. */
  encodePair(a: string, b: string): PairEncoding {
    const e = this.tok.encode(a, { text_pair: b, add_special_tokens: true, return_token_type_ids: true });
    return { ids: e.ids, typeIds: e.token_type_ids };
  }

  decode(ids: readonly number[], skipSpecialTokens = true): string {
    // No tokens is no text (a generation whose first token ended it); the library throws on an empty list.
    if (ids.length === 0) return '';
    return this.tok.decode([...ids], { skip_special_tokens: skipSpecialTokens });
  }

  /** Id of a vocabulary or added token; throws when the model lacks it (a misconfigured export). */
  tokenId(token: string): number {
    const id = this.tok.token_to_id(token);
    if (id === undefined) throw new Error(`tokenizer has no token '${token}'`);
    return id;
  }
}
