/**
 * A Hugging Face tokenizer.json (and tokenizer_config.json) built from a GGUF file's tokenizer
 * metadata, for @huggingface/tokenizers to run: tokenizer.ggml.tokens, merges, token_type,
 * bos/eos/unknown/padding ids, add_bos_token/add_eos_token, and tokenizer.chat_template.
 *
 * Only byte-level BPE ('gpt2' in tokenizer.ggml.model) is built, with the pre-tokenizer that
 * tokenizer.ggml.pre names, as llama.cpp splits text for it (llama-vocab.cpp's regexes, which are the
 * original tokenizers' own). A model or pre-tokenizer not in the table is refused by name: another
 * split would tokenize silently differently from the model's training.
 */
import type { GgufFile, GgufValue } from './gguf.js';

/** GGUF token types (llama_token_type). */
const TOKEN_TYPE = { NORMAL: 1, UNKNOWN: 2, CONTROL: 3, USER_DEFINED: 4, UNUSED: 5, BYTE: 6 } as const;

const BYTE_LEVEL_NO_REGEX = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false };
const split = (pattern: string) => ({ type: 'Split', pattern: { Regex: pattern }, behavior: 'Isolated', invert: false });

/** Pre-tokenizers by tokenizer.ggml.pre. */
const PRE_TOKENIZERS: Record<string, { pre: object; normalizer?: object }> = {
  // GPT-2's own regex inside ByteLevel.
  default: { pre: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true } },
  gpt2: { pre: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true } },
  // SmolLM / StarCoder: every digit alone, then GPT-2's regex.
  smollm: {
    pre: { type: 'Sequence', pretokenizers: [{ type: 'Digits', individual_digits: true }, { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true }] },
  },
  starcoder: {
    pre: { type: 'Sequence', pretokenizers: [{ type: 'Digits', individual_digits: true }, { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true }] },
  },
  // Qwen2: single digits, NFC.
  qwen2: {
    pre: {
      type: 'Sequence',
      pretokenizers: [split("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"), BYTE_LEVEL_NO_REGEX],
    },
    normalizer: { type: 'NFC' },
  },
  // Llama 3: digits in groups of up to three.
  'llama-bpe': {
    pre: {
      type: 'Sequence',
      pretokenizers: [split("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"), BYTE_LEVEL_NO_REGEX],
    },
  },
};

export interface GgufTokenizerFiles {
  /** tokenizer.json's object. */
  tokenizer: Record<string, unknown>;
  /** tokenizer_config.json's object: special tokens, add_bos_token, chat_template. */
  config: Record<string, unknown>;
  bosId: number | undefined;
  eosId: number | undefined;
  addBos: boolean;
  chatTemplate: string | undefined;
}

function strings(v: GgufValue | undefined, what: string): string[] {
  if (!Array.isArray(v) || v.some((x) => typeof x !== 'string')) throw new Error(`GGUF metadata ${what} is missing or not an array of strings`);
  return v as string[];
}

function optionalId(f: GgufFile, key: string): number | undefined {
  return f.get(key) === undefined ? undefined : f.num(key);
}

export function ggufTokenizer(f: GgufFile, contextLength: number): GgufTokenizerFiles {
  const model = f.str('tokenizer.ggml.model');
  if (model !== 'gpt2') {
    throw new Error(`${f.path}: tokenizer.ggml.model '${model}' is not supported (only byte-level BPE, 'gpt2'; SentencePiece 'llama' vocabularies are not)`);
  }
  const preName = f.str('tokenizer.ggml.pre') ?? 'default';
  const pre = PRE_TOKENIZERS[preName];
  if (!pre) throw new Error(`${f.path}: tokenizer.ggml.pre '${preName}' is not supported (${Object.keys(PRE_TOKENIZERS).join(', ')} are)`);
  const tokens = strings(f.get('tokenizer.ggml.tokens'), 'tokenizer.ggml.tokens');
  const merges = strings(f.get('tokenizer.ggml.merges'), 'tokenizer.ggml.merges');
  const typesRaw = f.get('tokenizer.ggml.token_type');
  const types = Array.isArray(typesRaw) ? (typesRaw as number[]) : new Array<number>(tokens.length).fill(TOKEN_TYPE.NORMAL);
  if (types.length !== tokens.length) throw new Error(`${f.path}: ${types.length} token types for ${tokens.length} tokens`);

  const vocab: Record<string, number> = {};
  const added: Record<string, unknown>[] = [];
  tokens.forEach((t, id) => {
    vocab[t] = id;
    const type = types[id]!;
    // Control tokens (<|im_start|>, ...) and user-defined ones are matched whole before BPE, as llama.cpp does.
    if (type === TOKEN_TYPE.CONTROL || type === TOKEN_TYPE.USER_DEFINED) {
      added.push({ id, content: t, single_word: false, lstrip: false, rstrip: false, normalized: false, special: type === TOKEN_TYPE.CONTROL });
    }
  });
  const bosId = optionalId(f, 'tokenizer.ggml.bos_token_id');
  const eosId = optionalId(f, 'tokenizer.ggml.eos_token_id');
  const unkId = optionalId(f, 'tokenizer.ggml.unknown_token_id');
  const padId = optionalId(f, 'tokenizer.ggml.padding_token_id');
  // llama.cpp's default for a BPE vocabulary without the key is false.
  const addBos = f.get('tokenizer.ggml.add_bos_token') === true;
  const addEos = f.get('tokenizer.ggml.add_eos_token') === true;
  const name = (id: number | undefined) => (id === undefined ? null : tokens[id] ?? null);
  const special = (id: number) => ({ id: tokens[id]!, ids: [id], tokens: [tokens[id]!] });
  const single: object[] = [];
  const specials: Record<string, object> = {};
  if (addBos && bosId !== undefined) {
    single.push({ SpecialToken: { id: tokens[bosId], type_id: 0 } });
    specials[tokens[bosId]!] = special(bosId);
  }
  single.push({ Sequence: { id: 'A', type_id: 0 } });
  if (addEos && eosId !== undefined) {
    single.push({ SpecialToken: { id: tokens[eosId], type_id: 0 } });
    specials[tokens[eosId]!] = special(eosId);
  }
  const tokenizer = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: pre.normalizer ?? null,
    pre_tokenizer: pre.pre,
    post_processor: { type: 'TemplateProcessing', single, pair: [...single, { Sequence: { id: 'B', type_id: 1 } }], special_tokens: specials },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE', dropout: null, unk_token: name(unkId), continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, vocab, merges,
    },
  };
  const chatTemplate = f.str('tokenizer.chat_template');
  const config: Record<string, unknown> = {
    tokenizer_class: 'PreTrainedTokenizerFast',
    bos_token: name(bosId),
    eos_token: name(eosId),
    unk_token: name(unkId),
    pad_token: name(padId),
    add_bos_token: addBos,
    add_eos_token: addEos,
    model_max_length: contextLength,
    ...(chatTemplate === undefined ? {} : { chat_template: chatTemplate }),
  };
  return { tokenizer, config, bosId, eosId, addBos, chatTemplate };
}
