/**
 * A folder tree as documents: .txt, .md (.markdown) and .html (.htm) files, each one document. Its id is
 * its path under the folder (separators as '.', the extension dropped, other characters as '-'), so
 * that ingesting the same tree again replaces rather than duplicates. Its title is its first heading
 * (Markdown, HTML's <title> or first <h1..h6>), else its file name. HTML is stripped to text.
 * Everything else is skipped, with the reason.
 */
import { lstat, readdir, readFile, stat } from 'node:fs/promises';
import path from 'node:path';
import { htmlToText, markdownTitle } from './html-text.js';

export interface FolderDocument {
  file: string;
  docId: string;
  title: string;
  text: string;
}

export interface Skipped {
  file: string;
  reason: string;
}

const KINDS: Record<string, 'txt' | 'md' | 'html'> = { '.txt': 'txt', '.md': 'md', '.markdown': 'md', '.html': 'html', '.htm': 'html' };
const DOC_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

export function docIdFor(rel: string): string | undefined {
  const noExt = rel.slice(0, rel.length - path.extname(rel).length);
  const id = noExt.split(path.sep).join('.').replace(/[^A-Za-z0-9._-]+/g, '-').replace(/^[^A-Za-z0-9]+/, '');
  return DOC_ID.test(id) ? id : undefined;
}

/** Walks `root` (sorted, depth first) and reads what it can ingest; `maxBytes`: the largest text a document may have. */
export async function readFolder(root: string, maxBytes: number): Promise<{ documents: FolderDocument[]; skipped: Skipped[] }> {
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
      const kind = KINDS[path.extname(e.name).toLowerCase()];
      if (!kind) { skipped.push({ file: rel, reason: `unsupported type '${path.extname(e.name) || '(no extension)'}' (only .txt, .md, .html)` }); continue; }
      const size = (await lstat(full)).size;
      const raw = await readFile(full);
      if (raw.includes(0)) { skipped.push({ file: rel, reason: 'binary content (NUL bytes)' }); continue; }
      const source = raw.toString('utf8');
      if (source.includes('\uFFFD')) { skipped.push({ file: rel, reason: 'not valid UTF-8' }); continue; }
      const base = path.basename(e.name, path.extname(e.name));
      let title: string | undefined;
      let text = source;
      if (kind === 'md') title = markdownTitle(source);
      if (kind === 'html') ({ title, text } = htmlToText(source));
      if (text.trim() === '') { skipped.push({ file: rel, reason: size === 0 ? 'empty file' : 'no text (empty after stripping markup)' }); continue; }
      if (Buffer.byteLength(text) > maxBytes) { skipped.push({ file: rel, reason: `text of ${Buffer.byteLength(text)} bytes exceeds RAGGUARD_MAX_DOCUMENT_BYTES (${maxBytes})` }); continue; }
      const docId = docIdFor(rel);
      if (!docId) { skipped.push({ file: rel, reason: 'no valid document id can be made from its path (too long?)' }); continue; }
      const clash = ids.get(docId);
      if (clash) { skipped.push({ file: rel, reason: `same document id '${docId}' as ${clash}` }); continue; }
      ids.set(docId, rel);
      documents.push({ file: rel, docId, title: (title ?? base).slice(0, 512), text });
    }
  };
  await walk(root);
  return { documents, skipped };
}
