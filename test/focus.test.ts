import assert from 'node:assert/strict';
import { test } from 'node:test';
import { focusText, queryStems, sentences } from '../src/retrieval/focus.js';

const chunk = 'Beware! Webmin has many features. In general, interfaces of this kind are not recommended.\n' +
  'Webmin does not require Apache. This server listens by default on port 10000 and accepts HTTPS. To enable it, run the following command:\n' +
  '# systemctl enable webmin\nIncluded modules cover many services.';

test('sentences: split after . ! ? and at line breaks; a path with dots stays whole', () => {
  assert.deepEqual(sentences('Edit /etc/cron.deny. Then wait!\nDone'), ['Edit /etc/cron.deny.', 'Then wait!', 'Done']);
});

test('queryStems: lowercased content words on their first five letters, stop words out', () => {
  assert.deepEqual([...queryStems('Which packages does the server listen with?')], ['packa', 'serve', 'liste']);
});

test('focusText keeps the sentences sharing most of the question, in their order', () => {
  assert.equal(focusText('Which port does the server listen on by default?', chunk, 1), 'This server listens by default on port 10000 and accepts HTTPS.');
  assert.equal(focusText('Which port does the webmin server listen on?', chunk, 2),
    'Webmin has many features.\nThis server listens by default on port 10000 and accepts HTTPS.');
});

test('a chosen sentence ending in a colon brings the next one (the command it introduces)', () => {
  assert.equal(focusText('How do I run and enable it?', chunk, 1), 'To enable it, run the following command:\n# systemctl enable webmin');
});

test('focusText leaves a chunk whole: keep 0, few sentences, or nothing in common', () => {
  assert.equal(focusText('port', chunk, 0), chunk);
  assert.equal(focusText('port', 'One. Two.', 2), 'One. Two.');
  assert.equal(focusText('quota', chunk, 1), chunk);
});
