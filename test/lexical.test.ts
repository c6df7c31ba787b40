/**
 * The lexical index (MiniSearch) scores by Okapi BM25 with MiniSearch's one difference from the
 * baseline (bench/bm25.ts): a chunk's length is its number of distinct terms. It follows the store by
 * chunk id.
 */
import assert from 'node:assert/strict';
import { readFile, readdir } from 'node:fs/promises';
import path from 'node:path';
import { test } from 'node:test';
import { LexicalIndex, lexicalTerms, type LexicalEntry } from '../src/retrieval/lexical.js';
import { reciprocalRankFusion } from '../src/retrieval/fusion.js';
import { CORPUS } from './helpers.js';

/** Chunks as BM25 sees them ("title\ntext", id = position): each paragraph of a few corpus documents. */
async function source(docs: number): Promise<LexicalEntry[]> {
  const out: LexicalEntry[] = [];
  const names = (await readdir(CORPUS)).filter((n) => n.endsWith('.txt')).sort().slice(0, docs);
  for (const n of names) {
    const raw = await readFile(path.join(CORPUS, n), 'utf8');
    const [title, ...paras] = raw.split('\n\n');
    for (const p of paras) if (p.trim()) out.push({ id: out.length, text: `${title}\n${p}` });
  }
  return out;
}

const QUERIES = ['How do I cancel a job queued with at?', 'apt pinning priority of a package', 'the the the', 'kernel module blacklist', 'zzzz qqqq'];

/** BM25 written out (Lucene's idf), lengths in distinct terms: what MiniSearch computes with d = 0. */
function reference(texts: readonly string[], query: string, k1: number, b: number): { index: number; score: number }[] {
  const docs = texts.map((t) => lexicalTerms(t));
  const len = docs.map((d) => new Set(d).size);
  const avg = len.reduce((a, x) => a + x, 0) / docs.length;
  const scores = docs.map(() => 0);
  for (const term of new Set(lexicalTerms(query))) {
    const n = docs.filter((d) => d.includes(term)).length;
    if (n === 0) continue;
    const idf = Math.log(1 + (docs.length - n + 0.5) / (n + 0.5));
    docs.forEach((d, i) => {
      const tf = d.filter((x) => x === term).length;
      if (tf > 0) scores[i]! += (idf * tf * (k1 + 1)) / (tf + k1 * (1 - b + (b * len[i]!) / avg));
    });
  }
  return scores.map((score, index) => ({ index, score })).filter((h) => h.score > 0).sort((x, y) => y.score - x.score || x.index - y.index);
}

test('BM25 scores and order equal the formula', async () => {
  const src = await source(6);
  const lex = new LexicalIndex({ k1: 1.2, b: 0.75 });
  lex.add(src);
  assert.equal(lex.size, src.length);
  const texts = src.map((e) => e.text);
  for (const q of QUERIES) {
    const want = reference(texts, q, 1.2, 0.75).slice(0, 10);
    const got = lex.search(q, 10);
    assert.deepEqual(got.map((h) => h.chunkId), want.map((h) => h.index), q);
    got.forEach((h, i) => assert.ok(Math.abs(h.score - want[i]!.score) < 1e-9, `${q}: ${h.score} vs ${want[i]!.score}`));
  }
  assert.deepEqual(lex.search('the the the', 5), [], 'stopwords only: nothing matches');
});

test('added chunks are found, removed ones are not, and the scores are those of the chunks left', async () => {
  const src = await source(2);
  const lex = new LexicalIndex({ k1: 1.2, b: 0.75 });
  lex.add(src);
  assert.deepEqual(lex.search('xylophonic quasar', 3), []);
  const extra = { id: src.length, text: 'Extra\na xylophonic quasar sings' };
  lex.add([extra]);
  assert.equal(lex.search('xylophonic quasar', 3)[0]?.chunkId, extra.id);
  lex.remove([extra.id, 0]);
  assert.equal(lex.size, src.length - 1);
  assert.deepEqual(lex.search('xylophonic quasar', 3), []);
  const left = src.slice(1);
  const q = QUERIES[0]!;
  const want = reference(left.map((e) => e.text), q, 1.2, 0.75).slice(0, 5);
  const got = lex.search(q, 5);
  assert.deepEqual(got.map((h) => h.chunkId), want.map((h) => left[h.index]!.id));
  got.forEach((h, i) => assert.ok(Math.abs(h.score - want[i]!.score) < 1e-9, `${h.score} vs ${want[i]!.score}`));
});

test('a filter applies before the cut: k hits when k pass', async () => {
  const src = await source(6);
  const lex = new LexicalIndex({ k1: 1.2, b: 0.75 });
  lex.add(src);
  const q = 'package file system user';
  const all = lex.search(q, 1000);
  const odd = lex.search(q, 5, (id) => id % 2 === 1);
  assert.equal(odd.length, 5);
  assert.deepEqual(odd, all.filter((h) => h.chunkId % 2 === 1).slice(0, 5));
});

test('reciprocal-rank fusion: weights, ranks, absent items, deterministic ties', () => {
  const fused = reciprocalRankFusion([{ items: [1, 2, 3], weight: 1 }, { items: [3, 4, 1], weight: 1 }], (x) => x, 60);
  assert.deepEqual(fused.map((f) => f.item), [1, 3, 2, 4]);
  assert.ok(Math.abs(fused[0]!.score - (1 / 61 + 1 / 63)) < 1e-12);
  assert.deepEqual(fused[1]!.ranks, [3, 1]);
  assert.deepEqual(fused[3]!.ranks, [0, 2]);
  // A heavier lexical weight puts its head first.
  const lexFirst = reciprocalRankFusion([{ items: [1, 2], weight: 1 }, { items: [2, 1], weight: 2 }], (x) => x, 60);
  assert.deepEqual(lexFirst.map((f) => f.item), [2, 1]);
  // Equal scores: the better rank in the first list wins.
  const tie = reciprocalRankFusion([{ items: [5, 6], weight: 1 }, { items: [6, 5], weight: 1 }], (x) => x, 60);
  assert.deepEqual(tie.map((f) => f.item), [5, 6]);
  // A weight of 0 leaves the list out of the order.
  const denseOnly = reciprocalRankFusion([{ items: [7, 8], weight: 1 }, { items: [8, 9], weight: 0 }], (x) => x, 60);
  assert.deepEqual(denseOnly.slice(0, 2).map((f) => f.item), [7, 8]);
});
