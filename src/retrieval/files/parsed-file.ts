/**
 * What a file parser gives back: the file's own title and metadata, and its text in sections, each
 * under the reference a citation can name (a PDF's page, a heading). And the two ways a file is
 * refused: a type no parser reads (HTTP 415), or a file of a known type that cannot be read (422).
 */
import type { Section } from '../chunker.js';

export type FileKind = 'pdf' | 'docx' | 'html' | 'markdown' | 'text';

export interface ParsedFile {
  kind: FileKind;
  /** The title the file gives itself (PDF info dict, DOCX core properties, <title>, front matter, first heading). */
  title?: string;
  /** Everything else it says of itself: author, subject, keywords, dates, language. Strings only. */
  metadata: Record<string, string>;
  sections: Section[];
}

/** A file whose type no parser reads. */
export class UnsupportedFileError extends Error {
  constructor(readonly filename: string, message: string) {
    super(`${filename}: ${message}`);
  }
}

/** A file of a known type that cannot be read: damaged, encrypted, not what its type says, no text. */
export class UnreadableFileError extends Error {
  constructor(readonly filename: string, message: string) {
    super(`${filename}: ${message}`);
  }
}

/** The reference of a section under a heading path: "section: Install > Linux". */
export const sectionLocator = (path: readonly string[]): string | undefined =>
  path.length === 0 ? undefined : `section: ${path.join(' > ')}`;

/** Keeps the heading path at `level` (1-6): deeper headings of the previous section are closed. */
export function enterHeading(path: { level: number; text: string }[], level: number, text: string): void {
  while (path.length > 0 && path[path.length - 1]!.level >= level) path.pop();
  path.push({ level, text });
}

/** Puts a non-empty, whitespace-folded value into metadata (capped: metadata is not a second body). */
export function putMeta(meta: Record<string, string>, key: string, value: unknown): void {
  if (value === undefined || value === null) return;
  const v = (Array.isArray(value) ? value.map(String).join(', ') : value instanceof Date ? value.toISOString() : String(value)).replace(/\s+/g, ' ').trim();
  if (v !== '') meta[key] = v.slice(0, 1024);
}
