/**
 * Keyword search in any language and per-tenant BM25 statistics, on both stores (faiss + BM25 in process,
 * PostgreSQL on a real server): French and German words are found with or without their accents (and
 * German's ß as ss), Chinese is found inside unspaced text (characters and pairs), both stores score
 * alike; and one collection's ingest or removal leaves another collection's scores exactly as they were.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { seededRandom } from '../src/generate/sampler.js';
import { normalize } from '../src/retrieval/embedder.js';
import { FaissStore } from '../src/retrieval/faiss-store.js';
import { lexicalTerms } from '../src/retrieval/lexical.js';
import { PostgresStore } from '../src/retrieval/postgres-store.js';
import type { NewDocument, RetrievalStore } from '../src/retrieval/retrieval-store.js';
import { tempDir } from './helpers.js';
import { startTestPostgres, type TestPostgres } from './postgres.js';

const D = 8;
const BM25 = { k1: 1.2, b: 0.75 };
const next = seededRandom(40);

function doc(docId: string, title: string, texts: string[], collection = 'default'): NewDocument {
  const vectors = new Float32Array(texts.length * D);
  for (let i = 0; i < texts.length; i++) {
    const v = Float32Array.from({ length: D }, () => next() * 2 - 1);
    normalize(v);
    vectors.set(v, i * D);
  }
  return { doc: { docId, title, bytes: texts.join(' ').length, collection }, chunks: texts.map((text) => ({ text, tokens: text.length })), vectors };
}

const CORPUS: NewDocument[] = [
  doc('fr-ecole', 'École primaire', ["L'élève étudie la géométrie à l'école avec son maître.", 'Les élèves déjeunent à la cantine.']),
  doc('fr-cafe', 'Le café', ['Un café crème et un croissant au comptoir, près de la fenêtre.']),
  doc('de-strasse', 'Straßenbau in München', ['Die Straße nach München führt über die große Brücke.', 'Der Verkehr auf der Brücke ist stark.']),
  doc('de-mueller', 'Müller und Söhne', ['Die Bäckerei Müller backt Brötchen für die ganze Straße.']),
  doc('zh-ml', '机器学习', ['机器学习是人工智能的一个分支，它让计算机从数据中学习。']),
  doc('zh-weather', '天气预报', ['明天北京的天气晴朗，气温二十度。']),
  doc('en-apt', 'Debian packages', ['apt installs packages from the Debian archive; apt-get is older.']),
];

let pgServer: TestPostgres;
before(async () => {
  pgServer = await startTestPostgres();
});
after(async () => {
  await pgServer?.stop();
});

const stores: [string, () => Promise<RetrievalStore>][] = [
  ['faiss', async () => FaissStore.open(await tempDir(), D, BM25)],
  ['postgres', async () => PostgresStore.open(await pgServer.database(), D, { bm25: BM25, log: () => undefined })],
];

const ids = async (store: RetrievalStore, query: string, collection = 'default') =>
  (await store.searchLexical(query, 10, { collection })).map((h) => h.chunk.docId);

test('terms: letters of every script, accents folded, ß as ss, CJK as characters and pairs; ASCII as before', () => {
  assert.deepEqual(lexicalTerms("L'Élève à l'ÉCOLE"), ['l', 'eleve', 'l', 'ecole']);
  assert.deepEqual(lexicalTerms('Straße STRASSE Brücke'), ['strasse', 'strasse', 'brucke']);
  assert.deepEqual(lexicalTerms('学习'), ['学', '学习', '习']);
  assert.deepEqual(lexicalTerms('GPU加速'), ['gpu', '加', '加速', '速']);
  assert.deepEqual(lexicalTerms('ﬁle Ｆｕｌｌ ２'), ['file', 'full', '2']);
  assert.deepEqual(lexicalTerms('हिन्दी भाषा'), ['हिन्दी', 'भाषा'], 'vowel signs stay inside the word');
  assert.deepEqual(lexicalTerms('How do I use APT-get, the /etc/cron.deny file?'), ['use', 'apt', 'get', 'etc', 'cron', 'deny', 'file']);
});

for (const [kind, open] of stores) {
  describe(`${kind} store`, () => {
    test('French, German and Chinese words are found, with or without accents', async () => {
      const store = await open();
      try {
        await store.addBatch(CORPUS);
        assert.equal((await ids(store, 'élève'))[0], 'fr-ecole');
        assert.equal((await ids(store, 'ELEVE ecole'))[0], 'fr-ecole');
        assert.deepEqual(await ids(store, 'cafe'), ['fr-cafe']);
        assert.equal((await ids(store, 'Strasse'))[0], 'de-strasse');
        assert.deepEqual(await ids(store, 'muller'), ['de-mueller']);
        assert.deepEqual(await ids(store, 'brücke'), ['de-strasse', 'de-strasse']);
        assert.deepEqual(await ids(store, 'Brötchen'), ['de-mueller']);
        assert.deepEqual(await ids(store, '人工智能'), ['zh-ml']);
        assert.deepEqual(await ids(store, '学习'), ['zh-ml']);
        assert.deepEqual(await ids(store, '北京天气'), ['zh-weather']);
        assert.deepEqual(await ids(store, 'apt-get'), ['en-apt']);
        assert.deepEqual(await ids(store, '。，'), [], 'punctuation is no term');
      } finally {
        await store.close();
      }
    });

    test("one collection's ingest and removals leave another's scores and ranking exactly as they were", async () => {
      const store = await open();
      try {
        await store.addBatch(CORPUS.map((d) => ({ ...d, doc: { ...d.doc, collection: 'tenant-a' } })));
        const queries = ['école élève', 'Straße Brücke München', '学习 人工智能', 'café', 'apt packages'];
        const scores = async () => Promise.all(queries.map(async (q) =>
          (await store.searchLexical(q, 10, { collection: 'tenant-a' })).map((h) => `${h.chunk.docId}/${h.chunk.ord} ${h.score.toFixed(12)}`)));
        const before = await scores();
        assert.ok(before.every((s) => s.length > 0));
        // Another tenant writes many chunks full of the same terms, of other lengths.
        const noisy = Array.from({ length: 30 }, (_, i) => doc(`b${i}`, 'École Straße 学习',
          [`école élève Straße Brücke 学习 café apt packages ${'mot '.repeat(i)}`], 'tenant-b'));
        await store.addBatch(noisy);
        assert.ok((await store.searchLexical('école', 50, { collection: 'tenant-b' })).length === 30);
        assert.deepEqual(await scores(), before, "tenant-b's ingest moved tenant-a's scores");
        await store.remove('tenant-b', 'b0');
        await store.replaceBatch([doc('b1', 'autre', ['café café café'], 'tenant-b')]);
        assert.deepEqual(await scores(), before, "tenant-b's removal and replacement moved tenant-a's scores");
      } finally {
        await store.close();
      }
    });
  });
}

test('both stores give the same lexical scores in every language', async () => {
  const both = await Promise.all(stores.map(([, open]) => open()));
  try {
    for (const s of both) await s.addBatch(CORPUS);
    for (const q of ['élève école', 'Straße Brücke', '学习', '人工智能 数据', 'café croissant', 'apt']) {
      const [f, p] = await Promise.all(both.map((s) => s.searchLexical(q, 10, { collection: 'default' })));
      assert.ok(f!.length > 0, q);
      assert.deepEqual(p!.map((h) => `${h.chunk.docId}/${h.chunk.ord} ${h.score.toFixed(9)}`), f!.map((h) => `${h.chunk.docId}/${h.chunk.ord} ${h.score.toFixed(9)}`), q);
    }
  } finally {
    await Promise.all(both.map((s) => s.close()));
  }
});
