import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Bm25, tokenize } from '../bench/bm25.js';

const docs = [
  'The apt tool installs packages from the Debian archive.',
  'Packages are installed with apt; apt also removes packages.',
  'Cron runs scheduled jobs; the crontab file lists them.',
  'Samba shares files with Windows machines.',
  'apt and dpkg manage packages; dpkg works on single package files.',
];

test('tokenize lowercases, splits on non-alphanumerics and drops stopwords', () => {
  assert.deepEqual(tokenize('How do I use APT-get, the /etc/cron.deny file?'), ['use', 'apt', 'get', 'etc', 'cron', 'deny', 'file']);
  assert.deepEqual(tokenize('  the of and  '), []);
});

test('a document holding the rare query term ranks first', () => {
  const bm = new Bm25(docs);
  const hits = bm.search('packages crontab', 5);
  assert.equal(hits[0]?.index, 2); // "crontab" occurs once in the corpus; "packages" is common
  assert.ok(hits.every((h, i) => i === 0 || hits[i - 1]!.score >= h.score), 'sorted best first');
});

test('no overlap scores zero and is not returned', () => {
  const bm = new Bm25(docs);
  const s = bm.scores('samba windows');
  assert.ok(s[3]! > 0);
  for (const i of [0, 1, 2, 4]) assert.equal(s[i], 0);
  assert.deepEqual(bm.search('samba windows', 10).map((h) => h.index), [3]);
  assert.deepEqual(bm.search('kerberos', 10), []);
  assert.deepEqual(bm.search('the of and', 10), []);
});

test('idf: rarer terms weigh more, unseen terms nothing', () => {
  const bm = new Bm25(docs);
  // document frequencies: samba 1, files 2, packages 3
  assert.ok(bm.idf('samba') > bm.idf('files'));
  assert.ok(bm.idf('files') > bm.idf('packages'));
  assert.ok(bm.idf('packages') > 0);
  assert.equal(bm.idf('kerberos'), 0);
  // 5 docs, "samba" in 1: ln(1 + (5 - 1 + 0.5) / (1 + 0.5)) = ln 4
  assert.ok(Math.abs(bm.idf('samba') - Math.log(4)) < 1e-12);
});

test('term frequency saturates and longer documents are normalised (k1, b)', () => {
  const bm = new Bm25(['x y', 'x x y', 'x x x x x x x x y', 'z'], { k1: 1.2, b: 0.75 });
  const s = bm.scores('x');
  assert.ok(s[1]! > s[0]!, 'more occurrences score higher');
  // exact value for doc 0: tf 1, |d| 2, avgdl (2 + 3 + 9 + 1) / 4
  const avg = 15 / 4;
  const expected = bm.idf('x') * (1 * 2.2) / (1 + 1.2 * (1 - 0.75 + (0.75 * 2) / avg));
  assert.ok(Math.abs(s[0]! - expected) < 1e-12);
  const bmNoNorm = new Bm25(['x y', 'x x x x x x x x y', 'z'], { b: 0 });
  const t = bmNoNorm.scores('x');
  assert.ok(t[1]! < bmNoNorm.idf('x') * 2.2, 'bounded by idf * (k1 + 1)');
  // same term repeated in the query counts once
  assert.deepEqual(bm.scores('x x x'), bm.scores('x'));
});
