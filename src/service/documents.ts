/**
 * Document writes beyond ingest: replace one document (re-chunk, re-embed) or remove it. Each runs as
 * the index's one writer (after any ingest in flight) and persists through the store's snapshot, as
 * ingest does; the embedding happens first, so a failure there leaves the store untouched, and a
 * failed write puts the store back (DocumentStore.transact).
 */
import type { Config } from '../config/config.js';
import type { IngestResult, RagService } from './rag.js';
import { chunkText, type ChunkSpan } from '../retrieval/chunker.js';
import type { Embedder } from '../retrieval/embedder.js';
import type { StoredDocument } from '../retrieval/store.js';

export interface EmbeddedDocument {
  docId: string;
  title: string;
  bytes: number;
  spans: ChunkSpan[];
  vectors: Float32Array;
}

/** Chunks and embeds one document the way ingest does ("title\nchunk" per chunk). */
export async function embedDocument(embedder: Embedder, cfg: Pick<Config, 'chunkTokens' | 'chunkOverlapTokens'>,
  d: { docId: string; title: string; text: string }): Promise<EmbeddedDocument> {
  const spans = chunkText(d.text, (w) => embedder.tokenizer.encode(w).length, {
    chunkTokens: cfg.chunkTokens,
    overlapTokens: cfg.chunkOverlapTokens,
  });
  const vectors = await embedder.embed(spans.map((s) => `${d.title}\n${s.text}`));
  return { docId: d.docId, title: d.title, bytes: Buffer.byteLength(d.text), spans, vectors };
}

/** Replaces the document `docId` (or creates it): says which. */
export function replaceDocument(service: RagService, d: { docId: string; title?: string; text: string }): Promise<{ result: IngestResult; replaced: boolean }> {
  return service.writeExclusive(async () => {
    const title = d.title ?? d.docId;
    const e = await embedDocument(service.models.embedder, service.cfg, { docId: d.docId, title, text: d.text });
    return service.store.transact(() => {
      const replaced = service.store.remove(d.docId) !== undefined;
      service.store.add({ docId: e.docId, title: e.title, bytes: e.bytes }, e.spans, e.vectors);
      return { result: { doc_id: e.docId, title: e.title, chunks: e.spans.length }, replaced };
    });
  });
}

/** Removes the document `docId`; undefined when there is none. */
export function removeDocument(service: RagService, docId: string): Promise<StoredDocument | undefined> {
  return service.writeExclusive(async () => {
    if (!service.store.stored(docId)) return undefined;
    return service.store.transact(() => service.store.remove(docId));
  });
}
