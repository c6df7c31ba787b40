/**
 * JSON under a compiled schema (json-schema.ts) as a character-level pushdown automaton.
 *
 * A thread is a stack of immutable frames (each with its parent), so advancing by a character makes
 * new frames and shares the rest: the token-mask walk (token-mask.ts) branches at every node of the
 * vocabulary without copying stacks. A state is a set of threads: anyOf, a number that may end or go
 * on, and an enum value that is a prefix of another are followed side by side (a small NFA over stacks)
 * and merged where they meet again. Inside a string the frame is returned unchanged, so a long string
 * keeps one state (and one cached mask).
 *
 * Whitespace between tokens is bounded (MAX_GAP characters, one newline): the pretty-printed layout a
 * model writes passes, a model stuck emitting blanks does not run to max_tokens inside a valid prefix.
 * Number digit runs are bounded (MAX_DIGITS) for the same reason.
 */
import type { SchemaNode, SchemaProp } from './json-schema.js';

const MAX_GAP = 20;
const NEWLINE = 100;
const MAX_DIGITS = 16;

/** The document around the root value: st 0 before it, 1 after it (only the end may follow). */
interface DocNode {
  readonly kind: 'doc';
  readonly id: -1;
  readonly root: SchemaNode;
}
type Node = SchemaNode | DocNode;

export class Frame {
  private memo: string | undefined;
  private costMemo: number | undefined;
  private afterMemo: number | undefined;

  constructor(
    readonly node: Node,
    /** The phase within the node (see feed). */
    readonly st: number,
    /** object: next property index; number: digits in the current run; string: hex digits left. */
    readonly i: number,
    /** object: the property whose key was read. */
    readonly j: number,
    /** literal or object key: the text read so far. */
    readonly p: string,
    /** Whitespace in the current gap: spaces + NEWLINE x newlines. */
    readonly ws: number,
    readonly up: Frame | null,
  ) {}

  /** Identifies the thread's whole stack (equal keys: equal futures). */
  get key(): string {
    this.memo ??= `${this.up ? this.up.key : ''}/${this.node.id}.${this.st}.${this.i}.${this.j}.${this.ws}.${this.p}`;
    return this.memo;
  }

  with(st: number, i = this.i, j = this.j, p = this.p, ws = 0): Frame {
    return new Frame(this.node, st, i, j, p, ws, this.up);
  }

  /** The fewest characters that complete the document from this thread (memoized: frames are immutable and shared). */
  get cost(): number {
    this.costMemo ??= frameCost(this);
    return this.costMemo;
  }

  /** The fewest characters that complete the document once this frame's child value is complete. */
  get afterChild(): number {
    if (this.afterMemo === undefined) {
      let best = Infinity;
      for (const p of closeValue(this)) best = Math.min(best, p.cost);
      this.afterMemo = best;
    }
    return this.afterMemo;
  }
}

export type State = readonly Frame[];

const NONE: Frame[] = [];

/** The state before the first character of a document of `root`. */
export function initialState(root: SchemaNode): State {
  return [new Frame({ kind: 'doc', id: -1, root }, 0, 0, 0, '', 0, null)];
}

/** The states after reading `c` from `state` (empty: `c` cannot come next). */
export function advance(state: State, c: string): State {
  if (state.length === 1) return feed(state[0]!, c);
  const out: Frame[] = [];
  for (const f of state) for (const g of feed(f, c)) out.push(g);
  return dedupe(out);
}

/** `text` read character by character; empty where it cannot be read. */
export function advanceText(state: State, text: string): State {
  let s = state;
  for (let k = 0; k < text.length && s.length > 0; k++) s = advance(s, text[k]!);
  return s;
}

function dedupe(frames: Frame[]): Frame[] {
  if (frames.length < 2) return frames;
  const seen = new Map<string, Frame>();
  for (const f of frames) if (!seen.has(f.key)) seen.set(f.key, f);
  return [...seen.values()];
}

/** Whether the document is complete in `state` (the end of generation may come). */
export function canEnd(state: State): boolean {
  return state.some(endsHere);
}

/** Whether nothing but the end can follow (the document is complete and cannot grow). */
export function mustEnd(state: State): boolean {
  return state.length > 0 && state.every((f) => f.node.kind === 'doc' && f.st === 1);
}

/** The key of a state (its threads' keys, order-free): the mask cache's key. */
export function stateKey(state: State): string {
  return state.length === 1 ? state[0]!.key : state.map((f) => f.key).sort().join('#');
}

/** Whether every thread is inside a string's plain characters (any character but `"`, `\` and controls continues it). */
export function inPlainString(state: State): boolean {
  return state.length > 0 && state.every((f) => f.node.kind === 'string' && f.st === 1);
}

function endsHere(f: Frame): boolean {
  if (f.node.kind === 'doc') return f.st === 1;
  if (!complete(f)) return false;
  return closeValue(f.up!).some(endsHere);
}

/** Whether a value that has no closing character (number, literal) may end where it is. */
function complete(f: Frame): boolean {
  const n = f.node;
  if (n.kind === 'number') return f.st === 2 || f.st === 3 || f.st === 5 || f.st === 8;
  if (n.kind === 'literal') return n.texts.includes(f.p);
  return false;
}

/** The parent once its child value is complete. */
function closeValue(up: Frame): Frame[] {
  const n = up.node;
  if (n.kind === 'doc') return [up.with(1)];
  if (n.kind === 'object') {
    if (up.st === 4) return [up.with(5, up.j + 1)];
    if (up.st === 7) return [up.with(3)];
  }
  if (n.kind === 'array') return [up.with(2)];
  throw new Error(`a value closed into ${n.kind} phase ${up.st}`);
}

/** The frames a value of `node` starts as (anyOf: one per branch), under `up`. */
function start(node: SchemaNode, up: Frame): Frame[] {
  if (node.kind === 'anyOf') return node.options.flatMap((o) => start(o, up));
  return [new Frame(node, 0, 0, 0, '', 0, up)];
}

/** A value of `node` begun with `c`. */
function startWith(node: SchemaNode, up: Frame, c: string): Frame[] {
  const out: Frame[] = [];
  for (const f of start(node, up)) for (const g of feed(f, c)) out.push(g);
  return out;
}

/** The frame after a whitespace character in a gap, or none where the gap is full. */
function gap(f: Frame, c: string): Frame[] {
  if (c === ' ') return f.ws % NEWLINE < MAX_GAP ? [f.with(f.st, f.i, f.j, f.p, f.ws + 1)] : NONE;
  if (c === '\n') return f.ws < NEWLINE ? [f.with(f.st, f.i, f.j, f.p, f.ws + NEWLINE)] : NONE;
  return NONE;
}

const isWs = (c: string) => c === ' ' || c === '\n';
const isDigit = (c: string) => c >= '0' && c <= '9';
const isHex = (c: string) => isDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');

/** Ends a closable value (number, literal) before `c`, and gives `c` to the parent. */
function endThenFeed(f: Frame, c: string): Frame[] {
  if (!complete(f)) return NONE;
  const out: Frame[] = [];
  for (const p of closeValue(f.up!)) for (const g of feed(p, c)) out.push(g);
  return out;
}

function feed(f: Frame, c: string): Frame[] {
  const n = f.node;
  if (n.kind === 'doc') return f.st === 0 ? startWith(n.root, f, c) : NONE;
  switch (n.kind) {
    case 'string': return feedString(f, c);
    case 'number': return feedNumber(f, n.integer, c);
    case 'literal': return feedLiteral(f, n.texts, c);
    case 'object': return feedObject(f, n, c);
    case 'array': return feedArray(f, n, c);
    case 'anyOf': throw new Error('anyOf has no frame of its own');
  }
}

function feedString(f: Frame, c: string): Frame[] {
  switch (f.st) {
    case 0: return c === '"' ? [f.with(1)] : NONE;
    case 1:
      if (c === '"') return closeValue(f.up!);
      if (c === '\\') return [f.with(2)];
      return c.charCodeAt(0) < 0x20 ? NONE : [f];
    case 2:
      if (c === 'u') return [f.with(3, 4)];
      return '"\\/bfnrt'.includes(c) ? [f.with(1)] : NONE;
    default:
      if (!isHex(c)) return NONE;
      return [f.i > 1 ? f.with(3, f.i - 1) : f.with(1, 0)];
  }
}

/**
 * Phases: 0 start, 1 after '-', 2 integer digits, 3 a leading 0, 4 after '.', 5 fraction digits,
 * 6 after e/E, 7 after the exponent's sign, 8 exponent digits. 2, 3, 5 and 8 may end.
 */
function feedNumber(f: Frame, integer: boolean, c: string): Frame[] {
  const digit = isDigit(c);
  const run = (st: number) => (f.st === st ? (f.i < MAX_DIGITS ? [f.with(st, f.i + 1)] : NONE) : [f.with(st, 1)]);
  switch (f.st) {
    case 0:
    case 1:
      if (c === '-' && f.st === 0) return [f.with(1)];
      if (c === '0') return [f.with(3)];
      return digit ? run(2) : NONE;
    case 2:
      if (digit) return run(2);
      break;
    case 4: return digit ? run(5) : NONE;
    case 5:
      if (digit) return run(5);
      break;
    case 6:
      if (c === '+' || c === '-') return [f.with(7)];
      return digit ? run(8) : NONE;
    case 7: return digit ? run(8) : NONE;
    case 8:
      if (digit) return run(8);
      break;
  }
  if (!integer && (f.st === 2 || f.st === 3) && c === '.') return [f.with(4)];
  if (!integer && (f.st === 2 || f.st === 3 || f.st === 5) && (c === 'e' || c === 'E')) return [f.with(6)];
  return endThenFeed(f, c);
}

function feedLiteral(f: Frame, texts: readonly string[], c: string): Frame[] {
  const q = f.p + c;
  const grows = texts.some((t) => t.startsWith(q));
  const ends = texts.includes(f.p) ? endThenFeed(f, c) : NONE;
  if (!grows) return ends;
  const next = f.with(0, 0, 0, q);
  return ends.length === 0 ? [next] : [next, ...ends];
}

type ObjectNode = Extract<SchemaNode, { kind: 'object' }>;

/** Whether a required property lies at index i or after. */
function requiredFrom(n: ObjectNode, i: number): boolean {
  for (let k = i; k < n.props.length; k++) if (n.props[k]!.required) return true;
  return false;
}

/**
 * Phases: 0 before '{', 1 after '{', 6 after ',', 2 in a declared key (p: read so far), 7 in a free key
 * (a string child), 3 after a key, 4 after ':', 5 after a value. i: the first property that may come next.
 */
function feedObject(f: Frame, n: ObjectNode, c: string): Frame[] {
  const free = n.props.length === 0;
  switch (f.st) {
    case 0: return c === '{' ? [f.with(1, 0)] : NONE;
    case 1:
    case 6:
      if (isWs(c)) return gap(f, c);
      if (c === '}' && f.st === 1 && !requiredFrom(n, 0)) return closeValue(f.up!);
      if (c !== '"') return NONE;
      if (free) return n.extra ? startWith({ kind: 'string', id: -2 }, f.with(7), c) : NONE;
      return keyChar(f, n, c);
    case 2: return keyChar(f, n, c);
    case 3: return c === ':' ? [f.with(4)] : NONE;
    case 4:
      if (isWs(c)) return gap(f, c);
      return startWith(free ? n.extra! : n.props[f.j]!.node, f.with(4), c);
    case 5:
      if (isWs(c)) return gap(f, c);
      if (c === '}') return requiredFrom(n, f.i) ? NONE : closeValue(f.up!);
      if (c === ',') return free || f.i < n.props.length ? [f.with(6)] : NONE;
      return NONE;
    default: return NONE;
  }
}

/** A key character: the key read so far must begin one of the properties that may come next. */
function keyChar(f: Frame, n: ObjectNode, c: string): Frame[] {
  const q = (f.st === 2 ? f.p : '') + c;
  let grows = false;
  for (let j = f.i; j < n.props.length; j++) {
    const k = n.props[j]!.keyText;
    if (k === q) return [f.with(3, f.i, j, '')];
    if (k.startsWith(q)) grows = true;
    if (n.props[j]!.required) break;
  }
  return grows ? [f.with(2, f.i, 0, q)] : NONE;
}

/** Phases: 0 before '[', 1 after '[', 2 after an item, 3 after ','. */
function feedArray(f: Frame, n: Extract<SchemaNode, { kind: 'array' }>, c: string): Frame[] {
  switch (f.st) {
    case 0: return c === '[' ? [f.with(1)] : NONE;
    case 1:
      if (isWs(c)) return gap(f, c);
      if (c === ']') return closeValue(f.up!);
      return startWith(n.items, f.with(1), c);
    case 2:
      if (isWs(c)) return gap(f, c);
      if (c === ']') return closeValue(f.up!);
      return c === ',' ? [f.with(3)] : NONE;
    case 3:
      if (isWs(c)) return gap(f, c);
      return startWith(n.items, f.with(3), c);
    default: return NONE;
  }
}

/**
 * The fewest characters that complete the document from `state` (0: it may end here; Infinity: it
 * cannot). The shortest completion is ASCII punctuation, digits and the schema's keys, one character
 * at a time, and a byte-level vocabulary holds every ASCII character as a token of its own, so this
 * also bounds the tokens still needed: what keeps a constrained row inside max_tokens (token-mask.ts).
 */
export function charsToClose(state: State): number {
  let best = Infinity;
  for (const f of state) best = Math.min(best, f.cost);
  return best;
}

function frameCost(f: Frame): number {
  const n = f.node;
  if (n.kind === 'doc') return f.st === 1 ? 0 : minLength(n.root);
  const own = toClose(f, n);
  return own === Infinity ? Infinity : own + f.up!.afterChild;
}

/** The fewest characters that finish the value `f` is in (up to its closing character, or until it may end). */
function toClose(f: Frame, n: SchemaNode): number {
  switch (n.kind) {
    case 'string': return f.st === 0 ? 2 : f.st === 1 ? 1 : f.st === 2 ? 2 : f.i + 1;
    case 'number': return f.st === 2 || f.st === 3 || f.st === 5 || f.st === 8 ? 0 : 1;
    case 'literal': {
      let best = Infinity;
      for (const t of n.texts) if (t.startsWith(f.p)) best = Math.min(best, t.length - f.p.length);
      return best;
    }
    case 'array': return f.st === 0 ? 2 : f.st === 3 ? minLength(n.items) + 1 : 1;
    case 'object': return objectToClose(f, n);
    case 'anyOf': return Infinity;
  }
}

/** A property written whole: its key, ':' and the shortest value. */
const propLength = (p: SchemaProp) => p.keyText.length + 1 + minLength(p.node);

/** From where property i may come next, to '}' inclusive; `first`: no ',' is due before the next property. */
function objectTail(n: ObjectNode, i: number, first: boolean): number {
  let sum = 0, count = 0;
  for (let k = i; k < n.props.length; k++) {
    if (!n.props[k]!.required) continue;
    sum += propLength(n.props[k]!);
    count++;
  }
  return count === 0 ? 1 : sum + (first ? count - 1 : count) + 1;
}

function objectToClose(f: Frame, n: ObjectNode): number {
  const free = n.props.length === 0;
  const freeProp = n.extra ? 2 + 1 + minLength(n.extra) : Infinity;
  switch (f.st) {
    case 0: return minLength(n);
    case 1: return free ? 1 : objectTail(n, 0, true);
    case 5: return free ? 1 : objectTail(n, f.i, false);
    case 6: {
      // After ',', a property must follow.
      if (free) return freeProp + 1;
      if (requiredFrom(n, f.i)) return objectTail(n, f.i, true);
      let best = Infinity;
      for (let j = f.i; j < n.props.length; j++) best = Math.min(best, propLength(n.props[j]!));
      return best + 1;
    }
    case 2: {
      let best = Infinity;
      for (let j = f.i; j < n.props.length; j++) {
        const p = n.props[j]!;
        if (p.keyText.startsWith(f.p)) best = Math.min(best, p.keyText.length - f.p.length + 1 + minLength(p.node) + objectTail(n, j + 1, false));
        if (p.required) break;
      }
      return best;
    }
    case 3: return free ? 1 + minLength(n.extra!) + 1 : 1 + minLength(n.props[f.j]!.node) + objectTail(n, f.j + 1, false);
    case 4: return free ? minLength(n.extra!) + 1 : minLength(n.props[f.j]!.node) + objectTail(n, f.j + 1, false);
    default: return freeProp + 1;
  }
}

const minLengths = new WeakMap<SchemaNode, number>();

/** The fewest characters of a value of `n` (a cycle through required values never closes: Infinity). */
function minLength(n: SchemaNode): number {
  const hit = minLengths.get(n);
  if (hit !== undefined) return hit;
  minLengths.set(n, Infinity);
  let v: number;
  switch (n.kind) {
    case 'string':
    case 'array': v = 2; break;
    case 'number': v = 1; break;
    case 'literal': v = Math.min(...n.texts.map((t) => t.length)); break;
    case 'anyOf': v = Math.min(...n.options.map(minLength)); break;
    case 'object': v = 1 + (n.props.length === 0 ? 1 : objectTail(n, 0, true)); break;
  }
  minLengths.set(n, v);
  return v;
}
