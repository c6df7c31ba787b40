/**
 * Search in the faiss store's state (faiss-store.ts): a filter as a bitmap of positions applied inside
 * faiss's search (so top_k stays full), or as a test of a chunk for BM25; a narrow filter is searched
 * exactly, over its collection's own vectors (faiss-collections.ts), so that its cost follows the
 * collection and not the store.
 */
import type { CollectionVectors } from './faiss-collections.js';
import { Bitmap } from './positions.js';
import { metadataMatches, type Hit, type SearchFilter, type StoredChunk } from './retrieval-store.js';
import { key, type State } from './faiss-state.js';
import { embeddingText } from './corpus.js';

/** A filter passing under this share of the positions is searched exactly (the graph would walk mostly past it). */
const EXACT_SHARE = 0.1;
/** Candidates of a filtered HNSW search grow as the filter narrows, up to this many times efSearch. */
const MAX_EF_FACTOR = 10;

export const everything = (): boolean => true;
export const nothing = (): boolean => false;

/** What BM25 indexes of a chunk: "title\ntext", what the embedder sees. */
export const lexicalEntry = (c: StoredChunk) => ({ id: c.id, collection: c.collection, text: embeddingText(c.title, c.text) });

/** The k nearest chunks by cosine similarity that pass the filter (none: every chunk), best first. */
export function searchState(s: State, opts: { annMin: number; efSearch: number }, query: Float32Array, k: number, filter?: SearchFilter): Hit[] {
  if (k <= 0 || s.table.liveCount === 0) return [];
  if (filter) {
    const own = s.byCollection.get(filter.collection);
    if (!own) return [];
    // Where the store-wide index would be searched exactly for this filter (an exact index, or a narrow
    // filter), the collection's own vectors are: the same exact answer at the collection's cost. A
    // collection that is the whole store, or a large part of it, goes through the store-wide graph.
    const n = own.size;
    if (n < s.table.liveCount && (s.index.kind === 'flat' || n < opts.annMin || n / s.table.size < EXACT_SHARE)) {
      return searchOwn(s, own, query, k, filter);
    }
  }
  const sel = selection(s, filter);
  if (sel.count === 0) return [];
  const want = Math.min(k, sel.count);
  const allow = sel.bits;
  let found: { positions: number[]; scores: number[] } | undefined;
  if (s.index.kind === 'flat') {
    found = s.index.search(query, want, { allow });
  } else {
    const share = sel.count / s.table.size;
    const exact = sel.count < opts.annMin || share < EXACT_SHARE;
    if (!exact) {
      // The graph walks past positions the bitmap leaves out: more candidates as the filter narrows.
      const efSearch = Math.min(opts.efSearch * MAX_EF_FACTOR, Math.max(opts.efSearch, want, Math.ceil(opts.efSearch / share)));
      found = s.index.search(query, want, { allow, efSearch });
    }
    // A narrow filter, or a graph search that came up short: every allowed vector.
    if (!found || found.positions.length < want) found = s.index.search(query, want, { allow, exact: true });
  }
  const hits: Hit[] = [];
  const { positions, scores } = found;
  positions.forEach((p, i) => {
    const chunk = s.chunks.get(s.table.idAt(p));
    if (chunk) hits.push({ chunk, score: scores[i]! });
  });
  return hits;
}

/** An exact search of a collection's own vectors, its metadata conditions a bitmap over its slots. */
function searchOwn(s: State, own: CollectionVectors, query: Float32Array, k: number, filter: SearchFilter): Hit[] {
  let allow: Bitmap | undefined;
  let count = own.size;
  if (filter.metadata && Object.keys(filter.metadata).length > 0) {
    allow = new Bitmap(own.size);
    own.slots.forEach((id, slot) => {
      const c = s.chunks.get(id);
      const d = c && s.docs.get(key(c.collection, c.docId));
      if (d && metadataMatches(d.metadata, filter.metadata)) allow!.set(slot);
    });
    count = allow.count;
  }
  if (count === 0) return [];
  const { ids, scores } = own.search(query, Math.min(k, count), allow);
  const hits: Hit[] = [];
  ids.forEach((id, i) => {
    const chunk = s.chunks.get(id);
    if (chunk) hits.push({ chunk, score: scores[i]! });
  });
  return hits;
}

/** The chunks a filter lets through, as a bitmap over positions (undefined: every position) and their count. */
function selection(s: State, filter: SearchFilter | undefined): { bits?: Uint8Array; count: number } {
  const everyLive = () => (s.table.tombstones === 0 ? { count: s.table.liveCount } : { bits: s.table.live.bytes, count: s.table.liveCount });
  if (!filter) return everyLive();
  const inCollection = s.collections.get(filter.collection)?.chunks ?? 0;
  if (inCollection === 0) return { count: 0 };
  const conditions = Object.entries(filter.metadata ?? {}).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  if (conditions.length === 0 && inCollection === s.table.liveCount) return everyLive();
  const bits = s.selections.get(JSON.stringify([filter.collection, conditions]), filter, () => {
    const b = new Bitmap(s.table.size);
    for (const d of s.docs.values()) {
      if (d.collection !== filter.collection || !metadataMatches(d.metadata, filter.metadata)) continue;
      for (const id of d.chunkIds) {
        const p = s.table.positionOf(id);
        if (p >= 0) b.set(p);
      }
    }
    return b;
  });
  return { bits: bits.bytes, count: bits.count };
}

/** Whether a chunk passes the filter (everything, nothing, or a test of it). */
export function passes(s: State, filter: SearchFilter | undefined): (c: StoredChunk) => boolean {
  if (!filter) return everything;
  const { collection, metadata } = filter;
  if (!metadata || Object.keys(metadata).length === 0) {
    const inCollection = s.collections.get(collection)?.chunks ?? 0;
    if (inCollection === s.table.liveCount) return everything;
    if (inCollection === 0) return nothing;
    return (c) => c.collection === collection;
  }
  return (c) => {
    if (c.collection !== collection) return false;
    const d = s.docs.get(key(c.collection, c.docId));
    return d !== undefined && metadataMatches(d.metadata, metadata);
  };
}
