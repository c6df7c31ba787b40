/**
 * Constrained decoding's pure parts on the CPU: the schema subset (refused keywords named), the JSON
 * automaton against JSON.parse and a validator, and the token masks against a brute-force reference
 * (every token's text read through the automaton) on the tests' small byte-level tokenizer.
 */
import assert from 'node:assert/strict';
import path from 'node:path';
import { before, describe, test } from 'node:test';
import { advance, advanceText, canEnd, charsToClose, initialState, stateKey, type State } from '../src/generate/structured/json-automaton.js';
import { anyObjectSchema, compileSchema, SchemaNotSupportedError, validates } from '../src/generate/structured/json-schema.js';
import { maskHas, TokenGrammar, TokenVocabulary, vocabularyFor } from '../src/generate/structured/token-mask.js';
import { seededRandom } from '../src/generate/sampler.js';
import { TextTokenizer } from '../src/runtime/tokenizer.js';
import { ROOT } from './helpers.js';

const PERSON = {
  type: 'object',
  properties: {
    name: { type: 'string' },
    age: { type: 'integer' },
    score: { type: ['number', 'null'] },
    tags: { type: 'array', items: { enum: ['red', 'green', 'blue'] } },
    address: { type: 'object', properties: { city: { type: 'string' }, zip: { type: 'string' } }, required: ['city'], additionalProperties: false },
    ok: { type: 'boolean' },
  },
  required: ['name', 'age', 'tags'],
  additionalProperties: false,
};
const SCHEMAS: Record<string, unknown> = {
  person: PERSON,
  anyOf: { anyOf: [{ type: 'object', properties: { kind: { const: 'a' }, n: { type: 'number' } }, required: ['kind', 'n'] }, { type: 'array', items: { type: 'integer' } }] },
  map: { type: 'object', additionalProperties: { type: 'integer' } },
  enumNumbers: { enum: [1, 12, 123, 'x'] },
};

let vocab: TokenVocabulary;
const EOS = 2;

before(async () => {
  const tok = await TextTokenizer.load(path.join(ROOT, 'models', 'decoder-gqa'));
  vocab = await vocabularyFor(tok, 4096, [EOS]);
});

const read = (schema: unknown, text: string): State => advanceText(initialState(compileSchema(schema).root), text);

describe('the schema subset', () => {
  test('a keyword outside it is refused by name and place', () => {
    for (const [schema, keyword] of [
      [{ type: 'string', pattern: '^a' }, 'pattern'],
      [{ type: 'object', properties: { a: { type: 'string', format: 'date' } } }, 'format'],
      [{ type: 'array', items: { type: 'integer' }, minItems: 2 }, 'minItems'],
      [{ $ref: '#/$defs/x' }, '$ref'],
      [{ type: 'object', properties: { a: { type: 'string' } }, required: ['b'] }, 'required'],
      [{ type: 'string', properties: {} }, 'properties'],
    ] as const) {
      assert.throws(() => compileSchema(schema), (e: unknown) => e instanceof SchemaNotSupportedError && e.keyword === keyword && e.message.includes(keyword), JSON.stringify(schema));
    }
    assert.throws(() => compileSchema({ type: 'object', properties: { a: { type: 'string', maxLength: 3 } } }), /schema\.properties\.a: the keyword 'maxLength'/);
  });
});

describe('the JSON automaton', () => {
  const accepts = (schema: unknown, text: string) => canEnd(read(schema, text));
  test('documents that validate are read whole; others are refused where they go wrong', () => {
    const good = [
      '{"name": "Ann", "age": 3, "tags": []}',
      '{\n  "name": "A\\"n\\u00e9",\n  "age": -12,\n  "score": null,\n  "tags": ["red", "blue"],\n  "address": {"city": "Oslo"},\n  "ok": true\n}',
      '{"name":"","age":0,"score":1.5e-3,"tags":["green"],"ok":false}',
    ];
    for (const t of good) {
      assert.ok(validates(JSON.parse(t), PERSON), t);
      assert.ok(accepts(PERSON, t), t);
    }
    const bad = [
      '{"age": 3, "name": "x", "tags": []}', // out of declared order
      '{"name": "x", "tags": []}', // a required property skipped
      '{"name": "x", "age": 1.5, "tags": []}', // not an integer
      '{"name": "x", "age": 01, "tags": []}',
      '{"name": "x", "age": 1, "tags": ["pink"]}',
      '{"name": "x", "age": 1, "tags": [], "extra": 1}',
      '{"name": "x", "age": 1, "tags": [],}',
      '{"name": "x\n", "age": 1, "tags": []}',
    ];
    for (const t of bad) assert.ok(!accepts(PERSON, t), t);
    assert.ok(accepts(SCHEMAS['anyOf'], '{"kind": "a", "n": 2}') && accepts(SCHEMAS['anyOf'], '[1, 2]') && !accepts(SCHEMAS['anyOf'], '[1.5]'));
    assert.ok(accepts(SCHEMAS['map'], '{"a": 1, "b": 2}') && !accepts(SCHEMAS['map'], '{"a": "x"}'));
    for (const t of ['1', '12', '123', '"x"']) assert.ok(accepts(SCHEMAS['enumNumbers'], t), t);
    assert.ok(!accepts(SCHEMAS['enumNumbers'], '13'));
    assert.ok(accepts(true, '{"a": [1, {"b": null}]}'));
  });

  test('json_object: any object, not any value', () => {
    const st = (t: string) => advanceText(initialState(anyObjectSchema().root), t);
    assert.ok(canEnd(st('{"a": [1, "x", {"b": false}], "c": {}}')));
    assert.equal(st('[1]').length, 0);
    assert.equal(st('"x"').length, 0);
  });

  test('blank runs are bounded', () => {
    assert.ok(read(PERSON, '{' + ' '.repeat(20)).length > 0);
    assert.equal(read(PERSON, '{' + ' '.repeat(21)).length, 0);
    assert.equal(read(PERSON, '{\n\n').length, 0);
  });
});

describe('token masks', () => {
  /** The reference: every token's text read through the automaton, EOS where the document may end. */
  function bruteForce(state: State): Set<number> {
    const out = new Set<number>();
    for (let id = 0; id < vocab.size; id++) {
      if (id === EOS) {
        if (canEnd(state)) out.add(id);
        continue;
      }
      const t = vocab.text(id);
      if (t !== undefined && advanceText(state, t).length > 0) out.add(id);
    }
    return out;
  }

  test('equal the brute-force reference along random constrained walks', () => {
    const random = seededRandom(7);
    let checked = 0;
    for (const [name, schema] of Object.entries(SCHEMAS)) {
      const grammar = new TokenGrammar(compileSchema(schema), vocab);
      for (let walk = 0; walk < 3; walk++) {
        const guide = grammar.start();
        let state = initialState(grammar.schema.root);
        for (let step = 0; step < 25; step++) {
          const mask = guide.mask();
          const want = bruteForce(state);
          const got = new Set<number>();
          for (let id = 0; id < vocab.size; id++) if (maskHas(mask, id)) got.add(id);
          assert.deepEqual([...got].sort((a, b) => a - b), [...want].sort((a, b) => a - b), `${name} walk ${walk} step ${step}`);
          checked++;
          for (const id of want) assert.ok(guide.allows(id));
          const ids = [...want].filter((id) => id !== EOS);
          if (ids.length === 0) break;
          const id = ids[Math.floor(random() * ids.length)]!;
          guide.accept(id);
          state = advanceText(state, vocab.text(id)!);
        }
      }
    }
    assert.ok(checked > 100, `${checked} states checked`);
  });

  test('equal the reference on a vocabulary of non-ASCII texts, with ASCII and non-ASCII enum values', () => {
    const random = seededRandom(3);
    const alphabet = ['{', '}', '[', ']', '"', ':', ',', ' ', '\n', 'a', 'b', '1', '0', '-', '.', 'e', 'é', '日', '\\', 'n', 'u', 'l', 't', 'r'];
    const texts = new Set<string>();
    while (texts.size < 3000) {
      const len = 1 + Math.floor(random() * 5);
      texts.add(Array.from({ length: len }, () => alphabet[Math.floor(random() * alphabet.length)]).join(''));
    }
    const list = [undefined, ...texts];
    const small = new TokenVocabulary(list.length, list, [0]);
    for (const schema of [{ type: 'object', properties: { a: { enum: ['é日', 'b'] }, b: { type: 'string' } }, required: ['a', 'b'] }, { type: 'array', items: { type: 'string' } }]) {
      const grammar = new TokenGrammar(compileSchema(schema), small);
      for (let walk = 0; walk < 4; walk++) {
        const guide = grammar.start();
        let state = initialState(grammar.schema.root);
        for (let step = 0; step < 20; step++) {
          const want: number[] = [];
          for (let id = 0; id < small.size; id++) {
            const t = small.text(id);
            if (id === 0 ? canEnd(state) : t !== undefined && advanceText(state, t).length > 0) want.push(id);
          }
          const mask = guide.mask();
          assert.deepEqual(want.filter((id) => maskHas(mask, id)), want);
          for (let id = 0; id < small.size; id++) assert.equal(maskHas(mask, id), want.includes(id), `token ${id} ${JSON.stringify(small.text(id))}`);
          const ids = want.filter((id) => id !== 0);
          if (ids.length === 0) break;
          const id = ids[Math.floor(random() * ids.length)]!;
          guide.accept(id);
          state = advanceText(state, small.text(id)!);
        }
      }
    }
  });

  test('a walk that takes only allowed tokens ends in a document that parses and validates', () => {
    const random = seededRandom(11);
    for (let k = 0; k < 20; k++) {
      const grammar = new TokenGrammar(compileSchema(PERSON), vocab);
      const guide = grammar.start();
      let text = '';
      // Prefer closing characters as the walk goes on, so it ends.
      for (let step = 0; step < 2000 && !guide.done; step++) {
        const mask = guide.mask();
        const ids: number[] = [];
        for (let id = 0; id < vocab.size; id++) if (maskHas(mask, id)) ids.push(id);
        if (ids.includes(EOS)) break;
        const closing = ids.filter((id) => /^[\]}"]/.test(vocab.text(id)!) || /^[0-9]$/.test(vocab.text(id)!));
        const pool = step > 10 && closing.length > 0 && random() < 0.7 ? closing : ids;
        const id = pool[Math.floor(random() * pool.length)]!;
        guide.accept(id);
        text += vocab.text(id);
      }
      assert.ok(guide.complete, text);
      assert.ok(validates(JSON.parse(text), PERSON), text);
    }
  });
});

describe('the token budget (max_tokens) of a constrained row', () => {
  /** The shortest completion by breadth-first search over characters (states merged by key). */
  function shortestByHand(start: State, alphabet: readonly string[]): number {
    let frontier: State[] = [start];
    const seen = new Set([stateKey(start)]);
    for (let depth = 0; depth < 200; depth++) {
      if (frontier.some(canEnd)) return depth;
      const next: State[] = [];
      for (const s of frontier) {
        for (const c of alphabet) {
          const t = advance(s, c);
          if (t.length === 0 || seen.has(stateKey(t))) continue;
          seen.add(stateKey(t));
          next.push(t);
        }
      }
      frontier = next;
    }
    return Infinity;
  }

  test('charsToClose equals the shortest completion found by search, along random walks', () => {
    const random = seededRandom(5);
    let checked = 0;
    for (const [name, schema] of Object.entries(SCHEMAS)) {
      const compiled = compileSchema(schema);
      const chars = new Set('{}[]":,-.e0123456789 \\nu'.split(''));
      for (const c of JSON.stringify(schema)) chars.add(c);
      const alphabet = [...chars];
      for (let walk = 0; walk < 4; walk++) {
        let state = initialState(compiled.root);
        for (let step = 0; step < 30; step++) {
          assert.equal(charsToClose(state), shortestByHand(state, alphabet), `${name} walk ${walk} step ${step}`);
          checked++;
          const options = alphabet.filter((c) => advance(state, c).length > 0);
          if (options.length === 0) break;
          state = advance(state, options[Math.floor(random() * options.length)]!);
        }
      }
    }
    assert.ok(checked > 200, `${checked} states checked`);
  });

  test('a row that takes any allowed token ends in a whole document within its budget', () => {
    const random = seededRandom(13);
    const grammar = new TokenGrammar(compileSchema(PERSON), vocab);
    const shortest = charsToClose(initialState(grammar.schema.root));
    let steered = 0;
    for (let budget = shortest; budget < shortest + 40; budget += 3) {
      for (let k = 0; k < 3; k++) {
        const guide = grammar.start(budget);
        let text = '';
        let tokens = 0;
        // Uniformly random allowed tokens: left alone such a walk almost never closes.
        while (tokens < budget && !guide.done) {
          const mask = guide.mask();
          const ids: number[] = [];
          for (let id = 0; id < vocab.size; id++) if (maskHas(mask, id) && id !== EOS) ids.push(id);
          assert.ok(ids.length > 0 || guide.complete, text);
          if (ids.length === 0) break;
          const id = ids[Math.floor(random() * ids.length)]!;
          assert.ok(guide.allows(id));
          guide.accept(id);
          text += vocab.text(id);
          tokens++;
        }
        assert.ok(guide.complete, `budget ${budget}: ${text}`);
        assert.ok(tokens <= budget);
        assert.ok(validates(JSON.parse(text), PERSON), text);
        if (guide.steered) steered++;
      }
    }
    assert.ok(steered > 0);
  });

  test('far from the budget the mask is the grammar\'s own', () => {
    const random = seededRandom(17);
    const grammar = new TokenGrammar(compileSchema(PERSON), vocab);
    const budgeted = grammar.start(10_000), free = grammar.start();
    for (let step = 0; step < 40 && !free.done; step++) {
      const a = budgeted.mask(), b = free.mask();
      assert.deepEqual([...a], [...b], `step ${step}`);
      const ids: number[] = [];
      for (let id = 0; id < vocab.size; id++) if (maskHas(b, id) && id !== EOS) ids.push(id);
      if (ids.length === 0) break;
      const id = ids[Math.floor(random() * ids.length)]!;
      budgeted.accept(id);
      free.accept(id);
    }
    assert.equal(budgeted.steered, false);
  });

  test('a budget below the shortest document takes the shortest way and does not throw', () => {
    const grammar = new TokenGrammar(compileSchema(PERSON), vocab);
    const guide = grammar.start(3);
    for (let k = 0; k < 3; k++) {
      const mask = guide.mask();
      let id = -1;
      for (let t = 0; t < vocab.size && id < 0; t++) if (maskHas(mask, t)) id = t;
      assert.ok(id >= 0);
      guide.accept(id);
    }
    assert.equal(guide.complete, false);
  });
});
