/**
 * PDF to one section per page ("page N", 1-based, the number a PDF viewer shows for an unlabelled
 * page), through unpdf: Mozilla's PDF.js (the reader in Firefox, maintained) in a build for servers,
 * pure JS with no native canvas and no worker file to locate, a dependency-free package. Pinned at
 * 1.7.0 (PDF.js 5.6): its next releases ask for Node 22, and the server runs on 20. The title and
 * metadata come from the document's info dictionary. A damaged, encrypted or text-less PDF (a scan
 * needs OCR, which this does not do) is an UnreadableFileError.
 */
import { extractText, getDocumentProxy, getMeta } from 'unpdf';
import type { Section } from '../chunker.js';
import { tidyText } from './html.js';
import { putMeta, UnreadableFileError, type ParsedFile } from './parsed-file.js';

const INFO: Record<string, string> = { Author: 'author', Subject: 'subject', Keywords: 'keywords', Creator: 'creator', Producer: 'producer', CreationDate: 'created', ModDate: 'modified' };

/** "D:20240102030405+01'00'" (PDF's date string) as ISO 8601; other strings as they are. */
function pdfDate(v: string): string {
  const m = /^D:(\d{4})(\d{2})?(\d{2})?(\d{2})?(\d{2})?(\d{2})?/.exec(v);
  if (!m) return v;
  const [, y, mo = '01', d = '01', h = '00', mi = '00', s = '00'] = m;
  return `${y}-${mo}-${d}T${h}:${mi}:${s}`;
}

export async function parsePdf(bytes: Uint8Array, filename: string): Promise<Omit<ParsedFile, 'kind'>> {
  let doc: Awaited<ReturnType<typeof getDocumentProxy>>;
  try {
    // A copy: PDF.js may take ownership of (detach) the buffer it is given.
    doc = await getDocumentProxy(new Uint8Array(bytes), { verbosity: 0, isEvalSupported: false });
  } catch (e) {
    const err = e as Error;
    const why = err.name === 'PasswordException' ? 'the PDF is encrypted with a password' : `not a readable PDF (${err.message})`;
    throw new UnreadableFileError(filename, why);
  }
  try {
    const { text } = await extractText(doc, { mergePages: false });
    const sections: Section[] = [];
    text.forEach((t, i) => {
      const page = tidyText(t);
      if (page !== '') sections.push({ locator: `page ${i + 1}`, text: page });
    });
    if (sections.length === 0) throw new UnreadableFileError(filename, `none of its ${doc.numPages} pages has a text layer (a scanned PDF needs OCR first)`);
    const { info } = await getMeta(doc);
    const dict = info as Record<string, unknown>;
    const metadata: Record<string, string> = { pages: String(doc.numPages) };
    for (const [k, name] of Object.entries(INFO)) {
      const v = dict[k];
      if (typeof v === 'string') putMeta(metadata, name, k.endsWith('Date') ? pdfDate(v) : v);
    }
    const title = typeof dict['Title'] === 'string' && dict['Title'].trim() !== '' ? dict['Title'].trim() : undefined;
    return { title, metadata, sections };
  } catch (e) {
    if (e instanceof UnreadableFileError) throw e;
    throw new UnreadableFileError(filename, `its pages cannot be read (${(e as Error).message})`);
  } finally {
    await doc.destroy();
  }
}
