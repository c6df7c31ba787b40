/**
 * The copied-span constraint of /query answers (src/generate/span-answer.ts), without a model: the suffix
 * automaton against String.includes, the mask walk against a token-by-token check, and a guide's life
 * (opening span, closing, EOS, the budget, the end of the line) in both modes.
 */
import assert from 'node:assert/strict';
import test from 'node:test';
import { advanceSpanText, SpanAnswerGrammar, spanMask, SubstringAutomaton, type SpanState } from '../src/generate/span-answer.js';
import { maskHas, TokenVocabulary } from '../src/generate/structured/token-mask.js';

function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), a | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const CONTEXT = ['Managing volumes', 'The vgcreate command assembles physical volumes into a volume group; lvcreate makes logical volumes.\nSee /etc/lvm/lvm.conf.'];

test('the suffix automaton knows exactly the substrings of each text, never one across two', () => {
  const r = rng(7);
  const alphabet = 'ab c`\n';
  const texts = Array.from({ length: 4 }, () => Array.from({ length: 30 }, () => alphabet[Math.floor(r() * alphabet.length)]).join(''));
  const sam = new SubstringAutomaton(texts);
  assert.ok(sam.size <= 2 * (texts.join('\u0000').length + 1));
  for (let k = 0; k < 3000; k++) {
    const n = 1 + Math.floor(r() * 6);
    const s = Array.from({ length: n }, () => alphabet[Math.floor(r() * alphabet.length)]).join('');
    assert.equal(sam.has(s), texts.some((t) => t.includes(s)), JSON.stringify(s));
  }
  for (const t of texts) for (let i = 0; i < t.length; i++) assert.ok(sam.has(t.slice(i, i + 5)));
  assert.equal(sam.has(`${texts[0]!.slice(-2)}\u0000${texts[1]!.slice(0, 2)}`), false);
  const two = new SubstringAutomaton(['abc', 'xyz']);
  assert.equal(two.has('cx'), false);
  assert.equal(two.has('bc'), true);
});

/** A toy vocabulary: every text its own token; the last id is EOS (no text). */
function vocab(texts: readonly string[]): { v: TokenVocabulary; eos: number } {
  const eos = texts.length;
  return { v: new TokenVocabulary(texts.length + 1, [...texts, undefined], [eos]), eos };
}

const TOKENS = ['`', '`v', '`vg', 'vg', 'create', ' create', '`.', '` ', '`,', '``', ' the', 'The', ' command', 'cmd', ' ', '\n', 'lv', 'm.conf', '/etc', '/lvm', 'e`', ' volume', 's', 'apt', '`apt', '.', 'x`q'];

test('the mask is exactly the tokens the constraint reads whole, in every state a prefix reaches', () => {
  const { v, eos } = vocab(TOKENS);
  const sam = new SubstringAutomaton(CONTEXT);
  const prefixes = ['', '`', '`vg', '`vgcreate', '`vgcreate`', '`vgcreate` is', '`/etc/lvm/lvm', '` ', '`volume group; lv', 'free text `lv'];
  for (const start of [{ phase: 'open' } as SpanState, { phase: 'free' } as SpanState]) {
    for (const p of prefixes) {
      const state = advanceSpanText(sam, start, p);
      if (!state) continue;
      for (const closeOnly of [false, true]) {
        const m = spanMask(v, sam, state, closeOnly);
        TOKENS.forEach((t, id) => {
          const next = advanceSpanText(sam, state, t);
          const want = next !== undefined && (!closeOnly || state.phase !== 'span' || next.phase === 'free');
          assert.equal(maskHas(m, id), want, `${start.phase} ${JSON.stringify(p)} closeOnly=${closeOnly} token ${JSON.stringify(t)}`);
        });
        assert.equal(maskHas(m, eos), state.phase === 'free', `EOS after ${JSON.stringify(p)}`);
      }
    }
  }
});

test('spans: copied verbatim (case and all), no newline, not empty or blank, at most maxChars', () => {
  const sam = new SubstringAutomaton(CONTEXT);
  const open: SpanState = { phase: 'open' };
  assert.equal(advanceSpanText(sam, open, '`vgcreate`')?.phase, 'free');
  assert.equal(advanceSpanText(sam, open, '`Vgcreate`'), undefined);
  assert.equal(advanceSpanText(sam, open, '`apt-get`'), undefined);
  assert.equal(advanceSpanText(sam, open, 'The `vgcreate`'), undefined);
  assert.equal(advanceSpanText(sam, open, '``'), undefined);
  assert.equal(advanceSpanText(sam, open, '` `'), undefined);
  assert.equal(advanceSpanText(sam, open, '`group; lvcreate`')?.phase, 'free');
  assert.equal(advanceSpanText(sam, open, '`volumes.\nSee`'), undefined);
  assert.equal(advanceSpanText(sam, open, '`Managing volumes`')?.phase, 'free');
  assert.equal(advanceSpanText(sam, open, '`volumes\u0000The`'), undefined);
  assert.equal(advanceSpanText(sam, open, '`vgcreate command`', 8), undefined);
  assert.equal(advanceSpanText(sam, open, '`vgcreate`', 8)?.phase, 'free');
  // In free text, anything; a backtick opens a span that must be copied again.
  assert.equal(advanceSpanText(sam, open, '`vgcreate` makes a VG; see `/etc/lvm/lvm.conf`.')?.phase, 'free');
  assert.equal(advanceSpanText(sam, open, '`vgcreate` makes a VG; see `/etc/lvm.conf`.'), undefined);
});

test("mode 'first': the answer opens with a copied span, ends at the line's end; EOS only after the span", () => {
  const { v, eos } = vocab(TOKENS);
  const id = (t: string) => TOKENS.indexOf(t);
  const g = new SpanAnswerGrammar(v, CONTEXT, 'first');
  const guide = g.start(64);
  assert.equal(guide.allows(id('The')), false);
  assert.equal(guide.allows(eos), false);
  assert.equal(guide.allows(id('`vg')), true);
  assert.equal(guide.allows(id('`apt')), false);
  assert.equal(maskHas(guide.mask(), id('`vg')), true);
  assert.equal(maskHas(guide.mask(), id('The')), false);
  guide.accept(id('`vg'));
  assert.equal(guide.phase, 'span');
  assert.equal(guide.allows(eos), false);
  assert.equal(guide.allows(id('create')), true);
  assert.equal(guide.allows(id(' create')), false);
  guide.accept(id('create'));
  assert.equal(guide.allows(id('` ')), true);
  guide.accept(id('` '));
  assert.equal(guide.complete, true);
  assert.equal(guide.done, false);
  assert.equal(guide.allows(eos), true);
  assert.equal(guide.allows(id('apt')), true);
  guide.accept(id(' the'));
  guide.accept(id('\n'));
  assert.equal(guide.done, true);
  // The engine decodes a constrained row with the grammar's vocabulary.
  assert.equal(g.vocab.decode([id('`vg'), id('create'), id('` '), id(' the')]), '`vgcreate`  the');
});

test("mode 'first': a line of free text ends after freeTokens tokens", () => {
  const { v } = vocab(TOKENS);
  const id = (t: string) => TOKENS.indexOf(t);
  const guide = new SpanAnswerGrammar(v, CONTEXT, 'first', 80, 3).start();
  for (const t of ['`vg', 'create', '` ']) guide.accept(id(t));
  for (const t of [' the', ' command']) {
    guide.accept(id(t));
    assert.equal(guide.done, false);
  }
  guide.accept(id('s'));
  assert.equal(guide.done, true);
});

test("mode 'ticks': free text first, any code span copied, never done by the guide", () => {
  const { v, eos } = vocab(TOKENS);
  const id = (t: string) => TOKENS.indexOf(t);
  const guide = new SpanAnswerGrammar(v, CONTEXT, 'ticks').start(64);
  assert.equal(guide.allows(id('The')), true);
  assert.equal(guide.allows(eos), true);
  guide.accept(id('The'));
  guide.accept(id(' command'));
  assert.equal(guide.allows(id('`apt')), false);
  assert.equal(guide.allows(id('`vg')), true);
  assert.equal(guide.allows(id('x`q')), false); // "q" opens nothing the context has
  guide.accept(id('`vg'));
  assert.equal(guide.allows(eos), false);
  guide.accept(id('create'));
  guide.accept(id('`.'));
  assert.equal(guide.allows(eos), true);
  for (let k = 0; k < 40; k++) guide.accept(id(' the'));
  assert.equal(guide.done, false);
});

test('the budget: one token left inside a span, only a closing token (steered), so the span never stays open', () => {
  const { v } = vocab(TOKENS);
  const id = (t: string) => TOKENS.indexOf(t);
  const guide = new SpanAnswerGrammar(v, CONTEXT, 'first').start(3);
  guide.accept(id('`vg'));
  assert.equal(guide.allows(id('create')), true);
  guide.accept(id('create'));
  assert.equal(guide.allows(id('create')), false);
  assert.equal(guide.allows(id('` ')), true);
  const m = guide.mask();
  assert.equal(maskHas(m, id('` ')), true);
  assert.equal(maskHas(m, id('s')), false);
  assert.equal(guide.steered, true);
});

test('nothing to copy (empty chunks): the guide lets the answer run rather than allow nothing', () => {
  const { v, eos } = vocab(TOKENS);
  const guide = new SpanAnswerGrammar(v, [''], 'first').start(16);
  const m = guide.mask();
  assert.equal(maskHas(m, TOKENS.indexOf('The')), true);
  assert.equal(maskHas(m, eos), true);
});
