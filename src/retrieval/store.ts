/**
 * The document store: chunk texts and metadata beside a faiss inner-product index over their unit
 * embeddings (so scores are cosine similarities). Faiss labels are chunk ids: chunks are only ever
 * appended, so label i is chunks[i].
 */
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import faiss from 'faiss-node';
import { decodeSections, decodeSnapshot, encodeSections, readSnapshotFile, writeFileAtomic, CorruptSnapshotError } from './snapshot.js';

export interface StoredDocument {
  docId: string;
  title: string;
  /** Ids of its chunks, in document order. */
  chunkIds: number[];
  bytes: number;
  /** What the source file said of itself (author, subject, its file name...); absent for plain text. */
  metadata?: Record<string, string>;
}

export interface StoredChunk {
  id: number;
  docId: string;
  /** Position of the chunk inside its document. */
  ord: number;
  text: string;
  tokens: number;
  /** Where in its document the chunk starts ("page 3", "section: Install > Linux"); absent when the source has no pages or headings. */
  locator?: string;
}

export interface Hit {
  chunk: StoredChunk;
  /** Cosine similarity to the query. */
  score: number;
}

interface SnapshotMeta {
  version: 1;
  dimension: number;
  documents: StoredDocument[];
  chunks: StoredChunk[];
}

/** Version 2's metadata section: the chunks without their texts (those are the text section). */
interface SectionMeta {
  version: 2;
  dimension: number;
  documents: StoredDocument[];
  chunks: Omit<StoredChunk, 'text'>[];
}

/** One document of a batch: its chunks and their unit embeddings (row-major, one row per chunk). */
export interface NewDocument {
  doc: NewDocumentInfo;
  chunks: readonly NewChunk[];
  vectors: Float32Array;
}

export type NewDocumentInfo = Omit<StoredDocument, 'chunkIds'>;
export type NewChunk = Pick<StoredChunk, 'text' | 'tokens' | 'locator'>;

/** A stored chunk; an absent locator stays absent (snapshots written before locators existed read the same). */
function storedChunk(id: number, docId: string, ord: number, c: NewChunk): StoredChunk {
  return { id, docId, ord, text: c.text, tokens: c.tokens, ...(c.locator === undefined ? {} : { locator: c.locator }) };
}

const SNAPSHOT = 'index.snapshot';
const REMEMBERED = 1024;

export class DocumentStore {
  // Replaced whole when a batch commits (addDurably), so a search sees one state or the other.
  private docs = new Map<string, StoredDocument>();
  private chunkList: StoredChunk[] = [];
  /**
   * Documents removed lately, by id: a query that found a chunk before its document was removed
   * still resolves the document's title (document() falls back here). Bounded: the last REMEMBERED.
   */
  private readonly removed = new Map<string, StoredDocument>();

  private constructor(
    readonly dir: string,
    readonly dimension: number,
    private index: faiss.IndexFlatIP,
  ) {}

  /**
   * Opens the snapshot in `dir`, or an empty store when there is none. A damaged or truncated snapshot
   * throws CorruptSnapshotError naming the file and the section.
   */
  static async open(dir: string, dimension: number): Promise<DocumentStore> {
    await mkdir(dir, { recursive: true });
    const file = path.join(dir, SNAPSHOT);
    const buf = await readSnapshotFile(file);
    if (!buf) return new DocumentStore(dir, dimension, new faiss.IndexFlatIP(dimension));
    const { documents, chunks, vectors } = readState(buf, file);
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
    const store = new DocumentStore(dir, dimension, index);
    for (const d of documents.list) store.docs.set(d.docId, d);
    store.chunkList.push(...chunks);
    return store;
  }

  get documentCount(): number {
    return this.docs.size;
  }

  get chunkCount(): number {
    return this.chunkList.length;
  }

  has(docId: string): boolean {
    return this.docs.has(docId);
  }

  document(docId: string): StoredDocument | undefined {
    return this.docs.get(docId) ?? this.removed.get(docId);
  }

  /** A document in the store now (never a removed one). */
  stored(docId: string): StoredDocument | undefined {
    return this.docs.get(docId);
  }

  /** A page of the documents, in the order they were added. */
  documents(offset: number, limit: number): StoredDocument[] {
    const out: StoredDocument[] = [];
    let i = 0;
    for (const d of this.docs.values()) {
      if (i++ < offset) continue;
      if (out.length === limit) break;
      out.push(d);
    }
    return out;
  }

  /**
   * Removes a document, its chunks and their vectors; in memory only. Faiss's flat index compacts on
   * removal (remove_ids keeps the others in order), so the chunks after the removed ones move down:
   * they are renumbered to stay at their labels (new objects: a query holding the old ones keeps them).
   */
  remove(docId: string): StoredDocument | undefined {
    const doc = this.docs.get(docId);
    if (!doc) return undefined;
    const gone = new Set(doc.chunkIds);
    if (gone.size > 0) {
      const n = this.index.removeIds([...gone]);
      if (n !== gone.size) throw new Error(`faiss removed ${n} vectors of document '${docId}' for its ${gone.size} chunks`);
    }
    this.docs.delete(docId);
    const kept = this.chunkList.filter((c) => !gone.has(c.id));
    const moved = new Map<number, number>();
    this.chunkList.length = 0;
    kept.forEach((c, id) => {
      if (c.id !== id) moved.set(c.id, id);
      this.chunkList.push(c.id === id ? c : { ...c, id });
    });
    if (moved.size > 0) {
      for (const [id, d] of this.docs) {
        if (d.chunkIds.some((c) => moved.has(c))) this.docs.set(id, { ...d, chunkIds: d.chunkIds.map((c) => moved.get(c) ?? c) });
      }
    }
    this.removed.delete(docId);
    this.removed.set(docId, doc);
    if (this.removed.size > REMEMBERED) this.removed.delete(this.removed.keys().next().value!);
    return doc;
  }

  /**
   * Runs a change (add, remove) and persists the store; if the change or the write fails, the store
   * is put back as it was, so memory never holds what the snapshot does not.
   */
  async transact<T>(change: () => T): Promise<T> {
    const before = { index: this.index.toBuffer(), docs: new Map(this.docs), chunks: [...this.chunkList], removed: new Map(this.removed) };
    try {
      const out = change();
      await this.persist();
      return out;
    } catch (e) {
      this.index = faiss.IndexFlatIP.fromBuffer(before.index);
      this.docs.clear();
      for (const [k, v] of before.docs) this.docs.set(k, v);
      this.chunkList.length = 0;
      this.chunkList.push(...before.chunks);
      this.removed.clear();
      for (const [k, v] of before.removed) this.removed.set(k, v);
      throw e;
    }
  }

  chunk(id: number): StoredChunk {
    const c = this.chunkList[id];
    if (!c) throw new Error(`no chunk ${id}`);
    return c;
  }

  /** Bytes of the index's vectors (flat: n x d float32). */
  get indexBytes(): number {
    return this.chunkList.length * this.dimension * 4;
  }

  /** Adds a document's chunks and their unit embeddings (row-major, one row per chunk); in memory only. */
  add(doc: NewDocumentInfo, chunks: readonly NewChunk[], vectors: Float32Array): StoredDocument {
    if (this.docs.has(doc.docId)) throw new Error(`document '${doc.docId}' exists`);
    if (vectors.length !== chunks.length * this.dimension) throw new Error('one embedding per chunk expected');
    const first = this.chunkList.length;
    const stored: StoredDocument = { ...doc, chunkIds: chunks.map((_, i) => first + i) };
    if (chunks.length > 0) this.index.add(Array.from(vectors));
    chunks.forEach((c, ord) => this.chunkList.push(storedChunk(first + ord, doc.docId, ord, c)));
    this.docs.set(doc.docId, stored);
    return stored;
  }

  /** The k nearest chunks by cosine similarity, best first. */
  search(query: Float32Array, k: number): Hit[] {
    const n = Math.min(k, this.chunkList.length);
    if (n === 0) return [];
    const { distances, labels } = this.index.search(Array.from(query), n);
    const hits: Hit[] = [];
    labels.forEach((label, i) => {
      if (label >= 0) hits.push({ chunk: this.chunk(label), score: distances[i]! });
    });
    return hits;
  }

  /**
   * Adds a batch of documents and writes the snapshot that holds it; the batch becomes visible (to
   * search, counts, later snapshots) only once that snapshot is durable. A failed write leaves the
   * store as it was, so a retry of the same batch is not a duplicate. Callers serialise batches.
   */
  async addDurably(batch: readonly NewDocument[]): Promise<StoredDocument[]> {
    const docs = new Map(this.docs);
    const chunkList = [...this.chunkList];
    const added: StoredDocument[] = [];
    const rows: number[] = [];
    for (const { doc, chunks, vectors } of batch) {
      if (docs.has(doc.docId)) throw new Error(`document '${doc.docId}' exists`);
      if (vectors.length !== chunks.length * this.dimension) throw new Error('one embedding per chunk expected');
      const first = chunkList.length;
      const stored: StoredDocument = { ...doc, chunkIds: chunks.map((_, i) => first + i) };
      chunks.forEach((c, ord) => chunkList.push(storedChunk(first + ord, doc.docId, ord, c)));
      for (const v of vectors) rows.push(v);
      docs.set(doc.docId, stored);
      added.push(stored);
    }
    // The live index stays as it is until the write is durable: the batch goes into a copy.
    const index = this.index.ntotal() > 0 ? faiss.IndexFlatIP.fromBuffer(this.index.toBuffer()) : new faiss.IndexFlatIP(this.dimension);
    if (rows.length > 0) index.add(rows);
    await writeFileAtomic(path.join(this.dir, SNAPSHOT), encodeState(this.dimension, docs, chunkList, index));
    this.index = index;
    this.docs = docs;
    this.chunkList = chunkList;
    return added;
  }

  /** Writes the whole store as one crash-safe snapshot. */
  async persist(): Promise<void> {
    await writeFileAtomic(path.join(this.dir, SNAPSHOT), encodeState(this.dimension, this.docs, this.chunkList, this.index));
  }
}

/** Sections: metadata (documents, chunks without texts), text (the chunks' texts), vectors (faiss's bytes). */
function encodeState(dimension: number, docs: ReadonlyMap<string, StoredDocument>, chunks: readonly StoredChunk[], index: faiss.IndexFlatIP): Buffer {
  const meta: SectionMeta = {
    version: 2, dimension, documents: [...docs.values()],
    chunks: chunks.map(({ text: _text, ...c }) => c),
  };
  return encodeSections([
    ['metadata', Buffer.from(JSON.stringify(meta))],
    ['text', Buffer.from(JSON.stringify(chunks.map((c) => c.text)))],
    ['vectors', index.toBuffer()],
  ]);
}

function readState(buf: Buffer, file: string): { documents: { dimension: number; list: StoredDocument[] }; chunks: StoredChunk[]; vectors: Buffer } {
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
  };
}
