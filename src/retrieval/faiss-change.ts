/**
 * A write to the faiss store as one change (faiss-store.ts): what the write log records, and what both the
 * live write and the replay of the log apply to a state.
 */
import {
  DEFAULT_COLLECTION, metadataMatches, type Metadata, type NewDocument, type StoredChunk, type StoredDocument,
} from './retrieval-store.js';
import { CollectionVectors } from './faiss-collections.js';
import { chunkObjectBytes, concat, countIn, documentObjectBytes, key, type State } from './faiss-state.js';
import type { LogRecord } from './write-log.js';

/** A document as a log record carries it: its chunk ids are given (the first; they follow on). */
export interface LoggedDocument {
  collection: string;
  docId: string;
  title: string;
  bytes: number;
  metadata: Metadata;
  firstId: number;
  chunks: { text: string; tokens: number; locator?: string }[];
}

/** One write: what the log records and what both the live write and the replay apply. */
export type Change =
  | { op: 'add' | 'replace'; docs: LoggedDocument[] }
  | { op: 'remove'; collection: string; docId: string };

export interface Applied {
  documents: StoredDocument[];
  replaced: boolean[];
  removed: StoredDocument | undefined;
  addedChunks: StoredChunk[];
  /** The chunks a write removed, with their collections (the lexical side is per collection). */
  removedChunks: { id: number; collection: string }[];
}

/** The batch as log records carry it, chunk ids given from the next free one. */
export function loggedBatch(batch: readonly NewDocument[], nextId: number, dimension: number): LoggedDocument[] {
  let next = nextId;
  return batch.map(({ doc, chunks, vectors }) => {
    if (vectors.length !== chunks.length * dimension) throw new Error('one embedding per chunk expected');
    const firstId = next;
    next += chunks.length;
    return {
      collection: doc.collection ?? DEFAULT_COLLECTION, docId: doc.docId, title: doc.title, bytes: doc.bytes,
      metadata: { ...doc.metadata }, firstId,
      chunks: chunks.map((c) => ({ text: c.text, tokens: c.tokens, ...(c.locator !== undefined ? { locator: c.locator } : {}) })),
    };
  });
}

export function noChange(): Applied {
  return { documents: [], replaced: [], removed: undefined, addedChunks: [], removedChunks: [] };
}

function addDocument(s: State, d: LoggedDocument, vectors: Float32Array): StoredDocument {
  if (d.firstId < s.nextId) throw new Error(`chunk id ${d.firstId} was given before (next is ${s.nextId})`);
  const ids = d.chunks.map((_, i) => d.firstId + i);
  const stored: StoredDocument = { collection: d.collection, docId: d.docId, title: d.title, bytes: d.bytes, metadata: d.metadata, chunkIds: ids };
  const first = s.table.append(ids);
  let own = s.byCollection.get(d.collection);
  if (!own) s.byCollection.set(d.collection, (own = CollectionVectors.empty(s.index.dimension)));
  own.add(ids, vectors);
  if (s.pending) {
    s.pending.push(vectors);
  } else {
    s.index.add(vectors);
    if (s.index.size !== s.table.size) throw new Error(`the index holds ${s.index.size} vectors for ${s.table.size} positions`);
  }
  d.chunks.forEach((c, ord) => {
    const chunk: StoredChunk = {
      id: ids[ord]!, collection: d.collection, docId: d.docId, title: d.title, ord, text: c.text, tokens: c.tokens,
      ...(c.locator !== undefined ? { locator: c.locator } : {}),
    };
    s.chunks.set(chunk.id, chunk);
    s.objectBytes += chunkObjectBytes(chunk);
    s.selections.added(first + ord, (f) => f.collection === d.collection && metadataMatches(d.metadata, f.metadata));
  });
  s.docs.set(key(d.collection, d.docId), stored);
  s.objectBytes += documentObjectBytes(stored);
  s.nextId = d.firstId + ids.length;
  countIn(s, d.collection, 1, ids.length);
  return stored;
}

function removeDocument(s: State, collection: string, docId: string, removed: { id: number; collection: string }[]): StoredDocument | undefined {
  const k = key(collection, docId);
  const doc = s.docs.get(k);
  if (!doc) return undefined;
  s.docs.delete(k);
  s.objectBytes -= documentObjectBytes(doc);
  const own = s.byCollection.get(collection);
  if (own) {
    own.remove(new Set(doc.chunkIds));
    if (own.size === 0) s.byCollection.delete(collection);
  }
  for (const id of doc.chunkIds) {
    const p = s.table.positionOf(id);
    if (p >= 0) {
      s.table.kill(p);
      s.selections.removed(p);
    }
    const c = s.chunks.get(id);
    if (c) s.objectBytes -= chunkObjectBytes(c);
    s.chunks.delete(id);
    removed.push({ id, collection });
  }
  countIn(s, collection, -1, -doc.chunkIds.length);
  return doc;
}

/** Applies a change to a state, in one synchronous step. */
export function apply(s: State, change: Change, vectors: Float32Array, dimension: number): Applied {
  const out = noChange();
  if (change.op === 'remove') {
    out.removed = removeDocument(s, change.collection, change.docId, out.removedChunks);
    return out;
  }
  let at = 0;
  for (const d of change.docs) {
    const n = d.chunks.length * dimension;
    const was = change.op === 'replace' ? removeDocument(s, d.collection, d.docId, out.removedChunks) : undefined;
    const stored = addDocument(s, d, vectors.subarray(at, at + n));
    at += n;
    out.documents.push(stored);
    out.replaced.push(was !== undefined);
    for (const id of stored.chunkIds) out.addedChunks.push(s.chunks.get(id)!);
  }
  if (at !== vectors.length) throw new Error(`${vectors.length / dimension} vectors for ${at / dimension} chunks`);
  return out;
}

export function concatVectors(batch: readonly NewDocument[], dimension: number): Float32Array {
  for (const d of batch) if (d.vectors.length !== d.chunks.length * dimension) throw new Error('one embedding per chunk expected');
  return concat(batch.map((d) => d.vectors));
}

/** A log record's body: u32 LE length of the change's JSON | the JSON | the vectors (float32, little-endian). */
export function encodeChange(change: Change, vectors: Float32Array): Buffer {
  const json = Buffer.from(JSON.stringify(change));
  const len = Buffer.alloc(4);
  len.writeUInt32LE(json.length);
  return Buffer.concat([len, json, Buffer.from(vectors.buffer, vectors.byteOffset, vectors.byteLength)]);
}

export function replay(s: State, r: LogRecord, dimension: number): void {
  const n = r.body.readUInt32LE(0);
  const change = JSON.parse(r.body.subarray(4, 4 + n).toString('utf8')) as Change;
  const raw = r.body.subarray(4 + n);
  // A copy: the record's bytes need not be aligned for a Float32Array view.
  const vectors = new Float32Array(Uint8Array.from(raw).buffer);
  apply(s, change, vectors, dimension);
}
