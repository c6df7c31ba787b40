/** The Postgres store's rows as pg returns them (postgres-store.ts), and as the store's chunks and documents. */
import type { Metadata, StoredChunk, StoredDocument } from './retrieval-store.js';

export interface ChunkRow {
  id: string;
  collection: string;
  doc_id: string;
  title: string;
  ord: number;
  text: string;
  tokens: number;
  locator: string | null;
  score: number;
}

export interface DocumentRow {
  collection: string;
  doc_id: string;
  title: string;
  bytes: string | number;
  metadata: Metadata;
  chunk_ids: (string | number)[];
}

/** The columns of a ChunkRow that ragguard_chunks `c` holds. */
export const CHUNK_TABLE_COLUMNS = 'c.id, c.collection, c.doc_id, c.ord, c.text, c.tokens, c.locator';
/** A ChunkRow's columns (but score) over chunks (or a set of their columns) `c` and documents `d`. */
export const CHUNK_COLUMNS = `${CHUNK_TABLE_COLUMNS}, d.title`;

export function toChunk(r: ChunkRow): StoredChunk {
  return {
    id: Number(r.id), collection: r.collection, docId: r.doc_id, title: r.title, ord: r.ord, text: r.text, tokens: r.tokens,
    ...(r.locator !== null ? { locator: r.locator } : {}),
  };
}

export function toDocument(r: DocumentRow): StoredDocument {
  return {
    collection: r.collection, docId: r.doc_id, title: r.title, bytes: Number(r.bytes), metadata: r.metadata,
    chunkIds: (r.chunk_ids ?? []).map(Number),
  };
}
