import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { before, test } from 'node:test';
import { TextTokenizer } from '../src/runtime/tokenizer.js';
import { chunkText } from '../src/retrieval/chunker.js';
import { CORPUS, ROOT } from './helpers.js';

let tok: TextTokenizer;
const count = (s: string) => tok.encode(s).length;

before(async () => {
  tok = await TextTokenizer.load(path.join(ROOT, 'models', 'embedder'));
});

test('chunks of a real document respect the token size, overlap and cover every word', async () => {
  const text = await readFile(path.join(CORPUS, 'apt-cache.txt'), 'utf8');
  const opts = { chunkTokens: 128, overlapTokens: 32 };
  const chunks = chunkText(text, count, opts);
  assert.ok(chunks.length > 3);
  for (const c of chunks) {
    // The embedder's pre-tokenizer splits on whitespace, so summing words is exact.
    assert.equal(count(c.text), c.tokens);
    assert.ok(c.tokens <= opts.chunkTokens, `chunk of ${c.tokens} tokens`);
    assert.equal(text.slice(c.start, c.end), c.text);
  }
  for (let i = 1; i < chunks.length; i++) {
    const prev = chunks[i - 1]!;
    const cur = chunks[i]!;
    assert.ok(cur.start > prev.start, 'chunks move forward');
    assert.ok(cur.start < prev.end, 'consecutive chunks overlap');
    assert.ok(count(text.slice(cur.start, prev.end)) >= opts.overlapTokens, 'overlap holds at least overlapTokens');
  }
  const covered = new Set<number>();
  for (const c of chunks) for (let k = c.start; k < c.end; k++) covered.add(k);
  for (const m of text.matchAll(/\S+/g)) assert.ok(covered.has(m.index), `word at ${m.index} is in a chunk`);
});

test('edge cases: empty text, short text, a word longer than a chunk', () => {
  assert.deepEqual(chunkText('   \n ', count, { chunkTokens: 16, overlapTokens: 4 }), []);
  const short = chunkText('one two three', count, { chunkTokens: 16, overlapTokens: 4 });
  assert.equal(short.length, 1);
  assert.equal(short[0]!.text, 'one two three');
  const huge = 'x'.repeat(300);
  const chunks = chunkText(`alpha ${huge} omega`, count, { chunkTokens: 8, overlapTokens: 2 });
  assert.ok(chunks.some((c) => c.text === huge || c.text.includes(huge)));
  assert.equal(chunks.at(-1)!.text.endsWith('omega'), true);
  assert.throws(() => chunkText('a b', count, { chunkTokens: 4, overlapTokens: 4 }), /overlap/);
});
