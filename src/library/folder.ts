/**
 * A folder tree as documents: the files the server reads (PDF, DOCX, HTML, Markdown, plain text:
 * retrieval/files/registry.ts), each one document, read here with the same parsers (its sections under
 * their page or heading references, its own title and metadata). Its id is its path under the folder
 * (separators as '.', the extension dropped, other characters as '-'), so that ingesting the same tree
 * again replaces rather than duplicates. Everything else, and a file that cannot be read, is skipped,
 * with the reason.
 */
import { readdir, readFile, stat } from 'node:fs/promises';
import path from 'node:path';
import type { Section } from '../retrieval/chunker.js';
import { UnreadableFileError, UnsupportedFileError } from '../retrieval/files/parsed-file.js';

export interface FolderDocument {
  file: string;
  /** Where it is on disk (the server is sent the file itself, to read as it reads any upload). */
  fullPath: string;
  docId: string;
  title: string;
  text: string;
  sections: Section[];
  metadata: Record<string, string>;
}

export interface Skipped {
  file: string;
  reason: string;
}

const DOC_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

export function docIdFor(rel: string): string | undefined {
  const noExt = rel.slice(0, rel.length - path.extname(rel).length);
  const id = noExt.split(path.sep).join('.').replace(/[^A-Za-z0-9._-]+/g, '-').replace(/^[^A-Za-z0-9]+/, '');
  return DOC_ID.test(id) ? id : undefined;
}

/** Walks `root` (sorted, depth first) and reads what it can ingest; `maxBytes`: the largest text a document may have. */
export async function readFolder(root: string, maxBytes: number): Promise<{ documents: FolderDocument[]; skipped: Skipped[] }> {
  // The parsers (PDF, DOCX) load with the first folder read, not with the library.
  const { FILE_EXTENSIONS, fileDocument, isReadable } = await import('../retrieval/files/registry.js');
  const documents: FolderDocument[] = [];
  const skipped: Skipped[] = [];
  const ids = new Map<string, string>();
  if (!(await stat(root)).isDirectory()) throw new Error(`${root} is not a directory`);
  const walk = async (dir: string): Promise<void> => {
    const entries = (await readdir(dir, { withFileTypes: true })).sort((a, b) => (a.name < b.name ? -1 : 1));
    for (const e of entries) {
      const full = path.join(dir, e.name);
      const rel = path.relative(root, full);
      if (e.name.startsWith('.')) {
        skipped.push({ file: rel, reason: 'hidden' });
        continue;
      }
      let isDir = e.isDirectory();
      if (e.isSymbolicLink()) {
        const target = await stat(full).catch(() => undefined);
        if (!target) { skipped.push({ file: rel, reason: 'broken symbolic link' }); continue; }
        // Links to directories could loop: not followed.
        if (target.isDirectory()) { skipped.push({ file: rel, reason: 'symbolic link to a directory (not followed)' }); continue; }
        isDir = false;
      }
      if (isDir) {
        await walk(full);
        continue;
      }
      if (!e.isFile() && !e.isSymbolicLink()) { skipped.push({ file: rel, reason: 'not a regular file' }); continue; }
      if (!isReadable(e.name)) { skipped.push({ file: rel, reason: `unsupported type '${path.extname(e.name) || '(no extension)'}' (only ${FILE_EXTENSIONS.join(', ')})` }); continue; }
      let d;
      try {
        d = await fileDocument({ filename: e.name, bytes: await readFile(full) });
      } catch (err) {
        if (err instanceof UnreadableFileError || err instanceof UnsupportedFileError) {
          skipped.push({ file: rel, reason: err.message.slice(err.filename.length + 2) });
          continue;
        }
        throw err;
      }
      const { text } = d;
      if (Buffer.byteLength(text) > maxBytes) { skipped.push({ file: rel, reason: `text of ${Buffer.byteLength(text)} bytes exceeds RAGGUARD_MAX_DOCUMENT_BYTES (${maxBytes})` }); continue; }
      const docId = docIdFor(rel);
      if (!docId) { skipped.push({ file: rel, reason: 'no valid document id can be made from its path (too long?)' }); continue; }
      const clash = ids.get(docId);
      if (clash) { skipped.push({ file: rel, reason: `same document id '${docId}' as ${clash}` }); continue; }
      ids.set(docId, rel);
      documents.push({ file: rel, fullPath: full, docId, title: d.title, text, sections: d.sections, metadata: d.metadata });
    }
  };
  await walk(root);
  return { documents, skipped };
}
