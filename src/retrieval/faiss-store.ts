/**
 * The embedded retrieval store: documents and chunk texts beside a faiss inner-product index over the
 * chunks' unit embeddings (so scores are cosine similarities), BM25 (lexical.ts) over the same chunks,
 * all in this process and persisted as one crash-safe snapshot per write.
 *
 * Chunk ids are stable: faiss's flat index compacts on removal (its labels are positions), so a table
 * maps positions to ids. A write builds the next state beside the live one (a copy of the index) and
 * swaps it in only once its snapshot is durable: a search sees one state or the other, and a failed
 * write leaves nothing. Filtered searches widen the flat (exact) search until k chunks pass the filter
 * or every vector was looked at, so top_k stays full.
 */
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import faiss from 'faiss-node';
import { LexicalIndex } from './lexical.js';
import {
  DEFAULT_COLLECTION, DocumentExistsError, metadataMatches,
  type Bm25Params, type Hit, type Metadata, type NewDocument, type RetrievalStore, type SearchFilter, type StoreCounts,
  type StoredChunk, type StoredDocument,
} from './retrieval-store.js';
import { decodeSections, decodeSnapshot, encodeSections, readSnapshotFile, writeFileAtomic, CorruptSnapshotError } from './snapshot.js';

export type { Hit, NewDocument, StoredChunk, StoredDocument } from './retrieval-store.js';

interface SnapshotMeta {
  version: 1;
  dimension: number;
  documents: DocumentRecord[];
  chunks: (ChunkRecord & { text: string })[];
}

/** As stored: what older snapshots lack (collection, metadata, title on chunks) is optional. */
type DocumentRecord = Omit<StoredDocument, 'collection' | 'metadata'> & { collection?: string; metadata?: Metadata };
type ChunkRecord = Omit<StoredChunk, 'text' | 'collection' | 'title'> & { collection?: string; title?: string };

/** Version 2's metadata section: the chunks without their texts (those are the text section), in index order. */
interface SectionMeta {
  version: 2;
  dimension: number;
  documents: DocumentRecord[];
  chunks: ChunkRecord[];
  /** The next chunk id (absent in older snapshots, whose ids are positions). */
  nextId?: number;
}

const SNAPSHOT = 'index.snapshot';
const collectionChunks = new WeakMap<object, Map<string, number>>();
const key = (collection: string, docId: string) => `${collection}\u0000${docId}`;

/** One state of the store: replaced whole by a write. */
interface State {
  docs: Map<string, StoredDocument>;
  chunks: Map<number, StoredChunk>;
  /** faiss position -> chunk id. */
  labels: number[];
  index: faiss.IndexFlatIP;
  nextId: number;
}

/** A write in progress: the next state, and what it changed (for the lexical index). */
interface Draft extends State {
  added: StoredChunk[];
  removed: number[];
  /** Positions to remove from the index, applied once (faiss compacts). */
  dropPositions: Set<number>;
  addRows: number[];
}

export class FaissStore implements RetrievalStore {
  readonly kind = 'faiss';
  private state: State;
  /** BM25 over the chunks: built at the first lexical search, then kept level with every write. */
  private lexical: LexicalIndex | undefined;
  private writeTail: Promise<unknown> = Promise.resolve();

  private constructor(
    readonly dir: string,
    readonly dimension: number,
    private readonly bm25: Bm25Params,
    state: State,
  ) {
    this.state = state;
  }

  /**
   * Opens the snapshot in `dir`, or an empty store when there is none. A damaged or truncated snapshot
   * throws CorruptSnapshotError naming the file and the section.
   */
  static async open(dir: string, dimension: number, bm25: Bm25Params = { k1: 1.2, b: 0.75 }): Promise<FaissStore> {
    await mkdir(dir, { recursive: true });
    const file = path.join(dir, SNAPSHOT);
    const buf = await readSnapshotFile(file);
    const empty: State = { docs: new Map(), chunks: new Map(), labels: [], index: new faiss.IndexFlatIP(dimension), nextId: 0 };
    if (!buf) return new FaissStore(dir, dimension, bm25, empty);
    const { documents, chunks, vectors, nextId } = readState(buf, file);
    if (documents.dimension !== dimension) {
      throw new Error(`${file} holds ${documents.dimension}-dimensional vectors but the embedder makes ${dimension}: ` +
        'point RAGGUARD_INDEX_DIR elsewhere or remove the snapshot to re-ingest');
    }
    let index: faiss.IndexFlatIP;
    try {
      index = faiss.IndexFlatIP.fromBuffer(vectors);
    } catch (e) {
      throw new CorruptSnapshotError(`${file}: section 'vectors' is not a faiss index (${(e as Error).message})`, file, 'vectors');
    }
    if (index.getDimension() !== dimension || index.ntotal() !== chunks.length) {
      throw new CorruptSnapshotError(`${file}: section 'vectors' holds ${index.ntotal()} vectors of ${index.getDimension()} for ${chunks.length} chunks of ${dimension}`, file, 'vectors');
    }
    const state: State = { docs: new Map(), chunks: new Map(), labels: [], index, nextId: 0 };
    for (const d of documents.list) {
      const collection = d.collection ?? DEFAULT_COLLECTION;
      state.docs.set(key(collection, d.docId), { ...d, collection, metadata: d.metadata ?? {} });
    }
    for (const c of chunks) {
      const collection = c.collection ?? DEFAULT_COLLECTION;
      const title = c.title ?? state.docs.get(key(collection, c.docId))?.title ?? c.docId;
      state.chunks.set(c.id, { ...c, collection, title });
      state.labels.push(c.id);
    }
    state.nextId = nextId ?? chunks.reduce((m, c) => Math.max(m, c.id + 1), 0);
    return new FaissStore(dir, dimension, bm25, state);
  }

  get documentCount(): number {
    return this.state.docs.size;
  }

  get chunkCount(): number {
    return this.state.labels.length;
  }

  /** Bytes of the index's vectors (flat: n x d float32). */
  get indexBytes(): number {
    return this.state.labels.length * this.dimension * 4;
  }

  get indexDetail(): string {
    return `${this.state.labels.length} vectors x ${this.dimension} float32 (faiss, exact)`;
  }

  has(docId: string, collection = DEFAULT_COLLECTION): boolean {
    return this.state.docs.has(key(collection, docId));
  }

  /** The document as stored now. */
  document(docId: string, collection = DEFAULT_COLLECTION): StoredDocument | undefined {
    return this.state.docs.get(key(collection, docId));
  }

  chunk(id: number): StoredChunk {
    const c = this.state.chunks.get(id);
    if (!c) throw new Error(`no chunk ${id}`);
    return c;
  }

  /** A page of every collection's documents, in the order they were added. */
  documents(offset: number, limit: number): StoredDocument[] {
    return [...this.state.docs.values()].slice(offset, offset + limit);
  }

  /** Every chunk, in index order. */
  allChunks(): StoredChunk[] {
    return this.state.labels.map((id) => this.state.chunks.get(id)!);
  }

  async counts(collection?: string): Promise<StoreCounts> {
    if (collection === undefined) return { documents: this.documentCount, chunks: this.chunkCount };
    let documents = 0;
    let chunks = 0;
    for (const d of this.state.docs.values()) {
      if (d.collection !== collection) continue;
      documents++;
      chunks += d.chunkIds.length;
    }
    return { documents, chunks };
  }

  async get(collection: string, docId: string): Promise<StoredDocument | undefined> {
    return this.document(docId, collection);
  }

  async list(collection: string, offset: number, limit: number): Promise<{ documents: StoredDocument[]; total: number }> {
    const out: StoredDocument[] = [];
    let total = 0;
    for (const d of this.state.docs.values()) {
      if (d.collection !== collection) continue;
      if (total++ >= offset && out.length < limit) out.push(d);
    }
    return { documents: out, total };
  }

  async chunksOf(collection: string, docId: string): Promise<StoredChunk[]> {
    const d = this.document(docId, collection);
    return d ? d.chunkIds.map((id) => this.chunk(id)) : [];
  }

  /** Adds the batch; visible (to search, counts, later snapshots) only once the snapshot holding it is durable. */
  addBatch(batch: readonly NewDocument[]): Promise<StoredDocument[]> {
    return this.write((draft) => {
      const seen = new Set<string>();
      for (const { doc } of batch) {
        const k = key(doc.collection ?? DEFAULT_COLLECTION, doc.docId);
        if (draft.docs.has(k) || seen.has(k)) throw new DocumentExistsError(doc.docId, doc.collection ?? DEFAULT_COLLECTION);
        seen.add(k);
      }
      return batch.map((d) => this.addTo(draft, d));
    });
  }

  /** Older name of addBatch. */
  addDurably(batch: readonly NewDocument[]): Promise<StoredDocument[]> {
    return this.addBatch(batch);
  }

  /** Replaces (or creates) each document of the batch, all in one snapshot. */
  replaceBatch(batch: readonly NewDocument[]): Promise<{ document: StoredDocument; replaced: boolean }[]> {
    return this.write((draft) => batch.map((d) => {
      const replaced = this.removeFrom(draft, d.doc.collection ?? DEFAULT_COLLECTION, d.doc.docId) !== undefined;
      return { document: this.addTo(draft, d), replaced };
    }));
  }

  remove(collection: string, docId: string): Promise<StoredDocument | undefined> {
    if (!this.has(docId, collection)) return Promise.resolve(undefined);
    return this.write((draft) => this.removeFrom(draft, collection, docId));
  }

  async searchDense(query: Float32Array, k: number, filter: SearchFilter): Promise<Hit[]> {
    return this.search(query, k, filter);
  }

  /** The k nearest chunks by cosine similarity that pass the filter (none: every chunk), best first. */
  search(query: Float32Array, k: number, filter?: SearchFilter): Hit[] {
    const { index, labels, chunks } = this.state;
    const total = labels.length;
    if (total === 0 || k <= 0) return [];
    const pass = this.passes(filter);
    if (pass === nothing) return [];
    const q = Array.from(query);
    // The flat index is exact: widening until k pass (or all were looked at) finds the filtered top k.
    for (let n = Math.min(k, total); ; n = Math.min(total, n * 4)) {
      const { distances, labels: found } = index.search(q, n);
      const hits: Hit[] = [];
      for (let i = 0; i < found.length && hits.length < k; i++) {
        const pos = found[i]!;
        if (pos < 0) continue;
        const chunk = chunks.get(labels[pos]!)!;
        if (pass(chunk)) hits.push({ chunk, score: distances[i]! });
      }
      if (hits.length >= k || n >= total || pass === everything) return hits;
    }
  }

  async searchLexical(query: string, k: number, filter: SearchFilter): Promise<Hit[]> {
    const lexical = this.lexicalIndex();
    const { chunks } = this.state;
    const pass = this.passes(filter);
    if (pass === nothing) return [];
    return lexical.search(query, k, pass === everything ? undefined : (id) => pass(chunks.get(id)!))
      .map((h) => ({ chunk: chunks.get(h.chunkId)!, score: h.score }));
  }

  /** Whether the BM25 index is built (the service builds it at start, not in a first query's turn). */
  get lexicalReady(): boolean {
    return this.lexical !== undefined;
  }

  /** The BM25 index, built now if this is the first lexical search (the service builds it at start). */
  lexicalIndex(): LexicalIndex {
    if (!this.lexical) {
      const lexical = new LexicalIndex(this.bm25);
      lexical.add(this.allChunks().map(lexicalEntry));
      this.lexical = lexical;
    }
    return this.lexical;
  }

  async close(): Promise<void> {
    await this.writeTail;
  }

  /** Writes the snapshot (a test may make it fail). */
  persist(buf: Buffer): Promise<void> {
    return writeFileAtomic(path.join(this.dir, SNAPSHOT), buf);
  }

  /** Chunks per collection, for the state searched now (counted once per state). */
  private collectionChunks(): Map<string, number> {
    let m = collectionChunks.get(this.state);
    if (!m) {
      m = new Map();
      for (const d of this.state.docs.values()) m.set(d.collection, (m.get(d.collection) ?? 0) + d.chunkIds.length);
      collectionChunks.set(this.state, m);
    }
    return m;
  }

  private passes(filter: SearchFilter | undefined): (c: StoredChunk) => boolean {
    if (!filter) return everything;
    const { collection, metadata } = filter;
    const { docs } = this.state;
    if (!metadata || Object.keys(metadata).length === 0) {
      const inCollection = this.collectionChunks().get(collection) ?? 0;
      if (inCollection === this.state.labels.length) return everything;
      if (inCollection === 0) return nothing;
      return (c) => c.collection === collection;
    }
    return (c) => {
      if (c.collection !== collection) return false;
      const d = docs.get(key(c.collection, c.docId));
      return d !== undefined && metadataMatches(d.metadata, metadata);
    };
  }

  /** Runs a write after the earlier ones: the next state is built, persisted, then swapped in. */
  private write<T>(change: (draft: Draft) => T): Promise<T> {
    const run = this.writeTail.then(async () => {
      const s = this.state;
      const draft: Draft = {
        docs: new Map(s.docs), chunks: new Map(s.chunks), labels: [...s.labels], index: s.index, nextId: s.nextId,
        added: [], removed: [], dropPositions: new Set(), addRows: [],
      };
      const out = change(draft);
      // The live index stays as it is until the write is durable: the change goes into a copy.
      const index = s.index.ntotal() > 0 ? faiss.IndexFlatIP.fromBuffer(s.index.toBuffer()) : new faiss.IndexFlatIP(this.dimension);
      if (draft.dropPositions.size > 0) {
        const n = index.removeIds([...draft.dropPositions]);
        if (n !== draft.dropPositions.size) throw new Error(`faiss removed ${n} vectors for ${draft.dropPositions.size} chunks`);
        draft.labels = draft.labels.filter((_, pos) => !draft.dropPositions.has(pos));
      }
      if (draft.addRows.length > 0) index.add(draft.addRows);
      draft.labels.push(...draft.added.map((c) => c.id));
      draft.index = index;
      await this.persist(encodeState(this.dimension, draft));
      this.state = { docs: draft.docs, chunks: draft.chunks, labels: draft.labels, index, nextId: draft.nextId };
      if (this.lexical) {
        this.lexical.remove(draft.removed);
        this.lexical.add(draft.added.map(lexicalEntry));
      }
      return out;
    });
    this.writeTail = run.catch(() => undefined);
    return run;
  }

  private addTo(draft: Draft, { doc, chunks, vectors }: NewDocument): StoredDocument {
    const collection = doc.collection ?? DEFAULT_COLLECTION;
    if (vectors.length !== chunks.length * this.dimension) throw new Error('one embedding per chunk expected');
    const first = draft.nextId;
    draft.nextId += chunks.length;
    const stored: StoredDocument = {
      collection, docId: doc.docId, title: doc.title, bytes: doc.bytes, metadata: { ...doc.metadata },
      chunkIds: chunks.map((_, i) => first + i),
    };
    chunks.forEach((c, ord) => {
      const chunk: StoredChunk = {
        id: first + ord, collection, docId: doc.docId, title: doc.title, ord, text: c.text, tokens: c.tokens,
        ...(c.locator !== undefined ? { locator: c.locator } : {}),
      };
      draft.chunks.set(chunk.id, chunk);
      draft.added.push(chunk);
    });
    for (const v of vectors) draft.addRows.push(v);
    draft.docs.set(key(collection, doc.docId), stored);
    return stored;
  }

  private removeFrom(draft: Draft, collection: string, docId: string): StoredDocument | undefined {
    const k = key(collection, docId);
    const doc = draft.docs.get(k);
    if (!doc) return undefined;
    draft.docs.delete(k);
    const gone = new Set(doc.chunkIds);
    // Chunks of this write itself (a replacement of a document added by the same batch) are not in the index yet.
    const pending = draft.added.filter((c) => gone.has(c.id));
    if (pending.length > 0) throw new Error(`document '${docId}' appears twice in one batch`);
    draft.labels.forEach((id, pos) => {
      if (gone.has(id)) draft.dropPositions.add(pos);
    });
    for (const id of gone) draft.chunks.delete(id);
    draft.removed.push(...gone);
    return doc;
  }
}

const everything = (): boolean => true;
const nothing = (): boolean => false;

/** What BM25 indexes of a chunk: "title\ntext", what the embedder sees. */
const lexicalEntry = (c: StoredChunk) => ({ id: c.id, text: `${c.title}\n${c.text}` });

/** Sections: metadata (documents, chunks without texts), text (the chunks' texts), vectors (faiss's bytes). */
function encodeState(dimension: number, s: State): Buffer {
  const chunks = s.labels.map((id) => s.chunks.get(id)!);
  const meta: SectionMeta = {
    version: 2, dimension, documents: [...s.docs.values()], nextId: s.nextId,
    chunks: chunks.map(({ text: _text, ...c }) => c),
  };
  return encodeSections([
    ['metadata', Buffer.from(JSON.stringify(meta))],
    ['text', Buffer.from(JSON.stringify(chunks.map((c) => c.text)))],
    ['vectors', s.index.toBuffer()],
  ]);
}

function readState(buf: Buffer, file: string): { documents: { dimension: number; list: DocumentRecord[] }; chunks: (ChunkRecord & { text: string })[]; vectors: Buffer; nextId?: number } {
  const sections = decodeSections(buf, file);
  if (!sections) {
    // Version 1: no checksums to verify (written before they existed).
    const { meta, payload } = decodeSnapshot<SnapshotMeta>(buf, file);
    if (meta.version !== 1) throw new CorruptSnapshotError(`${file}: unknown snapshot version ${String(meta.version)}`, file, 'metadata');
    return { documents: { dimension: meta.dimension, list: meta.documents }, chunks: meta.chunks, vectors: payload };
  }
  const need = (name: string) => {
    const b = sections.get(name);
    if (!b) throw new CorruptSnapshotError(`${file} has no '${name}' section`, file, name);
    return b;
  };
  const json = <T>(name: string): T => {
    try {
      return JSON.parse(need(name).toString('utf8')) as T;
    } catch (e) {
      if (e instanceof CorruptSnapshotError) throw e;
      throw new CorruptSnapshotError(`${file}: section '${name}' is not readable JSON`, file, name);
    }
  };
  const meta = json<SectionMeta>('metadata');
  if (meta.version !== 2) throw new CorruptSnapshotError(`${file}: unknown snapshot version ${String(meta.version)}`, file, 'metadata');
  const texts = json<string[]>('text');
  if (!Array.isArray(texts) || texts.length !== meta.chunks.length) {
    throw new CorruptSnapshotError(`${file}: section 'text' holds ${texts?.length} texts for ${meta.chunks.length} chunks`, file, 'text');
  }
  return {
    documents: { dimension: meta.dimension, list: meta.documents },
    chunks: meta.chunks.map((c, i) => ({ ...c, text: texts[i]! })),
    vectors: need('vectors'),
    nextId: meta.nextId,
  };
}
