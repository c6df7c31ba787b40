/**
 * Token masks for constrained decoding: which tokens of the vocabulary may come next, given the JSON
 * automaton's state (json-automaton.ts), as a bitset over token ids.
 *
 * Why our own, not a library: on npm the only token-mask engine is @mlc-ai/web-xgrammar, XGrammar
 * built for the browser (WebAssembly loaded through web-tokenizers, an emscripten module meant for a
 * page, its tokenizer given as a Hugging Face tokenizer.json blob and not as our GGUF-built
 * tokenizers); llguidance and Outlines have no JavaScript port. The JSON subset OpenAI's strict mode
 * allows is small, so the automaton and the mask walk are a few hundred lines, pure and tested
 * against a brute-force reference (test/structured.test.ts).
 *
 * How a mask is made (the approach of Outlines' and XGrammar's token tries, written for this
 * automaton): the vocabulary's decoded token texts, sorted, are a trie in a flat array (a token's
 * parent prefix is the run of texts before it sharing it). The walk advances the automaton one
 * character at a time along that order, reusing the state of the prefix it shares with the previous
 * text, and skips the whole block of texts below a prefix the automaton refuses (a binary search), so
 * it visits only the live part of the trie. Inside a string, where nearly every token is allowed, the
 * tokens made only of plain string characters are allowed as one precomputed bitset, and only the few
 * others (with a quote, a backslash or a control character) are walked. Masks are cached by state
 * (LRU, MASK_CACHE_BYTES), so the steady states (inside a string, between the same keys of a schema)
 * cost a lookup; a greedy row whose argmax the automaton accepts needs no mask at all (TokenGuide.allows).
 *
 * A token is usable only where its text decodes by itself to the same characters it adds to the output
 * (byte-level BPE: every whole-character token); tokens that decode to partial UTF-8 (U+FFFD) or to
 * nothing (special tokens) are never allowed in a constrained row, so a non-ASCII character is written
 * only by a token that holds it whole. The end of generation (EOS) is allowed only where the document
 * is complete.
 */
import { advance, advanceText, canEnd, charsToClose, initialState, inPlainString, mustEnd, stateKey, type State } from './json-automaton.js';
import type { CompiledSchema, SchemaNode } from './json-schema.js';

export interface TokenTextSource {
  decode(ids: readonly number[]): string;
}

/** Bits of the cached masks at most (all grammars together): the steady states of many schemas fit. */
const MASK_CACHE_BYTES = 32 * 1024 * 1024;

/** A bitset over token ids: bit id % 32 of word id >> 5. */
export type TokenMask = Uint32Array;

export const maskHas = (m: TokenMask, id: number): boolean => ((m[id >>> 5]! >>> (id & 31)) & 1) === 1;
const maskSet = (m: TokenMask, id: number) => {
  m[id >>> 5]! |= 1 << (id & 31);
};

/** The logits with every token outside `mask` at -Infinity (a copy; the model's buffer stays as it was). */
export function maskLogits(logits: Float32Array, mask: TokenMask): Float32Array {
  const out = new Float32Array(logits.length);
  out.fill(-Infinity);
  for (let w = 0; w < mask.length; w++) {
    let bits = mask[w]!;
    while (bits !== 0) {
      const b = 31 - Math.clz32(bits & -bits);
      const id = (w << 5) + b;
      if (id < logits.length) out[id] = logits[id]!;
      bits &= bits - 1;
    }
  }
  return out;
}

const isPlain = (text: string) => {
  for (let k = 0; k < text.length; k++) {
    const c = text.charCodeAt(k);
    if (c < 0x20 || c === 0x22 || c === 0x5c) return false;
  }
  return true;
};

/** A tokenizer's token texts, sorted for the mask walk; built once per tokenizer (vocabularyFor). */
export class TokenVocabulary {
  /** Token ids by their texts' order (texts[k] is token ids[k]'s text). */
  readonly texts: string[];
  readonly ids: Int32Array;
  /** The same for tokens that are not plain string characters only. */
  readonly specialTexts: string[];
  readonly specialIds: Int32Array;
  /** Tokens made only of plain string characters. */
  readonly plain: TokenMask;
  private readonly plainCount: number;
  readonly words: number;
  private readonly textOf: (string | undefined)[];

  /** `texts[id]`: the token's text, or undefined where it may never be generated in a constrained row. */
  constructor(readonly size: number, texts: readonly (string | undefined)[], readonly eosIds: readonly number[]) {
    this.words = (size + 31) >>> 5;
    this.textOf = [...texts];
    const all: { t: string; id: number }[] = [];
    texts.forEach((t, id) => {
      if (t !== undefined && t.length > 0 && id < size && !eosIds.includes(id)) all.push({ t, id });
    });
    // By UTF-16 code units, as startsWith compares: a prefix's texts are one contiguous block.
    all.sort((a, b) => (a.t < b.t ? -1 : a.t > b.t ? 1 : a.id - b.id));
    this.texts = all.map((x) => x.t);
    this.ids = Int32Array.from(all.map((x) => x.id));
    this.plain = new Uint32Array(this.words);
    const special = all.filter((x) => !isPlain(x.t));
    for (const x of all) if (isPlain(x.t)) maskSet(this.plain, x.id);
    this.plainCount = all.length - special.length;
    this.specialTexts = special.map((x) => x.t);
    this.specialIds = Int32Array.from(special.map((x) => x.id));
  }

  /** The text of tokens as a constrained row reads them (their texts joined). */
  decode(ids: readonly number[]): string {
    return ids.map((id) => this.textOf[id] ?? '').join('');
  }

  /** The text a token adds in a constrained row (undefined: never allowed there). */
  text(id: number): string | undefined {
    return this.textOf[id];
  }

  /**
   * Every token allowed after `state` (the tokens the automaton reads whole, and EOS where the document
   * may end), but only those after which the document can still close in `limit` characters (see
   * charsToClose); with the largest such cost among them and how many there are.
   */
  mask(state: State, asciiLiterals = false, limit = Infinity): AllowedTokens {
    const m = new Uint32Array(this.words);
    const out: AllowedTokens = { mask: m, maxCost: 0, count: 0 };
    if (inPlainString(state)) {
      // A plain character leaves a string's threads as they were: every plain token costs the same.
      const same = charsToClose(state);
      if (same <= limit) {
        m.set(this.plain);
        out.maxCost = same;
        out.count = this.plainCount;
      }
      walk(state, this.specialTexts, this.specialIds, m, asciiLiterals, limit, out);
    } else {
      walk(state, this.texts, this.ids, m, asciiLiterals, limit, out);
    }
    if (canEnd(state)) {
      for (const id of this.eosIds) {
        if (id < this.size) {
          maskSet(m, id);
          out.count++;
        }
      }
    }
    return out;
  }
}

/** A mask and what it holds (TokenVocabulary.mask). */
export interface AllowedTokens {
  readonly mask: TokenMask;
  /** The most characters any allowed token leaves to write before the document may end. */
  maxCost: number;
  /** Allowed tokens. */
  count: number;
}

/**
 * Sets the bits of the texts the automaton reads whole from `state` (texts sorted, ids alongside).
 * `asciiLiterals`: the schema's keys and enum texts are ASCII, so the automaton treats every non-ASCII
 * character alike (string content or nothing); one refused then refuses the rest of its siblings,
 * which sort last in their block (a vocabulary's many CJK first characters are skipped in one jump).
 */
function walk(state: State, texts: readonly string[], ids: Int32Array, m: TokenMask, asciiLiterals: boolean, costLimit: number, out: AllowedTokens): void {
  walkTokenTrie<State>(state, texts, ids, {
    step: (st, text, k) => {
      const next = advance(st, text[k]!);
      return next.length === 0 ? undefined : next;
    },
    read: (id, end) => {
      // Over the limit, the token is left out but its block is not: a longer text may close sooner.
      const cost = charsToClose(end);
      if (cost <= costLimit) {
        maskSet(m, id);
        out.count++;
        if (cost > out.maxCost) out.maxCost = cost;
      }
    },
    ...(asciiLiterals ? { refusesLaterSiblings: (c: number) => c >= 0x80 } : {}),
  });
}

/** What walkTokenTrie asks of an automaton over characters (states of type S). */
export interface TokenTrieAutomaton<S> {
  /** The state after character `k` of `text` (a UTF-16 code unit) from `state`, or undefined where it is refused. */
  step(state: S, text: string, k: number): S | undefined;
  /** Token `id`'s whole text was read, ending in state `end`. */
  read(id: number, end: S): void;
  /**
   * Where a refused character (code unit `c`) refuses every character sorting after it at the same
   * place too: the walk then jumps past all those siblings at once. Absent: only its own block.
   */
  refusesLaterSiblings?(c: number): boolean;
}

/**
 * The walk of a vocabulary's sorted texts as a token trie (texts sorted by UTF-16 code units, ids
 * alongside: TokenVocabulary.texts and .ids, or a subset in the same order): runs the automaton from
 * `start` over each text one character at a time, reusing the states of the prefix it shares with the
 * text before, and calls `read` for every text it reads whole. Where a character is refused, every text
 * below that prefix is refused too, so the walk jumps past their block (a binary search) and visits only
 * the live part of the trie. The JSON masks (TokenVocabulary.mask) and the copied-span constraint's
 * (span-answer.ts: spanMask) are both this walk.
 */
export function walkTokenTrie<S>(start: S, texts: readonly string[], ids: Int32Array, automaton: TokenTrieAutomaton<S>): void {
  const n = texts.length;
  // states[k]: after the first k characters of `prev`.
  const states: S[] = [start];
  let prev = '';
  let i = 0;
  while (i < n) {
    const s = texts[i]!;
    let k = 0;
    const shared = Math.min(prev.length, s.length, states.length - 1);
    while (k < shared && prev.charCodeAt(k) === s.charCodeAt(k)) k++;
    states.length = k + 1;
    let dead = -1;
    for (; k < s.length; k++) {
      const next = automaton.step(states[k]!, s, k);
      if (next === undefined) {
        dead = k;
        break;
      }
      states.push(next);
    }
    if (dead < 0) {
      automaton.read(ids[i]!, states[s.length]!);
      prev = s;
      i++;
      continue;
    }
    // Every text below the refused prefix is refused too: past their block (sorted by code units).
    const prefix = s.slice(0, automaton.refusesLaterSiblings?.(s.charCodeAt(dead)) ? dead : dead + 1);
    prev = s.slice(0, dead);
    let lo = i + 1, hi = n;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (texts[mid]!.startsWith(prefix)) lo = mid + 1;
      else hi = mid;
    }
    i = lo;
  }
}

const vocabularies = new WeakMap<TokenTextSource, Promise<TokenVocabulary>>();

/**
 * The vocabulary of a tokenizer (`size` ids: the model's logits, which may have more rows than the
 * tokenizer has tokens), built once, decoding every token, in slices between which the event loop
 * turns (a 150k vocabulary takes a few seconds). Rejects where tokens do not decode independently
 * (a tokenizer whose decoder changes a token's text by what surrounds it: the mask would be wrong).
 */
export function vocabularyFor(tokenizer: TokenTextSource, size: number, eosIds: Iterable<number>): Promise<TokenVocabulary> {
  let v = vocabularies.get(tokenizer);
  if (!v) {
    v = buildVocabulary(tokenizer, size, [...eosIds]);
    vocabularies.set(tokenizer, v);
  }
  return v;
}

async function buildVocabulary(tokenizer: TokenTextSource, size: number, eosIds: number[]): Promise<TokenVocabulary> {
  const texts: (string | undefined)[] = new Array(size);
  for (let id = 0; id < size; id++) {
    if (id % 4096 === 0) await new Promise<void>((r) => setImmediate(r));
    let t: string;
    try {
      t = tokenizer.decode([id]);
    } catch {
      continue;
    }
    if (t.length > 0 && !t.includes('\uFFFD')) texts[id] = t;
  }
  // Pairs of usable tokens must decode to their texts joined, up to blanks (byte-level BPE does, but
  // for a decoder's clean-up of spaces before punctuation, which the constrained text does without).
  const usable = texts.flatMap((t, id) => (t === undefined ? [] : [id]));
  const step = Math.max(1, Math.floor(usable.length / 256));
  for (let k = 0; k + 1 < usable.length; k += step) {
    const a = usable[k]!, b = usable[(k * 7919 + 1) % usable.length]!;
    if (tokenizer.decode([a, b]).replace(/\s+/g, '') !== (texts[a]! + texts[b]!).replace(/\s+/g, '')) {
      throw new Error(`this tokenizer's tokens do not decode independently (tokens ${a} and ${b}), so constrained decoding cannot mask them`);
    }
  }
  const v = new TokenVocabulary(size, texts, eosIds);
  vocabularyBytes += v.ids.byteLength + v.specialIds.byteLength + v.plain.byteLength;
  vocabularyChars += v.texts.reduce((n, t) => n + t.length, 0);
  return v;
}

/** Cached masks of every grammar, least recently used first. */
const maskCache = new Map<string, AllowedTokens>();
let maskCacheBytes = 0;
/** The built vocabularies' typed arrays and their texts' characters (what /debug/memory shows). */
let vocabularyBytes = 0;
let vocabularyChars = 0;

/** Host bytes constrained decoding holds: the mask cache and the vocabularies' arrays (exact), and their texts' characters. */
export function tokenMaskMemory(): { maskCacheBytes: number; masks: number; vocabularyBytes: number; vocabularyChars: number } {
  return { maskCacheBytes, masks: maskCache.size, vocabularyBytes, vocabularyChars };
}
let grammarIds = 0;

/** A compiled schema over one vocabulary: starts a guide per sequence; its masks are cached by state. */
export class TokenGrammar {
  private readonly id = grammarIds++;
  private readonly asciiLiterals: boolean;

  constructor(readonly schema: CompiledSchema, readonly vocab: TokenVocabulary) {
    this.asciiLiterals = literalTexts(schema.root).every((t) => /^[\x00-\x7f]*$/.test(t));
  }

  /** A guide for one sequence; `budget`: the tokens it may generate (max_tokens). */
  start(budget = Infinity): TokenGuide {
    return new TokenGuide(this, initialState(this.schema.root), budget);
  }

  /** The tokens allowed after `state` (under `limit` characters left to close: see TokenVocabulary.mask), cached. */
  mask(state: State, limit = Infinity): AllowedTokens {
    const key = `${this.id}|${stateKey(state)}${limit === Infinity ? '' : `|${limit}`}`;
    const hit = maskCache.get(key);
    if (hit) {
      maskCache.delete(key);
      maskCache.set(key, hit);
      return hit;
    }
    const m = this.vocab.mask(state, this.asciiLiterals, limit);
    maskCache.set(key, m);
    maskCacheBytes += m.mask.byteLength;
    for (const [k, v] of maskCache) {
      if (maskCacheBytes <= MASK_CACHE_BYTES) break;
      maskCache.delete(k);
      maskCacheBytes -= v.mask.byteLength;
    }
    return m;
  }
}

/** Every key and enum text of a compiled schema. */
function literalTexts(root: SchemaNode): string[] {
  const out: string[] = [];
  const seen = new Set<number>();
  const visit = (n: SchemaNode) => {
    if (seen.has(n.id)) return;
    seen.add(n.id);
    if (n.kind === 'literal') out.push(...n.texts);
    else if (n.kind === 'object') {
      for (const p of n.props) {
        out.push(p.keyText);
        visit(p.node);
      }
      if (n.extra) visit(n.extra);
    } else if (n.kind === 'array') visit(n.items);
    else if (n.kind === 'anyOf') n.options.forEach(visit);
  };
  visit(root);
  return out;
}

/**
 * One sequence's place in its grammar: which tokens may come next, and the tokens it took.
 *
 * The budget: a constrained row must end as a whole document, not be cut at max_tokens inside a string
 * (a truncated JSON is as useless to the caller as none). While the tokens left cover the longest
 * closing any allowed token would leave, the mask is the grammar's own; once they no longer do, only
 * tokens after which the document can still close in the tokens left are allowed (a string ends, an
 * optional property is left out, an array closes), so the output completes within max_tokens whenever
 * the schema's shortest document fits in it. `steered` says the budget narrowed a choice.
 */
export class TokenGuide {
  private mine: TokenMask | undefined;
  /** Whether the budget left out a token the grammar allowed at some step. */
  steered = false;

  constructor(readonly grammar: TokenGrammar, private state: State, private left = Infinity) {}

  /** The tokens allowed next. */
  mask(): TokenMask {
    if (this.mine) return this.mine;
    const all = this.grammar.mask(this.state);
    const limit = this.limit();
    if (all.maxCost <= limit) return (this.mine = all.mask);
    const within = this.grammar.mask(this.state, limit);
    // A vocabulary without the single characters of the shortest closing: the grammar's own mask.
    if (within.count === 0) return (this.mine = all.mask);
    if (within.count < all.count) this.steered = true;
    return (this.mine = within.mask);
  }

  /**
   * The characters a token may leave to close: the tokens left after it, or (where the document can no
   * longer close in time, max_tokens below the schema's shortest document) the shortest way on.
   */
  private limit(): number {
    return this.left === Infinity ? Infinity : Math.max(this.left - 1, charsToClose(this.state) - 1);
  }

  /** Whether token `id` may come next (without a mask where none is made yet: the token's text is read). */
  allows(id: number): boolean {
    if (this.mine) return maskHas(this.mine, id);
    const v = this.grammar.vocab;
    if (v.eosIds.includes(id)) return canEnd(this.state);
    const t = v.text(id);
    if (t === undefined) return false;
    const next = advanceText(this.state, t);
    return next.length > 0 && charsToClose(next) <= this.limit();
  }

  /** Takes token `id` (one the mask allowed; anything else is a bug upstream). */
  accept(id: number): void {
    const t = this.grammar.vocab.text(id);
    const next = t === undefined ? [] : advanceText(this.state, t);
    if (next.length === 0) throw new Error(`token ${id} (${JSON.stringify(t)}) does not continue the constrained output`);
    this.state = next;
    this.mine = undefined;
    this.left--;
  }

  /** Whether the output is complete and nothing but the end can follow. */
  get done(): boolean {
    return mustEnd(this.state);
  }

  /** Whether the output is complete (the end may come). */
  get complete(): boolean {
    return canEnd(this.state);
  }
}
