/**
 * Ingest of real files over HTTP: a PDF of two pages, a Word file with headings, an HTML page and a
 * Markdown file with front matter go in (multipart upload and base64 JSON), each holding one fact no
 * other document has; a question on that fact is answered with a citation that points at its page or
 * section. A damaged PDF in the same upload is a 422 naming it while the rest goes in; a type no parser
 * reads is a 415. On the test models (TEST_ENV), a real server on loopback, fetch's own FormData.
 */
import assert from 'node:assert/strict';
import type { Server } from 'node:http';
import { after, before, describe, test } from 'node:test';
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { readFolder } from '../src/library/folder.js';
import { loadModels, RagService } from '../src/service/rag.js';
import { createApp } from '../src/server/app.js';
import { createLogger } from '../src/server/logging.js';
import { makeDocx, makePdf } from './file-fixtures.js';
import { smallCorpus, tempDir, testConfig, faiss } from './helpers.js';

let service: RagService;
let server: Server;
let url: string;

const PDF = makePdf([
  ['Skerry Point harbour manual', 'The harbour has three piers and a customs office.', 'Ferries to the mainland leave at dawn from the north pier.'],
  ['Lights and signals', 'The Vega-9 lighthouse on Skerry Point flashes green every twelve seconds.', 'Its lamp is serviced each March.'],
], { Title: 'Skerry Point harbour manual', Author: 'Harbour Board', Subject: 'Operations' });

const DOCX = makeDocx([
  { style: 'Title', text: 'Greenhouse handbook' },
  { style: 'Heading1', text: 'Watering' },
  { text: 'Tomatoes in the greenhouse are watered twice a day in summer.' },
  { style: 'Heading1', text: 'Pollination' },
  { text: 'Quillberry flowers are pollinated by the Ostrava bumblebee at dusk.' },
], { title: 'Greenhouse handbook', creator: 'Mira Holt', subject: 'Gardening' });

const HTML = '<!doctype html><html lang="en"><head><title>Observatory guide</title><meta name="author" content="Night Desk">' +
  '<script>var hidden = "never indexed";</script></head><body><h1>Telescopes</h1><p>The observatory keeps two telescopes on the ridge.</p>' +
  '<h2>Calibration</h2><p>The Kestrel-5 telescope mirror is recalibrated every forty nights with a laser.</p>' +
  '<h2>Domes</h2><p>The domes open only when the wind is calm.</p></body></html>';

const MARKDOWN = '---\ntitle: Bakery notes\nauthor: Ines Faro\ntags: [bread, starters]\n---\n# Bakery\n\nThe bakery opens at five.\n\n' +
  '## Sourdough\n\nThe wheat loaves rise overnight in baskets.\n\n## Rye\n\nThe rye starter named Brunhilde is fed eighty grams of flour at noon.\n';

interface Citation { doc_id: string; title: string; text: string; locator?: string }
interface Result { index: number; filename?: string; status: number; doc_id?: string; title?: string; chunks?: number; error?: { code: string; message: string; filename?: string } }

async function post(path: string, body: FormData | object): Promise<{ status: number; body: Record<string, unknown> }> {
  const init = body instanceof FormData ? { method: 'POST', body } : { method: 'POST', body: JSON.stringify(body), headers: { 'content-type': 'application/json' } };
  const res = await fetch(`${url}${path}`, init);
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

const file = (bytes: Buffer | string, type: string) => new Blob([bytes], { type });

/** The citations of /query for the question, and those of chat's rag extension. */
async function cite(question: string): Promise<{ query: Citation[]; chat: Citation[] }> {
  const q = await post('/query', { query: question, max_new_tokens: 4, rerank_top_n: 3 });
  assert.equal(q.status, 200, JSON.stringify(q.body));
  const c = await post('/v1/chat/completions', { model: 'decoder-gqa', messages: [{ role: 'user', content: question }], max_tokens: 4, rag: { rerank_top_n: 3 } });
  assert.equal(c.status, 200, JSON.stringify(c.body));
  return { query: q.body['citations'] as Citation[], chat: c.body['citations'] as Citation[] };
}

before(async () => {
  // Some of the shipped corpus beside them, so that the files' facts compete with other documents.
  const cfg = testConfig({ RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(6), RAGGUARD_PROFILE_RUN: 'false' });
  service = await RagService.start(cfg, await loadModels(cfg));
  await new Promise<void>((resolve) => {
    server = createApp(service, { logger: createLogger('silent') }).listen(0, '127.0.0.1', () => resolve());
  });
  const a = server.address();
  url = `http://127.0.0.1:${typeof a === 'object' && a ? a.port : 0}`;
});

const servers: Server[] = [];
after(() => {
  server?.close();
  for (const s of servers) s.close();
});

describe('ingest of files', () => {
  test('a multipart upload of PDF, DOCX and HTML and a damaged PDF: 207, the damaged one 422 naming it, the others in with their titles and metadata', async () => {
    const form = new FormData();
    form.append('files', file(PDF, 'application/pdf'), 'harbour.pdf');
    form.append('files', file(await DOCX, 'application/vnd.openxmlformats-officedocument.wordprocessingml.document'), 'greenhouse.docx');
    // No type of its own (as many clients send it): the extension picks the parser.
    form.append('files', file(HTML, 'application/octet-stream'), 'observatory.html');
    form.append('files', file(PDF.subarray(0, 300), 'application/pdf'), 'torn-manual.pdf');
    const r = await post('/documents', form);
    assert.equal(r.status, 207, JSON.stringify(r.body));
    const results = r.body['results'] as Result[];
    assert.deepEqual(results.map((x) => [x.filename, x.status]), [['harbour.pdf', 201], ['greenhouse.docx', 201], ['observatory.html', 201], ['torn-manual.pdf', 422]]);
    const torn = results[3]!.error!;
    assert.equal(torn.code, 'unreadable_file');
    assert.equal(torn.filename, 'torn-manual.pdf');
    assert.match(torn.message, /^torn-manual\.pdf: not a readable PDF/);
    assert.deepEqual((r.body['documents'] as { title: string }[]).map((d) => d.title), ['Skerry Point harbour manual', 'Greenhouse handbook', 'Observatory guide']);

    const byTitle = new Map(faiss(service).documents(0, 100).map((d) => [d.title, d]));
    assert.deepEqual(byTitle.get('Skerry Point harbour manual')!.metadata,
      { pages: '2', author: 'Harbour Board', subject: 'Operations', filename: 'harbour.pdf', kind: 'pdf', content_type: 'application/pdf' });
    assert.equal(byTitle.get('Greenhouse handbook')!.metadata!['author'], 'Mira Holt');
    assert.equal(byTitle.get('Observatory guide')!.metadata!['author'], 'Night Desk');
    assert.equal(byTitle.get('Observatory guide')!.metadata!['language'], 'en');
    // Each chunk is of one page or section, and says which.
    const locators = (title: string) => byTitle.get(title)!.chunkIds.map((id) => faiss(service).chunk(id).locator);
    assert.deepEqual(locators('Skerry Point harbour manual'), ['page 1', 'page 2']);
    assert.deepEqual(locators('Greenhouse handbook'), ['section: Watering', 'section: Pollination']);
    assert.deepEqual(locators('Observatory guide'), ['section: Telescopes', 'section: Telescopes > Calibration', 'section: Telescopes > Domes']);
    for (const id of byTitle.get('Observatory guide')!.chunkIds) assert.doesNotMatch(faiss(service).chunk(id).text, /never indexed|</);
  });

  test('a Markdown file as base64 JSON: front matter title and metadata, one section per heading', async () => {
    const r = await post('/documents', { doc_id: 'bakery', content: Buffer.from(MARKDOWN).toString('base64'), filename: 'bakery.md' });
    assert.equal(r.status, 201, JSON.stringify(r.body));
    assert.deepEqual(r.body['documents'], [{ doc_id: 'bakery', title: 'Bakery notes', chunks: 3, collection: 'default' }]);
    const doc = await (await fetch(`${url}/documents/bakery`)).json() as { metadata: Record<string, string>; chunks: { locator: string; text: string }[] };
    assert.deepEqual(doc.metadata, { author: 'Ines Faro', tags: 'bread, starters', filename: 'bakery.md', kind: 'markdown' });
    assert.deepEqual(doc.chunks.map((c) => c.locator), ['section: Bakery', 'section: Bakery > Sourdough', 'section: Bakery > Rye']);
    assert.ok(!doc.chunks.some((c) => c.text.includes('author:')), 'the front matter is not text');
  });

  const questions = [
    { q: 'How often does the Vega-9 lighthouse flash?', title: 'Skerry Point harbour manual', locator: 'page 2', fact: 'every twelve seconds' },
    { q: 'Which bumblebee pollinates the quillberry flowers?', title: 'Greenhouse handbook', locator: 'section: Pollination', fact: 'Ostrava bumblebee' },
    { q: 'How often is the Kestrel-5 telescope mirror recalibrated?', title: 'Observatory guide', locator: 'section: Telescopes > Calibration', fact: 'every forty nights' },
    { q: 'How much flour is the rye starter Brunhilde fed?', title: 'Bakery notes', locator: 'section: Bakery > Rye', fact: 'eighty grams of flour' },
  ];
  for (const { q, title, locator, fact } of questions) {
    test(`"${q}": the first citation is ${title}, ${locator}, on /query and in chat's rag`, async () => {
      const { query, chat } = await cite(q);
      for (const citations of [query, chat]) {
        const first = citations[0]!;
        assert.equal(first.title, title, JSON.stringify(citations.map((c) => [c.title, c.locator])));
        assert.equal(first.locator, locator);
        assert.ok(first.text.includes(fact), first.text);
      }
    });
  }

  test('a type no parser reads: 415 naming the file; a damaged PDF alone: 422 naming it; nothing goes in', async () => {
    const before = faiss(service).documentCount;
    const png = new FormData();
    // A name beyond ASCII comes back as it was sent (UTF-8, not busboy's latin1 default).
    png.append('file', file(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), 'image/png'), 'schéma.png');
    const r = await post('/documents', png);
    assert.equal(r.status, 415);
    const e = r.body['error'] as { code: string; message: string; filename: string };
    assert.equal(e.code, 'unsupported_file_type');
    assert.equal(e.filename, 'schéma.png');
    assert.match(e.message, /^schéma\.png: unsupported file type \(extension '\.png', type 'image\/png'\)/);

    // A raw PDF as the body: no name to read it by, and not a form: the route says what it takes.
    const raw = await fetch(`${url}/documents`, { method: 'POST', body: PDF, headers: { 'content-type': 'application/pdf' } });
    assert.equal(raw.status, 415);
    assert.match(((await raw.json()) as { error: { message: string } }).error.message, /takes application\/json or multipart\/form-data/);

    const torn = await post('/documents', { content: PDF.subarray(0, 300).toString('base64'), filename: 'torn.pdf' });
    assert.equal(torn.status, 422);
    assert.equal((torn.body['error'] as { filename: string }).filename, 'torn.pdf');
    // A Word name on bytes that are no Word package: unreadable, not unsupported.
    const fake = await post('/documents', { content: Buffer.from('plain words').toString('base64'), filename: 'notes.docx' });
    assert.equal(fake.status, 422);
    assert.match((fake.body['error'] as { message: string }).message, /^notes\.docx: not a Word document/);
    assert.equal(faiss(service).documentCount, before);
  });

  test('malformed bodies are 400s: content without filename, not base64, doc_id with several files', async () => {
    const noName = await post('/documents', { content: 'aGVsbG8=' });
    assert.equal(noName.status, 400);
    assert.match((noName.body['error'] as { message: string }).message, /filename is required with content/);
    assert.equal((await post('/documents', { content: '***', filename: 'a.txt' })).status, 400);
    const two = new FormData();
    two.append('doc_id', 'x');
    two.append('a', file('one', 'text/plain'), 'a.txt');
    two.append('b', file('two', 'text/plain'), 'b.txt');
    assert.equal((await post('/documents', two)).status, 400);
  });

  test('the locator survives a restart (it is in the snapshot)', async () => {
    const reopened = await RagService.start(service.cfg, service.models);
    const d = faiss(reopened).documents(0, 100).find((x) => x.title === 'Skerry Point harbour manual')!;
    assert.deepEqual(d.chunkIds.map((id) => faiss(reopened).chunk(id).locator), ['page 1', 'page 2']);
    assert.equal(d.metadata!['author'], 'Harbour Board');
  });

  test('an upload over RAGGUARD_MAX_UPLOAD_BYTES is a 413, with a Content-Length or streamed without one', async () => {
    const small = new RagService({ ...service.cfg, maxUploadBytes: 4096 }, service.models, service.store);
    const base = await new Promise<string>((resolve) => {
      const s = createApp(small, { logger: createLogger('silent') }).listen(0, '127.0.0.1', () => {
        const a = s.address();
        resolve(`http://127.0.0.1:${typeof a === 'object' && a ? a.port : 0}`);
      });
      servers.push(s);
    });
    const big = 'lorem ipsum '.repeat(1000);
    const form = new FormData();
    form.append('file', file(big, 'text/plain'), 'big.txt');
    const sized = await fetch(`${base}/documents`, { method: 'POST', body: form });
    assert.equal(sized.status, 413);
    assert.equal(((await sized.json()) as { error: { code: string } }).error.code, 'payload_too_large');
    // The same multipart bytes as a stream: no Content-Length, the count as it arrives stops it.
    const req = new Request(`${base}/documents`, { method: 'POST', body: form });
    const bytes = new Uint8Array(await req.arrayBuffer());
    const stream = new ReadableStream<Uint8Array>({
      start(c) {
        for (let i = 0; i < bytes.length; i += 1024) c.enqueue(bytes.subarray(i, i + 1024));
        c.close();
      },
    });
    const streamed = await fetch(`${base}/documents`, {
      method: 'POST', body: stream, headers: { 'content-type': req.headers.get('content-type')! }, duplex: 'half',
    } as RequestInit & { duplex: 'half' });
    assert.equal(streamed.status, 413);
    assert.equal(((await streamed.json()) as { error: { code: string } }).error.code, 'payload_too_large');
    assert.equal(faiss(service).documents(0, 100).some((d) => d.metadata?.['filename'] === 'big.txt'), false);
  });

  test('PUT /documents/:id replaces a document with a file, its locators with it', async () => {
    const put = await fetch(`${url}/documents/harbour-copy`, {
      method: 'PUT', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ content: PDF.toString('base64'), filename: 'harbour.pdf' }),
    });
    assert.equal(put.status, 201);
    const doc = await (await fetch(`${url}/documents/harbour-copy`)).json() as { title: string; chunks: { locator: string }[] };
    assert.equal(doc.title, 'Skerry Point harbour manual');
    assert.deepEqual(doc.chunks.map((c) => c.locator), ['page 1', 'page 2']);
    const bad = await fetch(`${url}/documents/harbour-copy`, {
      method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ content: 'AAAA', filename: 'scan.tiff' }),
    });
    assert.equal(bad.status, 415);
    assert.equal(((await bad.json()) as { error: { filename: string } }).error.filename, 'scan.tiff');
  });

  test('the CLI folder walk reads PDF and DOCX with their pages and sections, and skips a damaged file with why', async () => {
    const dir = await tempDir('ragguard-files-');
    await mkdir(path.join(dir, 'manuals'));
    await writeFile(path.join(dir, 'manuals', 'harbour.pdf'), PDF);
    await writeFile(path.join(dir, 'greenhouse.docx'), await DOCX);
    await writeFile(path.join(dir, 'torn.pdf'), PDF.subarray(0, 300));
    const { documents, skipped } = await readFolder(dir, 1 << 20);
    assert.deepEqual(documents.map((d) => [d.docId, d.title, d.sections.map((x) => x.locator)]), [
      ['greenhouse', 'Greenhouse handbook', ['section: Watering', 'section: Pollination']],
      ['manuals.harbour', 'Skerry Point harbour manual', ['page 1', 'page 2']],
    ]);
    assert.equal(skipped.length, 1);
    assert.equal(skipped[0]!.file, 'torn.pdf');
    assert.match(skipped[0]!.reason, /^not a readable PDF/);
  });
});
