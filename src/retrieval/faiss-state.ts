/**
 * The faiss store's state (faiss-store.ts): documents, chunks, the position table and the index, with the
 * running count of bytes its objects take. One state is live; a small store's write builds the next one
 * beside it (copyState).
 */
import type { StoreCounts, SearchFilter, StoredChunk, StoredDocument } from './retrieval-store.js';
import { CollectionVectors, collectionVectorsFrom } from './faiss-collections.js';
import { PositionTable, Selections } from './positions.js';
import { VectorIndex } from './vector-index.js';

/** Predicted bytes of a chunk's lexical postings per token, and of its objects (chunk, ids, map entries). */
const POSTING_BYTES = 24;
const CHUNK_OBJECT_BYTES = 256;
/** A document's object, map entry and arrays besides its title, metadata and chunk ids. */
const DOCUMENT_OBJECT_BYTES = 256;

export const key = (collection: string, docId: string) => `${collection}\u0000${docId}`;

/** One state of the store. */
export interface State {
  docs: Map<string, StoredDocument>;
  chunks: Map<number, StoredChunk>;
  table: PositionTable;
  index: VectorIndex;
  nextId: number;
  collections: Map<string, StoreCounts>;
  /** Predicted bytes of the documents and chunks as JS objects (texts, postings, ids). */
  objectBytes: number;
  /** Bitmaps of recent filters, kept level with every write. */
  selections: Selections<SearchFilter>;
  /** Each collection's vectors in an exact index of their own, by chunk id (faiss-collections.ts). */
  byCollection: Map<string, CollectionVectors>;
  /** While the log is replayed: vectors for the index, added at the end. */
  pending?: Float32Array[];
}

export function emptyState(dimension: number): State {
  return {
    docs: new Map(), chunks: new Map(), table: PositionTable.empty(), index: VectorIndex.flat(dimension), nextId: 0,
    collections: new Map(), objectBytes: 0, selections: new Selections(), byCollection: new Map(),
  };
}

/** The next state of a small store's write: the live one stays as it is until the write is durable. */
export function copyState(s: State): State {
  return {
    docs: new Map(s.docs), chunks: new Map(s.chunks), table: s.table.copy(), index: s.index.clone(), nextId: s.nextId,
    collections: new Map([...s.collections].map(([c, n]) => [c, { ...n }])), objectBytes: s.objectBytes, selections: new Selections(),
    byCollection: new Map([...s.byCollection].map(([c, v]) => [c, v.clone()])),
  };
}

/** Each collection's own vectors made from the store-wide index (a loaded snapshot's state, before its log's replay). */
export function groupByCollection(s: State): void {
  s.byCollection = collectionVectorsFrom(s.index, s.table.size, (p) => s.table.idAt(p), (id) => s.chunks.get(id)!.collection);
}

/** Bytes of the collections' own vectors. */
export function collectionVectorBytes(s: State): number {
  let n = 0;
  for (const v of s.byCollection.values()) n += v.bytes;
  return n;
}

/** An exact index without its removed vectors (positions move down; ids stay). */
export function dropTombstones(s: State): void {
  const kept = s.table.livePositions();
  s.index = VectorIndex.flatOf(s.index.dimension, s.index.vectorsAt(kept));
  s.table = s.table.remap(kept, new Int32Array(0));
  s.selections.clear();
}

// eslint-disable-next-line no-control-regex
const LATIN1 = /^[\u0000-\u00ff]*$/;

/** V8 holds a Latin-1 string at a byte a character, others at two. */
const stringBytes = (s: string) => s.length * (LATIN1.test(s) ? 1 : 2);

export function chunkObjectBytes(c: StoredChunk): number {
  return stringBytes(c.text) + (c.locator?.length ?? 0) * 2 + c.tokens * POSTING_BYTES + CHUNK_OBJECT_BYTES;
}

export function documentObjectBytes(d: StoredDocument): number {
  return DOCUMENT_OBJECT_BYTES + stringBytes(d.docId) + stringBytes(d.title) + JSON.stringify(d.metadata).length * 2 + d.chunkIds.length * 8;
}

export function countIn(s: State, collection: string, documents: number, chunks: number): void {
  const n = s.collections.get(collection) ?? { documents: 0, chunks: 0 };
  n.documents += documents;
  n.chunks += chunks;
  if (n.documents === 0) s.collections.delete(collection);
  else s.collections.set(collection, n);
}

export function concat(parts: readonly Float32Array[]): Float32Array {
  if (parts.length === 1) return parts[0]!;
  if (parts.length === 0) return new Float32Array(0);
  const out = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

export function liveChunks(s: State): StoredChunk[] {
  const out: StoredChunk[] = [];
  for (let p = 0; p < s.table.size; p++) {
    const id = s.table.idAt(p);
    if (id >= 0) out.push(s.chunks.get(id)!);
  }
  return out;
}
