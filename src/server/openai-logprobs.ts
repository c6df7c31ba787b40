/**
 * Token logprobs (logprobs.ts) in OpenAI's two reply shapes:
 *
 *   chat:        choices[].logprobs = {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}], refusal: null}
 *   completions: choices[].logprobs = {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}
 *
 * A token's `token` is its text; a token holding part of a character (a byte-level piece) is written
 * as OpenAI writes it, `bytes:\xe2\x80`, its `bytes` exact either way (the vocabulary's, tokenizer.ts).
 */
import type { TokenLogprobs } from '../generate/logprobs.js';

/** What the formats need of the decoder's tokenizer. */
export interface TokenBytes {
  tokenBytes(id: number): Uint8Array;
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

export function tokenText(bytes: Uint8Array): string {
  try {
    return utf8.decode(bytes);
  } catch {
    return `bytes:${[...bytes].map((b) => `\\x${b.toString(16).padStart(2, '0')}`).join('')}`;
  }
}

export interface ChatTokenLogprob {
  token: string;
  logprob: number;
  bytes: number[];
  top_logprobs: { token: string; logprob: number; bytes: number[] }[];
}

export function chatLogprobs(entries: readonly TokenLogprobs[], tok: TokenBytes): { content: ChatTokenLogprob[]; refusal: null } {
  const one = (id: number, logprob: number) => {
    const bytes = tok.tokenBytes(id);
    return { token: tokenText(bytes), logprob, bytes: [...bytes] };
  };
  return {
    content: entries.map((e) => ({ ...one(e.id, e.logprob), top_logprobs: e.top.map((t) => one(t.id, t.logprob)) })),
    refusal: null,
  };
}

export interface CompletionLogprobs {
  tokens: string[];
  token_logprobs: number[];
  top_logprobs: Record<string, number>[];
  text_offset: number[];
}

/**
 * `offset`: where the first entry's text starts in the completion's text (a stream's chunks go on from
 * the last one's end); returns the end too. Two alternatives with the same text keep the likelier.
 */
export function completionLogprobs(entries: readonly TokenLogprobs[], tok: TokenBytes, offset = 0): { logprobs: CompletionLogprobs; end: number } {
  const out: CompletionLogprobs = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  for (const e of entries) {
    const text = tokenText(tok.tokenBytes(e.id));
    out.tokens.push(text);
    out.token_logprobs.push(e.logprob);
    const top: Record<string, number> = {};
    for (const t of e.top) {
      const k = tokenText(tok.tokenBytes(t.id));
      if (!(k in top)) top[k] = t.logprob;
    }
    out.top_logprobs.push(top);
    out.text_offset.push(offset);
    offset += text.length;
  }
  return { logprobs: out, end: offset };
}
