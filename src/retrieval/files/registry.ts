/**
 * Which parser reads a file: by its MIME type where that names one we read, else by its extension
 * (clients send application/octet-stream, or a type of their own, for many a .md), and a file neither
 * names is an UnsupportedFileError listing what is read. The parsers: pdf.ts (unpdf), docx.ts
 * (mammoth), html.ts (htmlparser2), markdown.ts (marked, yaml); plain text is one section as it is.
 * fileDocument turns a file into what ingestion takes: its sections, title (the file's own, else its
 * name), and metadata (the file's own, plus its name and type).
 */
import path from 'node:path';
import type { Section } from '../chunker.js';
import { parseDocx } from './docx.js';
import { parseHtmlText } from './html.js';
import { parseMarkdownText } from './markdown.js';
import { UnreadableFileError, UnsupportedFileError, type FileKind, type ParsedFile } from './parsed-file.js';
import { parsePdf } from './pdf.js';
import { decodeText } from './text.js';

interface Reader {
  kind: FileKind;
  mimeTypes: readonly string[];
  extensions: readonly string[];
  parse(bytes: Uint8Array, filename: string, charset: string | undefined): Promise<Omit<ParsedFile, 'kind'>>;
}

const READERS: readonly Reader[] = [
  { kind: 'pdf', mimeTypes: ['application/pdf', 'application/x-pdf'], extensions: ['.pdf'], parse: (b, f) => parsePdf(b, f) },
  {
    kind: 'docx', mimeTypes: ['application/vnd.openxmlformats-officedocument.wordprocessingml.document'], extensions: ['.docx'],
    parse: (b, f) => parseDocx(b, f),
  },
  { kind: 'html', mimeTypes: ['text/html', 'application/xhtml+xml'], extensions: ['.html', '.htm', '.xhtml'], parse: async (b, f, cs) => parseHtmlText(decodeText(b, f, cs)) },
  { kind: 'markdown', mimeTypes: ['text/markdown', 'text/x-markdown'], extensions: ['.md', '.markdown'], parse: async (b, f, cs) => parseMarkdownText(decodeText(b, f, cs)) },
  {
    kind: 'text', mimeTypes: ['text/plain'], extensions: ['.txt', '.text'],
    parse: async (b, f, cs) => {
      const text = decodeText(b, f, cs).trim();
      return { metadata: {}, sections: text === '' ? [] : [{ text }] };
    },
  },
];

/** The extensions read, for messages and for the CLI's folder walk. */
export const FILE_EXTENSIONS: readonly string[] = READERS.flatMap((r) => r.extensions);
/** The MIME types read. */
export const FILE_MIME_TYPES: readonly string[] = READERS.flatMap((r) => r.mimeTypes);

export interface FileInput {
  filename: string;
  /** The MIME type the client gave (parameters such as charset included), if any. */
  contentType?: string;
  bytes: Uint8Array;
}

function mediaType(contentType: string | undefined): { type: string | undefined; charset: string | undefined } {
  if (!contentType) return { type: undefined, charset: undefined };
  const [type, ...params] = contentType.split(';').map((p) => p.trim());
  const charset = params.map((p) => /^charset\s*=\s*"?([^";]+)"?$/i.exec(p)?.[1]).find((c) => c !== undefined);
  return { type: type?.toLowerCase() || undefined, charset };
}

/** The parser for a file, or UnsupportedFileError naming it. */
function readerFor(f: FileInput): Reader {
  const { type } = mediaType(f.contentType);
  const byType = type === undefined ? undefined : READERS.find((r) => r.mimeTypes.includes(type));
  const ext = path.extname(f.filename).toLowerCase();
  const reader = byType ?? READERS.find((r) => r.extensions.includes(ext));
  if (!reader) {
    const what = [ext ? `extension '${ext}'` : 'no extension', type && type !== 'application/octet-stream' ? `type '${type}'` : undefined].filter(Boolean).join(', ');
    throw new UnsupportedFileError(f.filename, `unsupported file type (${what}): PDF, DOCX, HTML, Markdown and plain text are read (${FILE_EXTENSIONS.join(', ')})`);
  }
  return reader;
}

/** Whether a file of this name (and type) would be read: the CLI's folder walk asks before reading it. */
export function isReadable(filename: string, contentType?: string): boolean {
  try {
    readerFor({ filename, contentType, bytes: new Uint8Array() });
    return true;
  } catch {
    return false;
  }
}

export async function parseFile(f: FileInput): Promise<ParsedFile> {
  const reader = readerFor(f);
  if (f.bytes.length === 0) throw new UnreadableFileError(f.filename, 'empty file');
  const parsed = await reader.parse(f.bytes, f.filename, mediaType(f.contentType).charset);
  if (parsed.sections.length === 0) throw new UnreadableFileError(f.filename, `no text in it${reader.kind === 'html' || reader.kind === 'docx' ? ' (empty after stripping markup)' : ''}`);
  return { kind: reader.kind, ...parsed };
}

export interface FileDocument {
  title: string;
  /** The sections' texts, one after another: what the document's size and default id are of. */
  text: string;
  sections: Section[];
  metadata: Record<string, string>;
}

/** A file as a document: its sections, its own title (else its name without the extension), its metadata with its name and kind. */
export async function fileDocument(f: FileInput): Promise<FileDocument> {
  const p = await parseFile(f);
  const base = path.basename(f.filename);
  return {
    title: (p.title ?? (path.basename(base, path.extname(base)) || base)).slice(0, 512),
    text: p.sections.map((s) => s.text).join('\n\n'),
    sections: p.sections,
    metadata: { ...p.metadata, filename: base, kind: p.kind, ...(f.contentType ? { content_type: f.contentType } : {}) },
  };
}

export { UnreadableFileError, UnsupportedFileError };
