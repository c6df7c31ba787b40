/**
 * Document routes beside POST /documents (app.ts): list (paged), read, replace, remove.
 *
 *   GET    /documents?limit=&offset=   {documents: [{doc_id, title, bytes, chunks}], total, offset, limit, next_offset}
 *   GET    /documents/:id              the document (its metadata too) with its chunks (id, position, tokens, locator, text)
 *   PUT    /documents/:id {text, title?} | {content (base64), filename, content_type?, title?}
 *                                     replace (re-chunk, re-embed): 200, or 201 when it is new; a file
 *                                     that cannot be read is a 415/422 naming it (document-intake.ts)
 *   DELETE /documents/:id              200 {doc_id, deleted: true, chunks}; 404 when there is none
 */
import { Router, type Request } from 'express';
import { z } from 'zod';
import { removeDocument, replaceDocument } from '../service/documents.js';
import type { RagService } from '../service/rag.js';
import type { StoredDocument } from '../retrieval/store.js';
import { readFileDocument, textBodyWithin } from './document-intake.js';
import { HttpError } from './errors.js';
import { fileFields, textOrFile } from './schemas.js';

const DOC_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
export const MAX_PAGE = 1000;

const Page = z.object({
  limit: z.coerce.number().int().min(1).max(MAX_PAGE).default(100),
  offset: z.coerce.number().int().min(0).default(0),
}).strict();

const Replacement = z.object({
  text: z.string().refine((t) => t.trim() !== '', 'must be a non-empty string').optional(),
  title: z.string().max(512).optional(),
  doc_id: z.string().optional(),
  ...fileFields,
}).strict().superRefine(textOrFile);

function invalid(e: z.ZodError): HttpError {
  const problems = e.issues.map((i) => `${i.path.join('.') || 'body'}: ${i.message}`);
  return new HttpError(400, 'invalid_field', problems.join('; '), { problems });
}

function docId(req: Request): string {
  const id = String(req.params['id']);
  if (!DOC_ID.test(id)) throw new HttpError(400, 'invalid_field', `document id must match ${DOC_ID.source}`);
  return id;
}

const summary = (d: StoredDocument) => ({ doc_id: d.docId, title: d.title, bytes: d.bytes, chunks: d.chunkIds.length, ...(d.metadata ? { metadata: d.metadata } : {}) });

const notFound = (id: string) => new HttpError(404, 'document_not_found', `no document '${id}'`, { doc_id: id });

export function documentsRouter(service: RagService): Router {
  const r = Router();
  const { store } = service;

  r.get('/documents', (req, res) => {
    const q = Page.safeParse(req.query);
    if (!q.success) throw invalid(q.error);
    const { limit, offset } = q.data;
    const total = store.documentCount;
    const page = store.documents(offset, limit);
    res.json({ documents: page.map(summary), total, offset, limit, next_offset: offset + page.length < total ? offset + page.length : null });
  });

  r.get('/documents/:id', (req, res) => {
    const id = docId(req);
    const d = store.stored(id);
    if (!d) throw notFound(id);
    res.json({
      ...summary(d),
      chunks: d.chunkIds.map((c) => {
        const ch = store.chunk(c);
        return { chunk_id: ch.id, ord: ch.ord, tokens: ch.tokens, ...(ch.locator === undefined ? {} : { locator: ch.locator }), text: ch.text };
      }),
    });
  });

  r.put('/documents/:id', async (req, res) => {
    const id = docId(req);
    const b = Replacement.safeParse(req.body);
    if (!b.success) throw invalid(b.error);
    if (b.data.doc_id !== undefined && b.data.doc_id !== id) {
      throw new HttpError(400, 'invalid_field', `doc_id '${b.data.doc_id}' differs from the path's '${id}'`);
    }
    const title = b.data.title?.trim() || undefined;
    if (b.data.content === undefined) textBodyWithin(req, service.cfg.maxDocumentBytes);
    const d = b.data.content === undefined ? { text: b.data.text!, title }
      : await readFileDocument({ filename: b.data.filename!, contentType: b.data.content_type, bytes: Buffer.from(b.data.content, 'base64') }, service.cfg.maxDocumentBytes, id, title);
    const { result, replaced } = await replaceDocument(service, { ...d, docId: id });
    res.status(replaced ? 200 : 201).json({ document: result, replaced });
  });

  r.delete('/documents/:id', async (req, res) => {
    const id = docId(req);
    const d = await removeDocument(service, id);
    if (!d) throw notFound(id);
    res.json({ doc_id: id, deleted: true, chunks: d.chunkIds.length });
  });

  return r;
}
