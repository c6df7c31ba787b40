/**
 * The file parsers on their own (no models): which parser a name and type pick, strict text decoding,
 * Markdown and HTML sections and titles, a PDF without a text layer, and chunking per section.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { chunkSections } from '../src/retrieval/chunker.js';
import { parseHtmlText } from '../src/retrieval/files/html.js';
import { parseMarkdownText } from '../src/retrieval/files/markdown.js';
import { fileDocument, parseFile, UnreadableFileError, UnsupportedFileError } from '../src/retrieval/files/registry.js';
import { makeDocx, makePdf } from './file-fixtures.js';

const bytes = (s: string) => Buffer.from(s);

describe('file parsers', () => {
  test('the MIME type picks the parser where it names one; else the extension; else 415', async () => {
    assert.equal((await parseFile({ filename: 'notes.txt', contentType: 'text/markdown', bytes: bytes('# A\nb') })).kind, 'markdown');
    assert.equal((await parseFile({ filename: 'notes.md', contentType: 'application/octet-stream', bytes: bytes('# A\nb') })).kind, 'markdown');
    assert.equal((await parseFile({ filename: 'page.HTM', bytes: bytes('<p>x</p>') })).kind, 'html');
    await assert.rejects(parseFile({ filename: 'old.doc', bytes: bytes('x') }), (e: unknown) => e instanceof UnsupportedFileError && e.filename === 'old.doc');
    await assert.rejects(parseFile({ filename: 'x.md', contentType: 'text/markdown; charset=klingon', bytes: bytes('x') }), UnsupportedFileError);
  });

  test('text is decoded strictly: its charset honoured, invalid bytes and NUL bytes refused, a BOM dropped', async () => {
    const latin1 = await fileDocument({ filename: 'a.txt', contentType: 'text/plain; charset=ISO-8859-1', bytes: Buffer.from([0x63, 0x61, 0x66, 0xe9]) });
    assert.equal(latin1.text, 'café');
    await assert.rejects(parseFile({ filename: 'a.txt', bytes: Buffer.from([0x63, 0xe9, 0x20]) }), /a\.txt: not valid UTF-8 text/);
    await assert.rejects(parseFile({ filename: 'a.md', bytes: Buffer.from([0x41, 0, 0x42]) }), UnreadableFileError);
    assert.equal((await fileDocument({ filename: 'a.txt', bytes: Buffer.from('\ufeffhello') })).text, 'hello');
    await assert.rejects(parseFile({ filename: 'empty.txt', bytes: Buffer.alloc(0) }), /empty file/);
  });

  test('Markdown: front matter gives title and metadata; # inside a code fence is no heading; a heading with nothing under it joins the next section', () => {
    const md = parseMarkdownText('---\ntitle: Guide\nversion: 3\n---\n# Setup\n## Linux\n\n```sh\n# apt install x\n```\n\n## Mac\nbrew install x\n');
    assert.equal(md.title, 'Guide');
    assert.deepEqual(md.metadata, { version: '3' });
    assert.deepEqual(md.sections.map((s) => s.locator), ['section: Setup > Linux', 'section: Setup > Mac']);
    assert.match(md.sections[0]!.text, /^# Setup\n## Linux\n\n```sh\n# apt install x\n```$/);
    assert.equal(parseMarkdownText('text before\n\n# Later').sections[0]!.locator, undefined);
  });

  test('HTML: what a reader sees, headings as sections, <title> and <meta> as title and metadata', () => {
    const h = parseHtmlText('<html lang="de"><head><title>T</title><meta name="description" content="About &amp; more">' +
      '<style>p{}</style></head><body><nav>menu</nav><h1>One <em>big</em></h1><p>a &gt; b</p><script>x="<h2>fake</h2>"</script>' +
      '<h3>Deep</h3><p>c<br>d</p><h2>Two</h2><p>e</p></body></html>');
    assert.equal(h.title, 'T');
    assert.deepEqual(h.metadata, { language: 'de', description: 'About & more' });
    assert.deepEqual(h.sections, [
      { locator: undefined, text: 'menu' },
      { locator: 'section: One big', text: 'One big\n\na > b' },
      { locator: 'section: One big > Deep', text: 'Deep\n\nc\nd' },
      { locator: 'section: One big > Two', text: 'Two\n\ne' },
    ]);
  });

  test('a PDF without a text layer, and a Word package without a document, are unreadable', async () => {
    await assert.rejects(parseFile({ filename: 'scan.pdf', bytes: makePdf([[], []]) }), /scan\.pdf: none of its 2 pages has a text layer/);
    const docx = await makeDocx([{ text: 'x' }]);
    const JSZip = (await import('jszip')).default;
    const zip = await JSZip.loadAsync(docx);
    zip.remove('word/document.xml');
    await assert.rejects(parseFile({ filename: 'hollow.docx', bytes: await zip.generateAsync({ type: 'nodebuffer' }) }), /hollow\.docx: not a Word document: the package has no word\/document\.xml/);
  });

  test('chunks never straddle two sections, and each keeps its section\'s locator', () => {
    const words = (n: number, w: string) => Array.from({ length: n }, (_, i) => `${w}${i}`).join(' ');
    const spans = chunkSections([{ locator: 'page 1', text: words(25, 'a') }, { locator: 'page 2', text: words(5, 'b') }, { text: words(3, 'c') }],
      () => 1, { chunkTokens: 10, overlapTokens: 2 });
    for (const s of spans) {
      const from = new Set(s.text.split(' ').map((w) => w[0]));
      assert.equal(from.size, 1, s.text);
      assert.equal(s.locator, { a: 'page 1', b: 'page 2', c: undefined }[[...from][0]!]);
    }
    assert.deepEqual(spans.map((s) => s.locator), ['page 1', 'page 1', 'page 1', 'page 2', undefined]);
  });
});
