/**
 * Word (.docx) to sections, through mammoth (maintained, pure JS: the DOCX-to-HTML converter most
 * Node projects use). Its HTML keeps Word's heading styles as h1-h6 (Title and Subtitle too), so the
 * HTML reader (html.ts) makes the sections, each under its heading path. Mammoth does not read the
 * package's core properties: they come from docProps/core.xml through jszip (mammoth's own zip
 * reader) and htmlparser2 in XML mode. A file that is not a Word package is an UnreadableFileError.
 */
import JSZip from 'jszip';
import mammoth from 'mammoth';
import { Parser } from 'htmlparser2';
import { parseHtmlText } from './html.js';
import { putMeta, UnreadableFileError, type ParsedFile } from './parsed-file.js';

/** What a Word package may unpack to: far beyond any document of text, well within the host's memory. */
const MAX_UNPACKED_BYTES = 256 * 1024 * 1024;
const STYLE_MAP = ["p[style-name='Title'] => h1:fresh", "p[style-name='Subtitle'] => h2:fresh"];
const CORE: Record<string, string> = {
  'dc:title': 'title', 'dc:creator': 'author', 'dc:subject': 'subject', 'dc:description': 'description', 'cp:keywords': 'keywords',
  'dc:language': 'language', 'dcterms:created': 'created', 'dcterms:modified': 'modified', 'cp:lastmodifiedby': 'last_modified_by',
};

/** docProps/core.xml's fields (title, author...) by our names. */
function coreProperties(xml: string): Record<string, string> {
  const out: Record<string, string> = {};
  let field: string | undefined;
  let value = '';
  const parser = new Parser({
    onopentag(name) { field = CORE[name.toLowerCase()]; value = ''; },
    ontext(t) { if (field) value += t; },
    onclosetag() { if (field) putMeta(out, field, value); field = undefined; },
  }, { xmlMode: true, decodeEntities: true });
  parser.write(xml);
  parser.end();
  return out;
}

export async function parseDocx(bytes: Uint8Array, filename: string): Promise<Omit<ParsedFile, 'kind'>> {
  const buffer = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let zip: JSZip;
  try {
    zip = await JSZip.loadAsync(buffer);
  } catch (e) {
    throw new UnreadableFileError(filename, `not a Word document: not a readable zip package (${(e as Error).message})`);
  }
  if (!zip.file('word/document.xml')) throw new UnreadableFileError(filename, 'not a Word document: the package has no word/document.xml');
  // Mammoth unpacks whole parts in memory: a package that says it unpacks to far more than any document
  // of text does (a zip bomb) is refused before it is unpacked. The sizes are the package's own word;
  // jszip fails a part whose data runs past what it declared.
  const unpacked = Object.values(zip.files).reduce((n, f) => n + ((f as unknown as { _data?: { uncompressedSize?: number } })._data?.uncompressedSize ?? 0), 0);
  if (unpacked > MAX_UNPACKED_BYTES) throw new UnreadableFileError(filename, `the Word package unpacks to ${unpacked} bytes, more than ${MAX_UNPACKED_BYTES}`);
  let html: string;
  try {
    html = (await mammoth.convertToHtml({ buffer }, { styleMap: STYLE_MAP })).value;
  } catch (e) {
    throw new UnreadableFileError(filename, `the Word document cannot be read (${(e as Error).message})`);
  }
  const core = zip.file('docProps/core.xml');
  const props = core ? coreProperties(await core.async('string')) : {};
  const { title: coreTitle, ...metadata } = props;
  const parsed = parseHtmlText(html);
  return { title: coreTitle ?? parsed.title, metadata, sections: parsed.sections };
}
