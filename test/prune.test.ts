import assert from 'node:assert/strict';
import { test } from 'node:test';
import { dedupe, jaccard, prune } from '../src/retrieval/prune.js';
import type { Hit } from '../src/retrieval/retrieval-store.js';

const hit = (id: number, score: number, text: string): Hit => ({ chunk: { id, collection: 'default', docId: `d${id}`, title: `D${id}`, ord: 0, text, tokens: 1 }, score });

test('prune drops hits far below the best', () => {
  const hits = [hit(0, 0.9, 'a'), hit(1, 0.7, 'b'), hit(2, 0.61, 'c'), hit(3, 0.59, 'd'), hit(4, 0.2, 'e')];
  assert.deepEqual(prune(hits, 0.3).map((h) => h.chunk.id), [0, 1, 2]);
  assert.deepEqual(prune(hits, 0).map((h) => h.chunk.id), [0]);
  assert.deepEqual(prune([], 0.3), []);
});

test('dedupe keeps the best-scored copy of near-identical text, in input order', () => {
  const base = 'the quick brown fox jumps over the lazy dog near the river bank today';
  const hits = [
    hit(0, 0.5, base),
    hit(1, 0.8, 'something completely different about apt and dpkg packages'),
    hit(2, 0.9, `${base}!`), // same words, better score: this copy stays
    hit(3, 0.4, 'the quick brown fox'),
  ];
  const kept = dedupe(hits, 0.8).map((h) => h.chunk.id);
  assert.deepEqual(kept, [1, 2, 3]);
  // threshold 1 = only exact shingle sets
  assert.deepEqual(dedupe(hits, 1).map((h) => h.chunk.id), [1, 2, 3]);
});

test('overlapping neighbours from chunking are not duplicates', () => {
  const words = Array.from({ length: 120 }, (_, i) => `w${i}`);
  const a = words.slice(0, 100).join(' ');
  const b = words.slice(75, 120).join(' ');
  assert.equal(dedupe([hit(0, 0.9, a), hit(1, 0.8, b)], 0.8).length, 2);
});

test('jaccard of sets', () => {
  assert.equal(jaccard(new Set(['a', 'b']), new Set(['b', 'c'])), 1 / 3);
  assert.equal(jaccard(new Set(), new Set()), 1);
});
