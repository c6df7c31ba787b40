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
    /** Vocabulary entries spell bytes as GPT-2's byte-level alphabet (its decoder is ByteLevel). */
    private readonly byteLevel: boolean,
    /** One past the largest token id of the vocabulary and the added tokens. */
    readonly vocabSize: number,
  ) {}

  static async load(dir: string): Promise<TextTokenizer> {
    const json = JSON.parse(await readFile(path.join(dir, 'tokenizer.json'), 'utf8')) as object;
    let config: Record<string, unknown> = {};
    try {
      config = JSON.parse(await readFile(path.join(dir, 'tokenizer_config.json'), 'utf8')) as Record<string, unknown>;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
    }
    const j = json as { decoder?: unknown; model?: { vocab?: Record<string, number> | [string, number][] }; added_tokens?: { id: number }[] };
    const vocab = j.model?.vocab;
    // A Unigram vocabulary is a list (ids are positions); BPE and WordPiece map tokens to ids.
    const ids = Array.isArray(vocab) ? [vocab.length - 1] : Object.values(vocab ?? {});
    let top = -1;
    for (const id of ids) if (id > top) top = id;
    for (const t of j.added_tokens ?? []) if (t.id > top) top = t.id;
    const vocabSize = top + 1;
    const byteLevel = /"type":\s*"ByteLevel"/.test(JSON.stringify(j.decoder ?? null));
    return new TextTokenizer(new Tokenizer(json, config), config, byteLevel, vocabSize);
  }

  /**
   * The bytes one token stands for (OpenAI's logprobs `bytes`): a token may hold part of a character,
   * which decoding it alone cannot show. From its vocabulary entry: byte-fallback pieces (<0xE2>), the
   * byte-level alphabet, or SentencePiece's text with its word marker as a space.
   */
  tokenBytes(id: number): Uint8Array {
    const piece = this.tok.id_to_token(id);
    if (piece === undefined) return Buffer.from(this.decode([id], false), 'utf8');
    const hex = /^<0x([0-9A-Fa-f]{2})>$/.exec(piece);
    if (hex) return Uint8Array.of(parseInt(hex[1]!, 16));
    if (this.byteLevel && [...piece].every((c) => BYTE_OF.has(c))) return Uint8Array.from([...piece].map((c) => BYTE_OF.get(c)!));
    return Buffer.from(piece.replace(/\u2581/g, ' '), 'utf8');
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

/** GPT-2's byte-level alphabet read back: each of the 256 bytes is one printable character in vocabularies. */
const BYTE_OF: ReadonlyMap<string, number> = (() => {
  const printable = (b: number) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  const m = new Map<string, number>();
  let extra = 0;
  for (let b = 0; b < 256; b++) m.set(String.fromCodePoint(printable(b) ? b : 256 + extra++), b);
  return m;
})();
