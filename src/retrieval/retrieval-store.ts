/**
 * What the service reads and writes retrieval state through: documents (in collections, with metadata),
 * their chunks, the chunks' unit embeddings (dense search by cosine) and the lexical side (BM25 over
 * "title\ntext"). Two implementations: faiss + BM25 in this process (faiss-store.ts, the embedded default)
 * and PostgreSQL with pgvector, shared by any number of replicas (postgres-store.ts).
 *
 * A document is named by its collection and its id. Every search runs inside one collection, and the
 * metadata filter is applied inside the search (not to its results), so a filtered search still returns
 * top_k hits where that many match. Writes are atomic: a batch is visible whole or not at all.
 */

import { BusyError } from '../runtime/errors.js';

export type MetadataValue = string | number | boolean;
export type Metadata = Record<string, MetadataValue>;

export const DEFAULT_COLLECTION = 'default';

export interface StoredDocument {
  collection: string;
  docId: string;
  title: string;
  bytes: number;
  metadata: Metadata;
  /** Ids of its chunks, in document order. */
  chunkIds: number[];
}

export interface StoredChunk {
  /** Stable while the chunk exists (never reused for another chunk by the same store). */
  id: number;
  collection: string;
  docId: string;
  /** Its document's title (citations carry it; a hit stays citable after its document is removed). */
  title: string;
  /** Position of the chunk inside its document. */
  ord: number;
  text: string;
  tokens: number;
  /** Where in the source the chunk comes from (a page, a section), when the ingest knows. */
  locator?: string;
}

export interface Hit {
  chunk: StoredChunk;
  /** Cosine similarity to the query (dense) or BM25 score (lexical). */
  score: number;
}

/** One document of a batch: its chunks and their unit embeddings (row-major, one row per chunk). */
export interface NewDocument {
  doc: { docId: string; title: string; bytes: number; collection?: string; metadata?: Metadata };
  chunks: readonly { text: string; tokens: number; locator?: string }[];
  vectors: Float32Array;
}

/** A metadata field's condition: equal to the value, or to one of the values. */
export type FieldCondition = MetadataValue | { in: readonly MetadataValue[] };

/** Which chunks a search may return: one collection, and documents whose metadata meets every condition. */
export interface SearchFilter {
  collection: string;
  metadata?: Readonly<Record<string, FieldCondition>>;
}

export interface StoreCounts {
  documents: number;
  chunks: number;
}

export interface Bm25Params {
  k1: number;
  b: number;
}

export class DocumentExistsError extends Error {
  constructor(readonly docId: string, readonly collection: string = DEFAULT_COLLECTION) {
    super(collection === DEFAULT_COLLECTION ? `document '${docId}' already exists` : `document '${docId}' already exists in collection '${collection}'`);
  }
}

/**
 * The store cannot answer now (its database does not accept connections, a connection broke, a statement
 * ran past its timeout): not a bug of the request, and likely to pass. A BusyError with the code
 * `store_unavailable` (the HTTP reply: 503 with Retry-After).
 */
export class StoreUnavailableError extends BusyError {
  constructor(message: string, retryAfterSeconds = 2, options?: { cause?: unknown }) {
    super('store_unavailable', message, retryAfterSeconds);
    if (options && 'cause' in options) (this as { cause?: unknown }).cause = options.cause;
  }
}

export interface RetrievalStore {
  readonly kind: 'faiss' | 'postgres';
  readonly dimension: number;
  /** Bytes of index this process holds (faiss: every vector; Postgres: 0, the index lives in the server). */
  readonly indexBytes: number;
  /** How indexBytes is made up, for /debug/memory. */
  readonly indexDetail: string;
  /**
   * Bytes this process holds for the stored documents, predicted from their sizes and kept as a running
   * total (faiss: the index, the chunks' objects and texts, lexical postings; Postgres: 0). Growth by
   * this much is the store growing, not a leak (growth.ts).
   */
  readonly residentBytes: number;

  /** Documents and chunks, in one collection or in all. */
  counts(collection?: string): Promise<StoreCounts>;
  /** The document as stored now (a removed one is undefined). */
  get(collection: string, docId: string): Promise<StoredDocument | undefined>;
  /** A page of a collection's documents in the order they were added, and the collection's total. */
  list(collection: string, offset: number, limit: number): Promise<{ documents: StoredDocument[]; total: number }>;
  /** The document's chunks in order (empty when there is no such document). */
  chunksOf(collection: string, docId: string): Promise<StoredChunk[]>;

  /** Adds the batch atomically and durably; DocumentExistsError (and nothing added) when one exists. */
  addBatch(batch: readonly NewDocument[]): Promise<StoredDocument[]>;
  /** Replaces each document (or creates it), all in one atomic write: says which, in order. */
  replaceBatch(batch: readonly NewDocument[]): Promise<{ document: StoredDocument; replaced: boolean }[]>;
  /** Removes the document and its chunks; undefined when there is none. */
  remove(collection: string, docId: string): Promise<StoredDocument | undefined>;

  /** The k chunks nearest to the unit vector by cosine that pass the filter, best first. */
  searchDense(query: Float32Array, k: number, filter: SearchFilter): Promise<Hit[]>;
  /** The k best chunks by BM25 that pass the filter, best first (ties: lower id); no shared term, no hit. */
  searchLexical(query: string, k: number, filter: SearchFilter): Promise<Hit[]>;

  /**
   * Whether the store answers now, and why not (Postgres: a trivial statement on a pooled connection;
   * the embedded store has no such method: it is in this process). For readiness probes.
   */
  ready?(): Promise<{ ok: true } | { ok: false; reason: string }>;

  close(): Promise<void>;
}

/** Whether a document's metadata meets every condition of the filter. */
export function metadataMatches(metadata: Metadata, conditions: SearchFilter['metadata']): boolean {
  if (!conditions) return true;
  for (const [field, cond] of Object.entries(conditions)) {
    if (!Object.hasOwn(metadata, field)) return false;
    const v = metadata[field];
    if (typeof cond === 'object') {
      if (!cond.in.some((x) => x === v)) return false;
    } else if (v !== cond) return false;
  }
  return true;
}
