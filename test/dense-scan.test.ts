/**
 * The exact scan under the faiss store's per-collection searches (src/retrieval/dense-scan.ts): the ops
 * library's AVX512 loop and its portable C loop give the JavaScript reference's top k (the same rows, in
 * the same order, ties to the lower row; scores within float rounding of a different summation order), with
 * and without a bitmap of allowed rows, for widths that are and are not multiples of 16 and k past the
 * rows allowed. CollectionVectors on it: adds past the capacity, removals, clones.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { denseScanPath, scanTopK, scanTopKScript, setDenseScanPortable } from '../src/retrieval/dense-scan.js';
import { CollectionVectors } from '../src/retrieval/faiss-collections.js';
import { Bitmap } from '../src/retrieval/positions.js';
import { xorshift } from './helpers.js';

function data(n: number, d: number, seed: number): { rows: Float32Array; q: Float32Array } {
  const rand = xorshift(seed);
  const rows = new Float32Array(n * d).map(() => rand() - 0.5);
  // Ties: rows 3 and 7 equal to row 1.
  for (const r of [3, 7]) if (r < n) rows.copyWithin(r * d, d, 2 * d);
  return { rows, q: new Float32Array(d).map(() => rand() - 0.5) };
}

function same(got: { slots: number[]; scores: number[] }, want: { slots: number[]; scores: number[] }, what: string): void {
  assert.deepEqual(got.slots, want.slots, what);
  got.scores.forEach((s, i) => assert.ok(Math.abs(s - want.scores[i]!) <= 1e-5 * Math.max(1, Math.abs(s)), `${what}: score ${i} ${s} against ${want.scores[i]}`));
}

test('the native scans give the JavaScript reference\'s top k, with and without a bitmap', (t) => {
  if (denseScanPath() === 'js') return t.skip('the ops library is not built here (npm run setup)');
  const paths = denseScanPath() === 'avx512' ? [false, true] : [true];
  try {
    for (const portable of paths) {
      setDenseScanPortable(portable);
      for (const [n, d] of [[1, 16], [50, 7], [1000, 384], [333, 100]] as const) {
        const { rows, q } = data(n, d, n * 31 + d);
        const allow = new Bitmap(n);
        for (let r = 0; r < n; r += 3) allow.set(r);
        allow.set(1);
        allow.set(7); // a tie the bitmap lets through, and one it does not (3)
        for (const k of [1, 10, n + 5]) {
          same(scanTopK(rows, n, d, q, k), scanTopKScript(rows, n, d, q, k), `${portable ? 'c' : 'avx512'} n ${n} d ${d} k ${k}`);
          same(scanTopK(rows, n, d, q, k, allow.bytes), scanTopKScript(rows, n, d, q, k, allow.bytes), `${portable ? 'c' : 'avx512'} n ${n} d ${d} k ${k} bitmap`);
        }
      }
    }
  } finally {
    setDenseScanPortable(false);
  }
  // Ties to the lower row: rows 1, 3 and 7 score alike.
  const { rows, q } = data(10, 16, 5);
  const all = scanTopK(rows, 10, 16, q, 10).slots;
  assert.deepEqual(all.filter((s) => [1, 3, 7].includes(s)), [1, 3, 7]);
  assert.deepEqual(scanTopK(rows, 10, 16, q, 0), { slots: [], scores: [] });
  assert.throws(() => scanTopK(rows, 11, 16, q, 3), /floats for 11 rows/);
});

test('CollectionVectors: adds past its room, removals and clones search as the rows they hold', () => {
  const d = 24;
  const { rows, q } = data(40, d, 9);
  const v = CollectionVectors.empty(d);
  for (let i = 0; i < 40; i += 5) v.add([100 + i, 101 + i, 102 + i, 103 + i, 104 + i], rows.subarray(i * d, (i + 5) * d));
  assert.equal(v.size, 40);
  const ids = (slots: number[]) => slots.map((s) => 100 + s);
  assert.deepEqual(v.search(q, 40).ids, ids(scanTopKScript(rows, 40, d, q, 40).slots));
  const copy = v.clone();
  const gone = new Set([100, 117, 139]);
  v.remove(gone);
  assert.equal(v.size, 37);
  assert.deepEqual(v.slots, Array.from({ length: 40 }, (_, i) => 100 + i).filter((id) => !gone.has(id)));
  const kept = scanTopKScript(rows, 40, d, q, 40).slots.map((s) => 100 + s).filter((id) => !gone.has(id));
  assert.deepEqual(v.search(q, 40).ids, kept);
  assert.equal(copy.search(q, 40).ids.length, 40, 'the clone keeps what it had');
  const allow = new Bitmap(37);
  allow.set(0);
  allow.set(36);
  assert.deepEqual(new Set(v.search(q, 5, allow).ids), new Set([101, 138]));
  assert.throws(() => v.add([1], new Float32Array(d + 1)), /floats for 1 chunks/);
});
