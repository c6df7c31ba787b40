/**
 * Grounded-by-construction answers for /query (RAGGUARD_QUERY_COPY_SPAN): every code span of the answer
 * (text in backticks, the shape the worked example gives the fact: prompt.ts GROUNDED_EXAMPLE) must be
 * copied verbatim from the chunks in the prompt; in mode 'first' the answer must also open with one, then
 * may go on for one line:
 *
 *   first   `<a substring of one chunk's title or text>` <free text, to a newline or FREE_TOKENS tokens>
 *   ticks   <free text, any `code span` in it a substring of one chunk>
 *
 * The constraint is a token grammar the engine runs as it runs a JSON schema's (sequence.ts: params.grammar;
 * the runner masks the logits where the greedy token is refused). Its states, character by character:
 *   open   ('first' only, the start) only "`" may come;
 *   span   a character that keeps the span a substring of some chunk (no newline; SPAN_MAX_CHARS at
 *          most), or "`" once the span holds a non-blank character;
 *   free   anything, EOS included; "`" opens a span.
 * Which characters keep the span a substring: a suffix automaton over the chunks (joined by a character no
 * token holds), so a step is one transition and a token's check is its length. A mask is a walk of the
 * vocabulary's sorted texts as a trie (structured/token-mask.ts: walkTokenTrie, the JSON masks' walk too)
 * that reuses the automaton state of the prefix a text shares with the one before, and jumps past every
 * text below a refused prefix, so inside a span it visits only the tokens that are substrings of the
 * context (a few thousand of 150k); in free text every token without a backtick is allowed at once and
 * only the others are walked.
 *
 * Pure logic, no model: test/span-answer.test.ts checks it against a brute-force reference.
 */
import { maskHas, vocabularyFor, walkTokenTrie, type TokenGrammar, type TokenMask, type TokenVocabulary } from './structured/token-mask.js';

/** Longest copied span, in characters (a whole sentence in backticks is not an answer's fact). */
export const SPAN_MAX_CHARS = 80;
/** Tokens of free text after the span at most (at most one short sentence; a newline ends it sooner). */
export const FREE_TOKENS = 32;

/** A suffix automaton over one or more texts: which strings are substrings of one of them. */
export class SubstringAutomaton {
  private readonly next: Map<number, number>[] = [new Map()];
  private readonly link: number[] = [-1];
  private readonly len: number[] = [0];

  /** `texts` are joined by U+0000, which no step accepts: a substring never spans two of them. */
  constructor(texts: readonly string[]) {
    let last = 0;
    const joined = texts.join('\u0000');
    for (let i = 0; i < joined.length; i++) last = this.extend(last, joined.charCodeAt(i));
  }

  /** States (at most twice the text's characters). */
  get size(): number {
    return this.len.length;
  }

  private extend(last: number, c: number): number {
    const { next, link, len } = this;
    const cur = len.length;
    next.push(new Map());
    link.push(-1);
    len.push(len[last]! + 1);
    let p = last;
    while (p !== -1 && !next[p]!.has(c)) {
      next[p]!.set(c, cur);
      p = link[p]!;
    }
    if (p === -1) {
      link[cur] = 0;
      return cur;
    }
    const q = next[p]!.get(c)!;
    if (len[p]! + 1 === len[q]!) {
      link[cur] = q;
      return cur;
    }
    const clone = len.length;
    next.push(new Map(next[q]!));
    link.push(link[q]!);
    len.push(len[p]! + 1);
    while (p !== -1 && next[p]!.get(c) === q) {
      next[p]!.set(c, clone);
      p = link[p]!;
    }
    link[q] = clone;
    link[cur] = clone;
    return cur;
  }

  /** The state after character code `c` from `state` (0: the empty string), or -1 where none. */
  step(state: number, c: number): number {
    if (c === 0) return -1;
    return this.next[state]!.get(c) ?? -1;
  }

  /** Whether `s` is a substring of one of the texts. */
  has(s: string): boolean {
    let st = 0;
    for (let i = 0; i < s.length && st >= 0; i++) st = this.step(st, s.charCodeAt(i));
    return st >= 0;
  }
}

/** Where an answer stands: before the opening backtick, inside a span, or in free text. */
export type SpanState =
  | { readonly phase: 'open' }
  | { readonly phase: 'span'; readonly at: number; readonly chars: number; readonly solid: boolean }
  | { readonly phase: 'free' };

/** 'first': the answer opens with a copied span; 'ticks': free text whose code spans are copied. */
export type SpanMode = 'first' | 'ticks';

const OPEN: SpanState = { phase: 'open' };
const FREE: SpanState = { phase: 'free' };
const SPAN0: SpanState = { phase: 'span', at: 0, chars: 0, solid: false };
const BACKTICK = 0x60;
const isBlank = (c: number) => c === 0x20 || c === 0x09;

/** The state after one character, or undefined where the constraint refuses it. */
export function advanceChar(sam: SubstringAutomaton, s: SpanState, c: number, maxChars = SPAN_MAX_CHARS): SpanState | undefined {
  if (s.phase === 'free') return c === BACKTICK ? SPAN0 : s;
  if (s.phase === 'open') return c === BACKTICK ? SPAN0 : undefined;
  if (c === BACKTICK) return s.solid ? FREE : undefined;
  if (c === 0x0a || c === 0x0d || s.chars >= maxChars) return undefined;
  const at = sam.step(s.at, c);
  return at < 0 ? undefined : { phase: 'span', at, chars: s.chars + 1, solid: s.solid || !isBlank(c) };
}

export function advanceSpanText(sam: SubstringAutomaton, s: SpanState, text: string, maxChars = SPAN_MAX_CHARS): SpanState | undefined {
  let st: SpanState | undefined = s;
  for (let i = 0; i < text.length && st; i++) st = advanceChar(sam, st, text.charCodeAt(i), maxChars);
  return st;
}

/** Per vocabulary: the tokens without a backtick and EOS (free text's own), and the texts and ids of those with one. */
interface FreeParts { plain: TokenMask; tickTexts: string[]; tickIds: Int32Array }
const freeParts = new WeakMap<TokenVocabulary, FreeParts>();
function freePartsOf(v: TokenVocabulary): FreeParts {
  let f = freeParts.get(v);
  if (!f) {
    const plain = new Uint32Array(v.words);
    const tickTexts: string[] = [];
    const tickIds: number[] = [];
    v.texts.forEach((t, k) => {
      const id = v.ids[k]!;
      if (t.includes('`')) {
        tickTexts.push(t);
        tickIds.push(id);
      } else plain[id >>> 5]! |= 1 << (id & 31);
    });
    for (const id of v.eosIds) if (id < v.size) plain[id >>> 5]! |= 1 << (id & 31);
    f = { plain, tickTexts, tickIds: Int32Array.from(tickIds) };
    freeParts.set(v, f);
  }
  return f;
}

/**
 * The tokens allowed after `state` (`closeOnly`: inside a span, only those that close it, the tokens left
 * being too few for more). EOS only in free text: an answer cannot end inside a span or before its first.
 */
export function spanMask(v: TokenVocabulary, sam: SubstringAutomaton, state: SpanState, closeOnly = false, maxChars = SPAN_MAX_CHARS): TokenMask {
  if (state.phase === 'free') {
    const f = freePartsOf(v);
    const m = new Uint32Array(f.plain);
    walk(sam, state, f.tickTexts, f.tickIds, m, false, maxChars);
    return m;
  }
  const m = new Uint32Array(v.words);
  walk(sam, state, v.texts, v.ids, m, closeOnly && state.phase === 'span', maxChars);
  return m;
}

/** Sets the bits of the texts (sorted, ids alongside) the constraint reads whole from `state` (the token trie's walk). */
function walk(sam: SubstringAutomaton, state: SpanState, texts: readonly string[], ids: Int32Array, m: TokenMask, closeOnly: boolean, maxChars: number): void {
  walkTokenTrie<SpanState>(state, texts, ids, {
    step: (s, text, k) => advanceChar(sam, s, text.charCodeAt(k), maxChars),
    read: (id, end) => {
      if (!closeOnly || end.phase === 'free') m[id >>> 5]! |= 1 << (id & 31);
    },
  });
}

/** The constraint for one prompt's chunks: starts a guide per sequence (what sequence.ts asks of params.grammar). */
export class SpanAnswerGrammar {
  readonly sam: SubstringAutomaton;

  constructor(readonly vocab: TokenVocabulary, context: readonly string[], readonly mode: SpanMode = 'first',
    readonly maxChars = SPAN_MAX_CHARS, readonly freeTokens = FREE_TOKENS) {
    this.sam = new SubstringAutomaton(context);
  }

  start(budget = Infinity): SpanAnswerGuide {
    return new SpanAnswerGuide(this, budget);
  }

  /**
   * As the engine's params.grammar: the engine and the runners use only start() and, of the guide,
   * mask(), allows(), accept(), done, steered and grammar.vocab, which SpanAnswerGuide has.
   */
  asTokenGrammar(): TokenGrammar {
    return this as unknown as TokenGrammar;
  }
}

/** One sequence's place in its span constraint. */
export class SpanAnswerGuide {
  private state: SpanState;
  private mine: TokenMask | undefined;
  /** 'first': tokens taken since the first span closed, and whether a newline came among them. */
  private closed = false;
  private after = 0;
  private newline = false;
  /** The constraint's counterpart of TokenGuide.steered: the budget forced a span to close early. */
  steered = false;

  constructor(readonly grammar: SpanAnswerGrammar, private left = Infinity) {
    // Nothing to copy (every chunk empty): no opening span is asked for.
    this.state = grammar.mode === 'first' && grammar.sam.size > 1 ? OPEN : FREE;
  }

  get phase(): SpanState['phase'] {
    return this.state.phase;
  }

  /** Within one token of the budget inside a span: only a closing token may come. */
  private get closeOnly(): boolean {
    return this.state.phase === 'span' && this.left <= 1;
  }

  mask(): TokenMask {
    if (this.mine) return this.mine;
    const { vocab, sam, maxChars } = this.grammar;
    const any = (m: TokenMask) => m.some((w) => w !== 0);
    let m = spanMask(vocab, sam, this.state, this.closeOnly, maxChars);
    if (this.closeOnly) {
      if (any(m)) this.steered = true;
      else m = spanMask(vocab, sam, this.state, false, maxChars);
    }
    // A context with nothing to copy (every chunk empty): free text's mask rather than none.
    if (!any(m)) m = spanMask(vocab, sam, FREE);
    return (this.mine = m);
  }

  allows(id: number): boolean {
    if (this.mine) return maskHas(this.mine, id);
    const v = this.grammar.vocab;
    if (v.eosIds.includes(id)) return this.state.phase === 'free';
    const t = v.text(id);
    if (t === undefined) return false;
    const next = advanceSpanText(this.grammar.sam, this.state, t, this.grammar.maxChars);
    return next !== undefined && (!this.closeOnly || next.phase === 'free');
  }

  accept(id: number): void {
    const t = this.grammar.vocab.text(id) ?? '';
    // Where the mask fell back to free text's (nothing to copy), a token the span refuses moves to it.
    const next = advanceSpanText(this.grammar.sam, this.state, t, this.grammar.maxChars) ?? FREE;
    if (this.closed) {
      this.after++;
      if (t.includes('\n')) this.newline = true;
    } else if (next.phase === 'free' && this.state.phase !== 'free') this.closed = true;
    this.state = next;
    this.mine = undefined;
    this.left--;
  }

  /** 'first': the opening span closed, and its line has ended (a newline) or run FREE_TOKENS tokens. */
  get done(): boolean {
    return this.grammar.mode === 'first' && this.state.phase === 'free' && this.closed && (this.newline || this.after >= this.grammar.freeTokens);
  }

  get complete(): boolean {
    return this.state.phase === 'free';
  }
}

/** What spanAnswerGrammar needs of the engine's runner: its tokenizer, vocabulary size and EOS ids. */
export interface SpanRunner {
  readonly tokenizer: { decode(ids: readonly number[]): string };
  readonly shape: { readonly vocabSize: number };
  readonly eosIds: ReadonlySet<number>;
}

/**
 * The constraint over a prompt's chunks (their titles and texts), as the engine's params.grammar; undefined
 * where this tokenizer's tokens cannot be masked one by one (vocabularyFor says why: the answer then runs
 * unconstrained, as before).
 */
export async function spanAnswerGrammar(runner: SpanRunner, chunks: readonly { title: string; text: string }[], mode: SpanMode): Promise<TokenGrammar | undefined> {
  let vocab: TokenVocabulary;
  try {
    vocab = await vocabularyFor(runner.tokenizer, runner.shape.vocabSize, runner.eosIds);
  } catch {
    return undefined;
  }
  return new SpanAnswerGrammar(vocab, chunks.flatMap((c) => [c.title, c.text]), mode).asTokenGrammar();
}
