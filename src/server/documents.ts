/**
 * Document routes beside POST /documents (app.ts): list (paged), read, replace, remove; each in one
 * collection (`?collection=`, 'default' when left out), on whichever store RAGGUARD_STORE names.
 *
 *   GET    /documents?collection=&limit=&offset=   {documents: [{doc_id, collection, title, bytes, metadata, chunks}], total, offset, limit, next_offset}
 *   GET    /documents/:id?collection=              the document (its metadata too) with its chunks (id, position, tokens, locator, text)
 *   PUT    /documents/:id {text, title?, collection?, metadata?} | {content (base64), filename, content_type?, title?, collection?}
 *                                     replace (re-chunk, re-embed): 200, or 201 when it is new; a file
 *                                     that cannot be read is a 415/422 naming it (document-intake.ts)
 *   DELETE /documents/:id?collection=              200 {doc_id, collection, deleted: true, chunks}; 404 when there is none
 */
import { Router, type Request } from 'express';
import { z } from 'zod';
import { removeDocument, replaceDocument } from '../service/documents.js';
import type { RagService } from '../service/rag.js';
import { DEFAULT_COLLECTION, type StoredDocument } from '../retrieval/retrieval-store.js';
import { readFileDocument, textBodyWithin } from './document-intake.js';
import { HttpError } from './errors.js';
import { collectionSchema, fileFields, metadataSchema, textOrFile } from './schemas.js';

const DOC_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
export const MAX_PAGE = 1000;

const Page = z.object({
  limit: z.coerce.number().int().min(1).max(MAX_PAGE).default(100),
  offset: z.coerce.number().int().min(0).default(0),
  collection: collectionSchema.default(DEFAULT_COLLECTION),
}).strict();

const InCollection = z.object({ collection: collectionSchema.default(DEFAULT_COLLECTION) }).strict();
const MaybeCollection = z.object({ collection: collectionSchema.optional() }).strict();

const Replacement = z.object({
  text: z.string().refine((t) => t.trim() !== '', 'must be a non-empty string').optional(),
  title: z.string().max(512).optional(),
  doc_id: z.string().optional(),
  collection: collectionSchema.optional(),
  metadata: metadataSchema.optional(),
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

function collectionOf(req: Request): string {
  const q = InCollection.safeParse(req.query);
  if (!q.success) throw invalid(q.error);
  return q.data.collection;
}

const summary = (d: StoredDocument) => ({
  doc_id: d.docId, collection: d.collection, title: d.title, bytes: d.bytes, metadata: d.metadata, chunks: d.chunkIds.length,
});

const notFound = (id: string, collection: string) =>
  new HttpError(404, 'document_not_found', collection === DEFAULT_COLLECTION ? `no document '${id}'` : `no document '${id}' in collection '${collection}'`,
    { doc_id: id, collection });

export function documentsRouter(service: RagService): Router {
  const r = Router();
  const { store } = service;

  r.get('/documents', async (req, res) => {
    const q = Page.safeParse(req.query);
    if (!q.success) throw invalid(q.error);
    const { limit, offset, collection } = q.data;
    const { documents: page, total } = await store.list(collection, offset, limit);
    res.json({ documents: page.map(summary), total, offset, limit, next_offset: offset + page.length < total ? offset + page.length : null });
  });

  r.get('/documents/:id', async (req, res) => {
    const id = docId(req);
    const collection = collectionOf(req);
    const d = await store.get(collection, id);
    if (!d) throw notFound(id, collection);
    const chunks = await store.chunksOf(collection, id);
    res.json({
      ...summary(d),
      chunks: chunks.map((ch) => ({ chunk_id: ch.id, ord: ch.ord, tokens: ch.tokens, ...(ch.locator === undefined ? {} : { locator: ch.locator }), text: ch.text })),
    });
  });

  r.put('/documents/:id', async (req, res) => {
    const id = docId(req);
    const b = Replacement.safeParse(req.body);
    if (!b.success) throw invalid(b.error);
    if (b.data.doc_id !== undefined && b.data.doc_id !== id) {
      throw new HttpError(400, 'invalid_field', `doc_id '${b.data.doc_id}' differs from the path's '${id}'`);
    }
    const query = MaybeCollection.safeParse(req.query);
    if (!query.success) throw invalid(query.error);
    if (query.data.collection !== undefined && b.data.collection !== undefined && query.data.collection !== b.data.collection) {
      throw new HttpError(400, 'invalid_field', `collection '${b.data.collection}' differs from the query's '${query.data.collection}'`);
    }
    const collection = b.data.collection ?? query.data.collection ?? DEFAULT_COLLECTION;
    const title = b.data.title?.trim() || undefined;
    if (b.data.content === undefined) textBodyWithin(req, service.cfg.maxDocumentBytes);
    const d = b.data.content === undefined ? { text: b.data.text!, title, ...(b.data.metadata ? { metadata: b.data.metadata } : {}) }
      : await readFileDocument({ filename: b.data.filename!, contentType: b.data.content_type, bytes: Buffer.from(b.data.content, 'base64') }, service.cfg.maxDocumentBytes, id, title);
    const { result, replaced } = await replaceDocument(service, { ...d, docId: id, collection });
    res.status(replaced ? 200 : 201).json({ document: result, replaced });
  });

  r.delete('/documents/:id', async (req, res) => {
    const id = docId(req);
    const collection = collectionOf(req);
    const d = await removeDocument(service, id, collection);
    if (!d) throw notFound(id, collection);
    res.json({ doc_id: id, collection, deleted: true, chunks: d.chunkIds.length });
  });

  return r;
}
