/**
 * Document writes beyond ingest: replace one document (re-chunk, re-embed) or remove it. Each runs as
 * the index's one writer in this process (after any ingest in flight) and is one atomic write of the
 * store, as ingest is; the embedding happens first, so a failure there leaves the store untouched.
 */
import type { Config } from '../config/config.js';
import type { IngestResult, RagService } from './rag.js';
import { chunkSections, type LocatedSpan, type Section } from '../retrieval/chunker.js';
import type { Embedder } from '../retrieval/embedder.js';
import { DEFAULT_COLLECTION, type Metadata, type StoredDocument } from '../retrieval/retrieval-store.js';

export interface EmbeddedDocument {
  docId: string;
  title: string;
  bytes: number;
  metadata?: Metadata;
  spans: LocatedSpan[];
  vectors: Float32Array;
}

/** Chunks and embeds one document the way ingest does ("title\nchunk" per chunk). */
export async function embedDocument(embedder: Embedder, cfg: Pick<Config, 'chunkTokens' | 'chunkOverlapTokens'>,
  d: DocumentText): Promise<EmbeddedDocument> {
  const spans = chunkSections(d.sections ?? [{ text: d.text }], (w) => embedder.tokenizer.encode(w).length, {
    chunkTokens: cfg.chunkTokens,
    overlapTokens: cfg.chunkOverlapTokens,
  });
  const vectors = await embedder.embed(spans.map((s) => `${d.title}\n${s.text}`));
  return { docId: d.docId, title: d.title, bytes: Buffer.byteLength(d.text), ...(d.metadata ? { metadata: d.metadata } : {}), spans, vectors };
}

/** A document's text, in sections under their references when it came from a file (retrieval/files/). */
export interface DocumentText {
  docId: string;
  title: string;
  text: string;
  sections?: readonly Section[];
  metadata?: Metadata;
}

/** What the store keeps of a document beside its chunks. */
export const documentInfo = (e: EmbeddedDocument) => ({ docId: e.docId, title: e.title, bytes: e.bytes, ...(e.metadata ? { metadata: e.metadata } : {}) });

/** Replaces the document `docId` of the collection (or creates it): says which. */
export function replaceDocument(service: RagService, d: Omit<DocumentText, 'title'> & { title?: string; collection?: string }): Promise<{ result: IngestResult; replaced: boolean }> {
  return service.writeExclusive(async () => {
    const collection = d.collection ?? DEFAULT_COLLECTION;
    const e = await embedDocument(service.models.embedder, service.cfg, { ...d, title: d.title ?? d.docId });
    const [w] = await service.store.replaceBatch([{ doc: { ...documentInfo(e), collection }, chunks: e.spans, vectors: e.vectors }]);
    return { result: { doc_id: e.docId, title: e.title, chunks: e.spans.length, collection }, replaced: w!.replaced };
  });
}

/** Removes the document `docId` of the collection; undefined when there is none. */
export function removeDocument(service: RagService, docId: string, collection = DEFAULT_COLLECTION): Promise<StoredDocument | undefined> {
  return service.writeExclusive(() => service.store.remove(collection, docId));
}
