/**
 * POST /documents' intake: texts and files, in JSON or as a multipart/form-data upload, and the reply
 * per file.
 *
 * Bodies:
 *   JSON       {doc_id?, title?, text} | {doc_id?, title?, content (base64), filename, content_type?}, or {documents: [...]} of them
 *   multipart  one or more files (any field name; the part's filename and Content-Type pick the parser), and
 *              with exactly one file, optional fields doc_id and title
 * The file types read and how: retrieval/files/registry.ts. A file's title is its own (else its name);
 * without a doc_id a document's id is the hash of its text, as for JSON texts.
 *
 * Batch semantics: the body as a whole is checked first (a malformed body, an unknown field, an upload
 * over RAGGUARD_MAX_UPLOAD_BYTES: 400/413, nothing ingested). Then each file is read on its own; one that
 * cannot be read is left out with its own status, naming it:
 *   415 unsupported_file_type  a type no parser reads
 *   422 unreadable_file        damaged, encrypted, not what its type says, or no text in it
 *   413 document_too_large     its text exceeds RAGGUARD_MAX_DOCUMENT_BYTES
 * and the others go in together, as one batch (visible at once, once durable; a doc_id that exists is a
 * 409 for the whole batch, as before). The reply:
 *   201 {documents}                          every item went in (the shape JSON ingest always had)
 *   207 {documents, results}                 some went in, some did not (Multi-Status)
 *   415/422/413 {error, results}             none went in: the status they share, else 422
 * `results` holds one entry per item, in the request's order: {index, filename?, status, doc_id?, title?,
 * chunks?, error?: {code, message}}.
 */
import { type NextFunction, type Request, type RequestHandler, type Response } from 'express';
import multer from 'multer';
import type { Writable } from 'node:stream';
import type { Config } from '../config/config.js';
import { DuplicateDocumentError, type DocumentInput, type IngestResult, type RagService } from '../service/rag.js';
import { fileDocument, UnreadableFileError, UnsupportedFileError, type FileInput } from '../retrieval/files/registry.js';
import { HttpError } from './errors.js';
import { jsonBody } from './json-body.js';
import { requestSignal } from './shutdown.js';
import { collectionFor, tenantOf } from './tenant.js';
import { nextTurn } from '../runtime/turns.js';
import { parseDocuments, type DocumentItem } from './validate.js';

/** Files in one request at most (as JSON's documents list). */
export const MAX_FILES = 1000;
const DOC_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

const tooLarge = (limit: number) =>
  new HttpError(413, 'payload_too_large', `upload exceeds RAGGUARD_MAX_UPLOAD_BYTES (${limit} bytes)`, { limit_bytes: limit });

/**
 * Reads a multipart/form-data body into req.files and req.body (multer, held in memory: bounded by
 * RAGGUARD_MAX_UPLOAD_BYTES for the whole request, counted as it arrives, so a body without a
 * Content-Length is held to it too). Any other body passes untouched.
 */
export function multipartUpload(cfg: Pick<Config, 'maxUploadBytes'>): RequestHandler {
  const limit = cfg.maxUploadBytes;
  // streamHandler (multer 2's hook for feeding busboy) is not in @types/multer.
  const options: multer.Options & { streamHandler: (req: Request, busboy: Writable) => void } = {
    storage: multer.memoryStorage(),
    // File names as browsers and curl send them (UTF-8), not busboy's latin1 default.
    defParamCharset: 'utf8',
    limits: { fileSize: limit, files: MAX_FILES, fields: 8, fieldSize: 4096, parts: MAX_FILES + 8 },
    streamHandler(req, busboy) {
      let bytes = 0;
      req.on('data', (chunk: Buffer) => {
        bytes += chunk.length;
        if (bytes > limit) busboy.destroy(tooLarge(limit));
      });
      req.pipe(busboy);
    },
  };
  const upload = multer(options).any();
  return (req: Request, res: Response, next: NextFunction) => {
    if (Number(req.headers['content-length'] ?? 0) > limit && req.is('multipart')) return next(tooLarge(limit));
    upload(req, res, (err?: unknown) => {
      if (err === undefined || err === null) return next();
      if (err instanceof HttpError) return next(err);
      if (err instanceof multer.MulterError) {
        if (err.code === 'LIMIT_FILE_SIZE') return next(tooLarge(limit));
        return next(new HttpError(err.code.startsWith('LIMIT_') ? 413 : 400, 'invalid_upload', `multipart body: ${err.message}${err.field ? ` (${err.field})` : ''}`));
      }
      // busboy's own complaints (a malformed body, a missing boundary) are the client's.
      return next(new HttpError(400, 'invalid_upload', `multipart body: ${(err as Error).message}`));
    });
  };
}

/**
 * JSON for the document routes, under RAGGUARD_MAX_UPLOAD_BYTES (files as base64); a body of texts
 * alone is still held to RAGGUARD_MAX_DOCUMENT_BYTES, by textBodyWithin once it is parsed.
 */
export function uploadJson(cfg: Pick<Config, 'maxUploadBytes' | 'maxDocumentBytes'>): RequestHandler {
  const limit = Math.max(cfg.maxDocumentBytes, cfg.maxUploadBytes);
  const parse = jsonBody(limit);
  return (req, res, next) => parse(req, res, (err?: unknown) => {
    next((err as { type?: string } | undefined)?.type === 'entity.too.large' ? tooLarge(limit) : err);
  });
}

/** A JSON body without files is held to RAGGUARD_MAX_DOCUMENT_BYTES, as before files were taken. */
export function textBodyWithin(req: Request, maxDocumentBytes: number): void {
  const bytes = Number(req.headers['content-length'] ?? Buffer.byteLength(JSON.stringify(req.body ?? null)));
  if (bytes > maxDocumentBytes) throw new HttpError(413, 'payload_too_large', 'request body exceeds RAGGUARD_MAX_DOCUMENT_BYTES');
}

/** The items of a multipart body: its files, with doc_id and title when there is one file. */
function multipartItems(req: Request): DocumentItem[] {
  const files = (req.files ?? []) as Express.Multer.File[];
  const fields = (req.body ?? {}) as Record<string, unknown>;
  for (const k of Object.keys(fields)) {
    if (k !== 'doc_id' && k !== 'title') throw new HttpError(400, 'invalid_body', `unknown form field '${k}' (doc_id and title are read, with one file)`, { param: k });
  }
  if (files.length === 0) throw new HttpError(400, 'invalid_body', 'a multipart body needs at least one file part');
  const docId = typeof fields['doc_id'] === 'string' ? fields['doc_id'] : undefined;
  const title = typeof fields['title'] === 'string' ? fields['title'].trim() || undefined : undefined;
  if ((docId !== undefined || title !== undefined) && files.length > 1) {
    throw new HttpError(400, 'invalid_body', 'doc_id and title name one document: send them with one file only');
  }
  if (docId !== undefined && !DOC_ID.test(docId)) throw new HttpError(400, 'invalid_field', `doc_id must match ${DOC_ID.source}`, { param: 'doc_id' });
  if (title !== undefined && title.length > 512) throw new HttpError(400, 'invalid_field', 'title: at most 512 characters', { param: 'title' });
  return files.map((f) => ({
    file: { filename: f.originalname || f.fieldname, contentType: f.mimetype || undefined, bytes: f.buffer },
    docId, title,
  }));
}

/** A file as a document, or why it cannot be one (415, 422, 413), naming it. */
export async function readFileDocument(file: FileInput, maxDocumentBytes: number, docId?: string, title?: string): Promise<DocumentInput> {
  let d;
  try {
    d = await fileDocument(file);
  } catch (e) {
    if (e instanceof UnsupportedFileError) throw new HttpError(415, 'unsupported_file_type', e.message, { filename: e.filename });
    if (e instanceof UnreadableFileError) throw new HttpError(422, 'unreadable_file', e.message, { filename: e.filename });
    throw e;
  }
  const bytes = Buffer.byteLength(d.text);
  if (bytes > maxDocumentBytes) {
    throw new HttpError(413, 'document_too_large', `${file.filename}: its text of ${bytes} bytes exceeds RAGGUARD_MAX_DOCUMENT_BYTES (${maxDocumentBytes})`, { filename: file.filename });
  }
  return { docId, title: title ?? d.title, text: d.text, sections: d.sections, metadata: d.metadata };
}

interface Result {
  index: number;
  filename?: string;
  status: number;
  doc_id?: string;
  title?: string;
  chunks?: number;
  error?: Record<string, unknown>;
}

/** The POST /documents handler (after jsonBody and multipartUpload). */
export async function postDocuments(service: RagService, req: Request, res: Response): Promise<void> {
  const { cfg } = service;
  const multipart = typeof req.is('multipart') === 'string';
  // A raw file as the body (Content-Type: application/pdf) has no name to read it by: say what is taken.
  if (!multipart && req.headers['content-type'] !== undefined && typeof req.is('json') !== 'string') {
    throw new HttpError(415, 'unsupported_media_type', `POST /documents takes application/json or multipart/form-data, not ${req.headers['content-type']}`);
  }
  // A JSON body of texts alone is held to RAGGUARD_MAX_DOCUMENT_BYTES as it always was; the larger
  // upload limit its parser allowed is for base64 files.
  const items = multipart ? multipartItems(req) : parseDocuments(req.body);
  // Every document in a collection the key may use (its default where none is named), before any is read or written.
  const tenant = tenantOf(res);
  items.forEach((item, i) => {
    const param = items.length > 1 ? `documents[${i}].collection` : 'collection';
    if ('text' in item) item.text = { ...item.text, collection: collectionFor(tenant, item.text.collection, param) };
    else item.collection = collectionFor(tenant, item.collection, param);
  });
  if (!multipart && items.every((i) => 'text' in i)) textBodyWithin(req, cfg.maxDocumentBytes);
  const read: (DocumentInput | HttpError)[] = [];
  for (const item of items) {
    if ('text' in item) { read.push(item.text); continue; }
    // A file's parse holds the event loop (a long PDF: a while): one file per turn (turns.ts).
    await nextTurn();
    try {
      const d = await readFileDocument(item.file, cfg.maxDocumentBytes, item.docId, item.title);
      read.push({
        ...d, ...(item.collection === undefined ? {} : { collection: item.collection }),
        ...(item.metadata === undefined ? {} : { metadata: { ...d.metadata, ...item.metadata } }),
      });
    } catch (e) {
      if (!(e instanceof HttpError)) throw e;
      read.push(e);
    }
  }
  const docs = read.filter((r): r is DocumentInput => !(r instanceof HttpError));
  let ingested: IngestResult[] = [];
  if (docs.length > 0) {
    try {
      ingested = await service.ingest(docs, requestSignal(res));
    } catch (e) {
      if (e instanceof DuplicateDocumentError) throw new HttpError(409, 'document_exists', e.message, { doc_id: e.docId });
      throw e;
    }
  }
  const failed = read.filter((r): r is HttpError => r instanceof HttpError);
  if (failed.length === 0) {
    res.status(201).json({ documents: ingested });
    return;
  }
  let next = 0;
  const results: Result[] = read.map((r, index) => {
    const item = items[index]!;
    const filename = 'file' in item ? { filename: item.file.filename } : {};
    if (r instanceof HttpError) return { index, ...filename, status: r.status, error: r.body().error };
    return { index, ...filename, status: 201, ...ingested[next++]! };
  });
  if (ingested.length > 0) {
    res.status(207).json({ documents: ingested, results });
    return;
  }
  const statuses = new Set(failed.map((f) => f.status));
  const status = statuses.size === 1 ? failed[0]!.status : 422;
  const only = failed.length === 1 ? failed[0]! : undefined;
  const error = only
    ? only.body().error
    : { code: statuses.size === 1 ? failed[0]!.code : 'no_document_readable', message: `none of the ${failed.length} files could be read: ${failed.map((f) => f.message).join('; ')}` };
  res.status(status).json({ error, results });
}
