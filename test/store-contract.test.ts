/**
 * The retrieval-store contract, one test body run against both stores: faiss + BM25 in process (as it
 * starts, and as it is once grown: writes through its log, an HNSW index), and PostgreSQL + pgvector on
 * a real server (test/postgres.ts). Writes are atomic, collections never leak,
 * filters apply inside the search (top_k stays full), documents read back as written. Then what only a
 * shared store promises: a second instance on the same database reads what the first committed, and a
 * batch that fails half way leaves nothing.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { seededRandom } from '../src/generate/sampler.js';
import { normalize } from '../src/retrieval/embedder.js';
import { FaissStore } from '../src/retrieval/faiss-store.js';
import { PostgresStore } from '../src/retrieval/postgres-store.js';
import {
  DocumentExistsError, metadataMatches,
  type Metadata, type NewDocument, type RetrievalStore, type SearchFilter,
} from '../src/retrieval/retrieval-store.js';
import { tempDir } from './helpers.js';
import { startTestPostgres, type TestPostgres } from './postgres.js';

const D = 16;
const BM25 = { k1: 1.2, b: 0.75 };

/** A seeded generator (the sampler's mulberry32): the randomised tests repeat exactly. */
const rng = seededRandom;

function randomUnit(next: () => number): Float32Array {
  const v = Float32Array.from({ length: D }, () => next() * 2 - 1);
  normalize(v);
  return v;
}

const WORDS = ['kernel', 'module', 'quota', 'disk', 'cron', 'daemon', 'socket', 'packet', 'mirror', 'tarball', 'inode', 'journal', 'swap', 'cgroup', 'locale'];

function doc(docId: string, texts: string[], vectors: Float32Array[], extra: { collection?: string; metadata?: Metadata; locators?: string[] } = {}): NewDocument {
  const flat = new Float32Array(vectors.length * D);
  vectors.forEach((v, i) => flat.set(v, i * D));
  return {
    doc: { docId, title: `Title of ${docId}`, bytes: texts.join(' ').length, collection: extra.collection, metadata: extra.metadata },
    chunks: texts.map((text, i) => ({ text, tokens: text.split(' ').length, ...(extra.locators?.[i] ? { locator: extra.locators[i] } : {}) })),
    vectors: flat,
  };
}

const dot = (a: Float32Array, b: Float32Array) => a.reduce((s, x, i) => s + x * b[i]!, 0);

type Opener = () => Promise<RetrievalStore>;

let pgServer: TestPostgres;
before(async () => {
  pgServer = await startTestPostgres();
});
after(async () => {
  await pgServer?.stop();
});

const stores: [string, Opener][] = [
  ['faiss', async () => FaissStore.open(await tempDir(), D, BM25)],
  // The same contract once the store has grown: every write through the log, the index HNSW from 8 chunks.
  ['faiss (write log, HNSW)', async () => FaissStore.open(await tempDir(), D, BM25, { logBytes: 0, annMin: 8 })],
  ['postgres', async () => PostgresStore.open(await pgServer.database(), D, { bm25: BM25 })],
];

for (const [kind, open] of stores) {
  describe(`${kind} store`, () => {
    test('documents read back as written: collections, metadata, chunks in order with title and locator', async () => {
      const store = await open();
      try {
        const r = rng(1);
        const added = await store.addBatch([
          doc('a', ['alpha one', 'alpha two'], [randomUnit(r), randomUnit(r)], { metadata: { lang: 'en', year: 2024, public: true }, locators: ['p. 1', 'p. 2'] }),
          doc('b', ['beta'], [randomUnit(r)], { collection: 'team-x' }),
          doc('a', ['other alpha'], [randomUnit(r)], { collection: 'team-x' }),
        ]);
        assert.deepEqual(added.map((d) => [d.collection, d.docId, d.chunkIds.length]), [['default', 'a', 2], ['team-x', 'b', 1], ['team-x', 'a', 1]]);
        assert.deepEqual(await store.counts(), { documents: 3, chunks: 4 });
        assert.deepEqual(await store.counts('team-x'), { documents: 2, chunks: 2 });
        assert.deepEqual(await store.counts('nobody'), { documents: 0, chunks: 0 });
        const a = (await store.get('default', 'a'))!;
        assert.deepEqual({ ...a, chunkIds: a.chunkIds.length }, { collection: 'default', docId: 'a', title: 'Title of a', bytes: 'alpha one alpha two'.length, metadata: { lang: 'en', year: 2024, public: true }, chunkIds: 2 });
        assert.equal(await store.get('team-y', 'a'), undefined);
        const chunks = await store.chunksOf('default', 'a');
        assert.deepEqual(chunks.map((c) => [c.ord, c.text, c.title, c.locator, c.collection]), [[0, 'alpha one', 'Title of a', 'p. 1', 'default'], [1, 'alpha two', 'Title of a', 'p. 2', 'default']]);
        assert.deepEqual(chunks.map((c) => c.id), a.chunkIds);
        assert.equal((await store.chunksOf('team-x', 'b'))[0]!.locator, undefined);
        const page = await store.list('team-x', 0, 1);
        assert.equal(page.total, 2);
        assert.deepEqual(page.documents.map((d) => d.docId), ['b']);
        assert.deepEqual((await store.list('team-x', 1, 10)).documents.map((d) => d.docId), ['a']);
        assert.deepEqual((await store.list('team-x', 5, 10)).documents, []);
      } finally {
        await store.close();
      }
    });

    test('dense search: nearest first by cosine, inside one collection', async () => {
      const store = await open();
      try {
        const r = rng(2);
        const vs = Array.from({ length: 6 }, () => randomUnit(r));
        await store.addBatch([doc('a', ['a0', 'a1', 'a2'], vs.slice(0, 3)), doc('b', ['b0', 'b1', 'b2'], vs.slice(3), { collection: 'other' })]);
        const hits = await store.searchDense(vs[1]!, 10, { collection: 'default' });
        assert.equal(hits.length, 3, 'only the collection\'s chunks');
        assert.equal(hits[0]!.chunk.text, 'a1');
        assert.ok(Math.abs(hits[0]!.score - 1) < 1e-5);
        for (const h of hits) assert.ok(Math.abs(h.score - dot(vs[Number(h.chunk.text[1])]!, vs[1]!)) < 1e-5, 'score is the cosine');
        for (let i = 1; i < hits.length; i++) assert.ok(hits[i - 1]!.score >= hits[i]!.score);
        assert.deepEqual((await store.searchDense(vs[4]!, 1, { collection: 'other' })).map((h) => h.chunk.text), ['b1']);
        assert.deepEqual(await store.searchDense(vs[0]!, 5, { collection: 'empty' }), []);
      } finally {
        await store.close();
      }
    });

    test('lexical search: BM25 over title and text, inside the filter', async () => {
      const store = await open();
      try {
        const r = rng(3);
        await store.addBatch([
          doc('q', ['edquota sets the disk quota of a user', 'repquota reports quotas'], [randomUnit(r), randomUnit(r)], { metadata: { area: 'storage' } }),
          doc('c', ['crontab edits the cron table'], [randomUnit(r)], { metadata: { area: 'jobs' } }),
          doc('x', ['disk quota in another collection'], [randomUnit(r)], { collection: 'other' }),
        ]);
        const hits = await store.searchLexical('disk quota for a user', 10, { collection: 'default' });
        assert.deepEqual(hits.map((h) => h.chunk.text), ['edquota sets the disk quota of a user']);
        assert.ok(hits[0]!.score > 0);
        assert.deepEqual((await store.searchLexical('Title of c', 10, { collection: 'default' })).map((h) => h.chunk.docId).sort(), ['c', 'q', 'q'].sort(),
          'the title is indexed with every chunk');
        assert.deepEqual((await store.searchLexical('cron disk', 10, { collection: 'default', metadata: { area: 'jobs' } })).map((h) => h.chunk.docId), ['c']);
        assert.deepEqual(await store.searchLexical('the of a', 10, { collection: 'default' }), [], 'stopwords only');
      } finally {
        await store.close();
      }
    });

    test('a metadata filter applies inside the search: top_k stays full and every hit passes', async () => {
      const store = await open();
      try {
        const r = rng(4);
        const tags = ['red', 'green', 'blue'];
        const all: { v: Float32Array; meta: Metadata; id: string }[] = [];
        const batch: NewDocument[] = [];
        for (let i = 0; i < 120; i++) {
          const meta = { tag: tags[i % 3]!, n: i % 7, even: i % 2 === 0 };
          const v = randomUnit(r);
          const word = WORDS[i % WORDS.length]!;
          batch.push(doc(`d${i}`, [`${word} chunk ${i}`], [v], { metadata: meta }));
          all.push({ v, meta, id: `d${i}` });
        }
        await store.addBatch(batch);
        const filters: SearchFilter[] = [
          { collection: 'default', metadata: { tag: 'blue' } },
          { collection: 'default', metadata: { n: { in: [1, 3] } } },
          { collection: 'default', metadata: { tag: { in: ['red', 'green'] }, even: true } },
        ];
        for (const f of filters) {
          for (let q = 0; q < 5; q++) {
            const query = randomUnit(r);
            const hits = await store.searchDense(query, 10, f);
            assert.equal(hits.length, 10, `${JSON.stringify(f)}: top_k full`);
            for (const h of hits) assert.ok(metadataMatches(all.find((x) => x.id === h.chunk.docId)!.meta, f.metadata), 'every hit passes');
            const exact = all.filter((x) => metadataMatches(x.meta, f.metadata)).sort((x, y) => dot(y.v, query) - dot(x.v, query)).slice(0, 10).map((x) => x.id);
            const found = hits.map((h) => h.chunk.docId);
            // faiss is exact; HNSW is approximate: nearly all of the exact top 10.
            const overlap = found.filter((id) => exact.includes(id)).length;
            if (kind === 'faiss') assert.deepEqual(found, exact);
            else assert.ok(overlap >= 9, `${overlap} of the exact top 10`);
          }
          const lexical = await store.searchLexical('chunk', 10, f);
          assert.equal(lexical.length, 10, 'lexical top_k full too');
        }
        assert.deepEqual(await store.searchDense(randomUnit(r), 5, { collection: 'default', metadata: { tag: 'purple' } }), []);
        assert.deepEqual(await store.searchDense(randomUnit(r), 5, { collection: 'default', metadata: { tag: 1 } }), [], "1 is not '1': types are kept apart");
      } finally {
        await store.close();
      }
    });

    test('collections never leak into each other (randomised, many documents)', async () => {
      const store = await open();
      try {
        const r = rng(5);
        const collections = ['t0', 't1', 't2', 't3', 't4'];
        const sizes = new Map<string, number>(collections.map((c) => [c, 0]));
        const batch: NewDocument[] = [];
        for (let i = 0; i < 200; i++) {
          // Skewed: t0 holds few chunks, so its searches must not be filled from the others.
          const c = collections[r() < 0.04 ? 0 : 1 + Math.floor(r() * 4)]!;
          const n = 1 + Math.floor(r() * 3);
          const texts = Array.from({ length: n }, () => Array.from({ length: 4 }, () => WORDS[Math.floor(r() * WORDS.length)]!).join(' '));
          batch.push(doc(`doc${i % 50}`, texts, texts.map(() => randomUnit(r)), { collection: c }));
          sizes.set(c, sizes.get(c)! + n);
        }
        // The same doc id in several collections is several documents; within one, it must be unique.
        const unique = new Map<string, NewDocument>();
        for (const d of batch) unique.set(`${d.doc.collection}/${d.doc.docId}`, d);
        sizes.clear();
        for (const d of unique.values()) sizes.set(d.doc.collection!, (sizes.get(d.doc.collection!) ?? 0) + d.chunks.length);
        await store.addBatch([...unique.values()]);
        for (let q = 0; q < 40; q++) {
          const c = collections[q % collections.length]!;
          const k = 1 + Math.floor(r() * 20);
          const dense = await store.searchDense(randomUnit(r), k, { collection: c });
          assert.equal(dense.length, Math.min(k, sizes.get(c) ?? 0), `${c}: k=${k}`);
          for (const h of dense) assert.equal(h.chunk.collection, c);
          const lexical = await store.searchLexical(`${WORDS[q % WORDS.length]} ${WORDS[(q * 7) % WORDS.length]}`, k, { collection: c });
          for (const h of lexical) assert.equal(h.chunk.collection, c);
        }
        for (const c of collections) assert.equal((await store.counts(c)).chunks, sizes.get(c) ?? 0);
      } finally {
        await store.close();
      }
    });

    test('writes: a batch with a duplicate leaves nothing; replace swaps the chunks; remove forgets them', async () => {
      const store = await open();
      try {
        const r = rng(6);
        const va = randomUnit(r);
        await store.addBatch([doc('a', ['first text of a'], [va])]);
        const vn = randomUnit(r);
        await assert.rejects(store.addBatch([doc('new', ['never stored'], [vn]), doc('a', ['again'], [randomUnit(r)])]), DocumentExistsError);
        await assert.rejects(store.addBatch([doc('n2', ['x'], [vn]), doc('n2', ['y'], [vn])]), DocumentExistsError, 'twice in one batch');
        assert.deepEqual(await store.counts(), { documents: 1, chunks: 1 });
        assert.equal(await store.get('default', 'new'), undefined);
        assert.ok((await store.searchDense(vn, 5, { collection: 'default' })).every((h) => h.chunk.docId === 'a'));
        assert.deepEqual(await store.searchLexical('never stored', 5, { collection: 'default' }), []);

        const old = (await store.get('default', 'a'))!.chunkIds;
        const vb = randomUnit(r);
        const [w] = await store.replaceBatch([doc('a', ['second text of a', 'and more'], [vb, randomUnit(r)], { metadata: { v: 2 } })]);
        assert.equal(w!.replaced, true);
        assert.equal(w!.document.chunkIds.length, 2);
        assert.ok(w!.document.chunkIds.every((id) => !old.includes(id)), 'new chunks');
        assert.deepEqual((await store.get('default', 'a'))!.metadata, { v: 2 });
        assert.equal((await store.searchDense(vb, 1, { collection: 'default' }))[0]!.chunk.text, 'second text of a');
        assert.deepEqual(await store.searchLexical('first', 5, { collection: 'default' }), []);
        const [created] = await store.replaceBatch([doc('fresh', ['fresh text'], [randomUnit(r)])]);
        assert.equal(created!.replaced, false);

        const removed = await store.remove('default', 'a');
        assert.equal(removed?.docId, 'a');
        assert.equal(await store.remove('default', 'a'), undefined);
        assert.equal(await store.get('default', 'a'), undefined);
        assert.deepEqual(await store.chunksOf('default', 'a'), []);
        assert.ok((await store.searchDense(vb, 5, { collection: 'default' })).every((h) => h.chunk.docId === 'fresh'));
        assert.deepEqual((await store.searchLexical('second text', 5, { collection: 'default' })).map((h) => h.chunk.docId), ['fresh']);
        assert.deepEqual(await store.counts(), { documents: 1, chunks: 1 });
      } finally {
        await store.close();
      }
    });
  });
}

test('both stores give the same BM25 scores and the same dense order on the same chunks', async () => {
  const both = await Promise.all(stores.map(([, open]) => open()));
  try {
    const r = rng(7);
    const batch: NewDocument[] = [];
    for (let i = 0; i < 40; i++) {
      const texts = Array.from({ length: 2 }, () => Array.from({ length: 3 + Math.floor(r() * 8) }, () => WORDS[Math.floor(r() * WORDS.length)]!).join(' '));
      batch.push(doc(`d${i}`, texts, texts.map(() => randomUnit(r))));
    }
    for (const s of both) await s.addBatch(batch);
    for (const s of both) await s.remove('default', 'd3');
    for (let q = 0; q < 10; q++) {
      const query = `${WORDS[q]} ${WORDS[(q * 5 + 2) % WORDS.length]} ${WORDS[(q * 3 + 1) % WORDS.length]}`;
      const [f, p] = await Promise.all(both.map((s) => s.searchLexical(query, 8, { collection: 'default' })));
      assert.deepEqual(p!.map((h) => h.score.toFixed(9)), f!.map((h) => h.score.toFixed(9)), query);
      const v = randomUnit(r);
      const [fd, pd] = await Promise.all(both.map((s) => s.searchDense(v, 5, { collection: 'default' })));
      assert.deepEqual(pd!.map((h) => `${h.chunk.docId}/${h.chunk.ord}`), fd!.map((h) => `${h.chunk.docId}/${h.chunk.ord}`));
    }
  } finally {
    await Promise.all(both.map((s) => s.close()));
  }
});

describe('postgres store shared by replicas', () => {
  test('a second instance on the same database reads what the first committed, at once', async () => {
    const url = await pgServer.database();
    const a = await PostgresStore.open(url, D, { bm25: BM25 });
    const b = await PostgresStore.open(url, D, { bm25: BM25 });
    try {
      const r = rng(8);
      const v = randomUnit(r);
      assert.deepEqual(await b.counts(), { documents: 0, chunks: 0 });
      await a.addBatch([doc('shared', ['written by replica a'], [v], { collection: 'c1' })]);
      assert.equal((await b.searchDense(v, 1, { collection: 'c1' }))[0]?.chunk.docId, 'shared');
      assert.equal((await b.searchLexical('replica', 1, { collection: 'c1' }))[0]?.chunk.docId, 'shared');
      await b.remove('c1', 'shared');
      assert.equal(await a.get('c1', 'shared'), undefined);
      assert.deepEqual(await a.searchDense(v, 1, { collection: 'c1' }), []);
    } finally {
      await a.close();
      await b.close();
    }
  });

  test('a batch that fails part way (a vector the column refuses) leaves nothing, on either instance', async () => {
    const url = await pgServer.database();
    const a = await PostgresStore.open(url, D, { bm25: BM25 });
    try {
      const r = rng(9);
      await a.addBatch([doc('kept', ['kept text'], [randomUnit(r)])]);
      const bad = doc('bad', ['bad text'], [randomUnit(r)]);
      bad.vectors[0] = Number.NaN; // pgvector refuses NaN: the second document's insert fails
      await assert.rejects(a.addBatch([doc('good', ['good text'], [randomUnit(r)]), bad]));
      const b = await PostgresStore.open(url, D, { bm25: BM25 });
      try {
        for (const s of [a, b]) {
          assert.deepEqual(await s.counts(), { documents: 1, chunks: 1 });
          assert.equal(await s.get('default', 'good'), undefined);
          assert.deepEqual((await s.searchLexical('good text', 5, { collection: 'default' })).map((h) => h.chunk.docId), ['kept']);
        }
        // The lexical figures were rolled back too: a score over one chunk is as before.
        assert.deepEqual((await b.searchLexical('kept', 1, { collection: 'default' })).map((h) => h.chunk.docId), ['kept']);
      } finally {
        await b.close();
      }
    } finally {
      await a.close();
    }
  });

  test('overlapping batches from two instances at once: one commits, the other is refused whole (no deadlock)', async () => {
    const url = await pgServer.database();
    const a = await PostgresStore.open(url, D, { bm25: BM25 });
    const b = await PostgresStore.open(url, D, { bm25: BM25 });
    try {
      const r = rng(10);
      for (let round = 0; round < 5; round++) {
        const ids = Array.from({ length: 6 }, (_, i) => `r${round}-d${i}`);
        const mk = (order: string[], tag: string) => order.map((id) => doc(id, [`${tag} text of ${id}`], [randomUnit(r)]));
        const results = await Promise.allSettled([a.addBatch(mk(ids, 'a')), b.addBatch(mk([...ids].reverse(), 'b'))]);
        assert.equal(results.filter((x) => x.status === 'fulfilled').length, 1, `round ${round}: one batch commits`);
        const failed = results.find((x) => x.status === 'rejected') as PromiseRejectedResult;
        assert.ok(failed.reason instanceof DocumentExistsError, String(failed.reason));
        // Disjoint batches at once both commit.
        await Promise.all([a.addBatch([doc(`r${round}-only-a`, ['x'], [randomUnit(r)])]), b.addBatch([doc(`r${round}-only-b`, ['y'], [randomUnit(r)])])]);
      }
      assert.deepEqual(await a.counts(), { documents: 40, chunks: 40 });
    } finally {
      await a.close();
      await b.close();
    }
  });

  test('every connection searches with the iterative HNSW scan and the configured ef_search', async () => {
    const store = await PostgresStore.open(await pgServer.database(), D, { bm25: BM25, efSearch: 123, poolSize: 3 });
    try {
      const all = await Promise.all(Array.from({ length: 6 }, () => store.settings()));
      for (const s of all) assert.deepEqual(s, { iterativeScan: 'relaxed_order', efSearch: 123 });
    } finally {
      await store.close();
    }
  });

  test('an ef_search pgvector would refuse (and search at its default 40 instead) refuses to open', async () => {
    const url = await pgServer.database();
    for (const efSearch of [0, 1001, 1024, 12.5]) {
      await assert.rejects(PostgresStore.open(url, D, { bm25: BM25, efSearch }), /outside pgvector's hnsw.ef_search range/, String(efSearch));
    }
    const store = await PostgresStore.open(url, D, { bm25: BM25, efSearch: 1000 });
    assert.equal((await store.settings()).efSearch, 1000);
    await store.close();
  });

  test('a database holding vectors of another dimension refuses to open', async () => {
    const url = await pgServer.database();
    await (await PostgresStore.open(url, D, { bm25: BM25 })).close();
    await assert.rejects(PostgresStore.open(url, D * 2, { bm25: BM25 }), /16-dimensional vectors but the embedder makes 32/);
  });
});
