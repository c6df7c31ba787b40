/** The question set is well formed and its gold facts are in the documents; the answer checks score as documented. */
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { test } from 'node:test';
import { containsFact, decodingPolicy, echoes, isCorrect, isUnreadable, normalizeTokens, words } from '../bench/answers.js';
import { parseQuestions } from '../bench/questions.js';
import { readCorpus } from '../src/service/rag.js';
import { CORPUS, ROOT } from './helpers.js';

test('data/questions.json: 200+ questions, unique ids, known documents, 100+ held out, a short gold fact in every document', async () => {
  const qs = parseQuestions(JSON.parse(await readFile(path.join(ROOT, 'data', 'questions.json'), 'utf8')));
  assert.ok(qs.length >= 200, `${qs.length} questions`);
  assert.equal(new Set(qs.map((q) => q.id)).size, qs.length, 'ids are unique');
  assert.equal(new Set(qs.map((q) => q.question)).size, qs.length, 'questions are unique');
  assert.ok(qs.filter((q) => q.split === 'heldout').length >= 100);
  const docs = new Map((await readCorpus(CORPUS)).map((d) => [d.docId, `${d.title}\n${d.text}`]));
  for (const q of qs) {
    const text = docs.get(q.doc_id);
    assert.ok(text !== undefined, `${q.id}: unknown document ${q.doc_id}`);
    // The gold fact is in the document: at least one accepted variant occurs there as written (others
    // may be the usual ways of saying it, e.g. "journalctl -f" where the text says "the flag is -f").
    assert.ok(q.accept.some((v) => containsFact(text, v)), `${q.id}: no variant of its gold fact in ${q.doc_id}`);
    // Every variant can match (a bare '|' normalises to nothing and never would), and one is short
    // enough for an answer that states the fact to hold it verbatim: the command, path, package or value.
    for (const v of q.accept) assert.ok(normalizeTokens(v).length > 0, `${q.id}: variant '${v}' normalises to nothing`);
    assert.ok(Math.min(...q.accept.map((v) => normalizeTokens(v).length)) <= 4, `${q.id}: no variant of 4 tokens or fewer`);
  }
});

test('gold facts match as whole token runs, after normalisation', () => {
  assert.deepEqual(normalizeTokens('Edit /etc/exports. Then run exportfs -ra!'), ['edit', '/etc/exports', 'then', 'run', 'exportfs', '-ra']);
  assert.ok(containsFact('Use the command ATRM 3.', 'atrm'));
  assert.ok(!containsFact('use atrmx', 'atrm'), 'no partial tokens');
  assert.ok(containsFact('see /etc/munin/munin.conf', 'munin.conf'), 'a path matches its tail');
  assert.ok(!containsFact('see /etc/munin/xmunin.conf', 'munin.conf'));
  assert.ok(containsFact('run dpkg-reconfigure  tzdata as root', 'dpkg-reconfigure tzdata'));
  assert.ok(!containsFact('tzdata then dpkg-reconfigure', 'dpkg-reconfigure tzdata'), 'order counts');
  assert.ok(isCorrect('It is slapd.', 'slapd; run dpkg-reconfigure slapd', ['slapd']));
  assert.ok(!isCorrect('It is openldap.', 'slapd', ['slapd']));
});

test('unreadable: empty, looping or gibberish; a bare command is readable', () => {
  const vocab = new Set(words('the package manager installs packages with apt and removes them'));
  assert.ok(isUnreadable('   ', vocab));
  assert.ok(isUnreadable('apt apt apt apt', vocab));
  assert.ok(isUnreadable('the package manager the package manager the package manager', vocab));
  assert.ok(isUnreadable('qzx vlorp dwimble the', vocab));
  assert.ok(!isUnreadable('The package manager installs packages.', vocab));
  assert.ok(!isUnreadable('/etc/cron.deny', vocab));
});

test('echoed: an answer that reads back 5+ words of the instruction; a decoding policy from the environment', () => {
  const instruction = 'Answer briefly and name the exact command, file, package or value that the context gives.';
  assert.ok(echoes('The exact command, file, package or value that the context gives is apt.', instruction));
  assert.ok(!echoes('Use apt-get autoclean: it removes the files that can no longer be downloaded.', instruction));
  assert.ok(!echoes('The exact command is atrm.', instruction), 'a short overlap is not an echo');
  assert.deepEqual(decodingPolicy({}), {});
  assert.deepEqual(decodingPolicy({ BENCH_RAG_MAX_NEW_TOKENS: '32', BENCH_RAG_STOP: '["\\n\\n"]' }), { max_new_tokens: 32, stop: ['\n\n'] });
  assert.deepEqual(decodingPolicy({ BENCH_RAG_STOP: 'Question:' }), { stop: 'Question:' });
  assert.throws(() => decodingPolicy({ BENCH_RAG_MAX_NEW_TOKENS: '0' }));
});
