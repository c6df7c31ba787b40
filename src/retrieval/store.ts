/**
 * The document store: chunk texts and metadata beside a faiss inner-product index over their unit
 * embeddings (so scores are cosine similarities). Faiss labels are chunk ids: chunks are only ever
 * appended, so label i is chunks[i].
 */
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import faiss from 'faiss-node';
import { decodeSnapshot, encodeSnapshot, readSnapshotFile, writeFileAtomic, CorruptSnapshotError } from './snapshot.js';

export interface StoredDocument {
  docId: string;
  title: string;
  /** Ids of its chunks, in document order. */
  chunkIds: number[];
  bytes: number;
}

export interface StoredChunk {
  id: number;
  docId: string;
  /** Position of the chunk inside its document. */
  ord: number;
  text: string;
  tokens: number;
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

const SNAPSHOT = 'index.snapshot';
const REMEMBERED = 1024;

export class DocumentStore {
  private readonly docs = new Map<string, StoredDocument>();
  private readonly chunkList: StoredChunk[] = [];
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

  /** Opens the snapshot in `dir`, or an empty store when there is none. A corrupt snapshot throws. */
  static async open(dir: string, dimension: number): Promise<DocumentStore> {
    await mkdir(dir, { recursive: true });
    const file = path.join(dir, SNAPSHOT);
    const buf = await readSnapshotFile(file);
    if (!buf) return new DocumentStore(dir, dimension, new faiss.IndexFlatIP(dimension));
    const { meta, payload } = decodeSnapshot<SnapshotMeta>(buf, file);
    if (meta.version !== 1) throw new CorruptSnapshotError(`${file}: unknown snapshot version ${String(meta.version)}`);
    if (meta.dimension !== dimension) {
      throw new Error(`${file} holds ${meta.dimension}-dimensional vectors but the embedder makes ${dimension}: ` +
        'point RAGGUARD_INDEX_DIR elsewhere or remove the snapshot to re-ingest');
    }
    const index = faiss.IndexFlatIP.fromBuffer(payload);
    if (index.ntotal() !== meta.chunks.length) {
      throw new CorruptSnapshotError(`${file}: index holds ${index.ntotal()} vectors for ${meta.chunks.length} chunks`);
    }
    const store = new DocumentStore(dir, dimension, index);
    for (const d of meta.documents) store.docs.set(d.docId, d);
    store.chunkList.push(...meta.chunks);
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
  add(doc: { docId: string; title: string; bytes: number }, chunks: readonly { text: string; tokens: number }[], vectors: Float32Array): StoredDocument {
    if (this.docs.has(doc.docId)) throw new Error(`document '${doc.docId}' exists`);
    if (vectors.length !== chunks.length * this.dimension) throw new Error('one embedding per chunk expected');
    const first = this.chunkList.length;
    const stored: StoredDocument = { ...doc, chunkIds: chunks.map((_, i) => first + i) };
    if (chunks.length > 0) this.index.add(Array.from(vectors));
    chunks.forEach((c, ord) => this.chunkList.push({ id: first + ord, docId: doc.docId, ord, text: c.text, tokens: c.tokens }));
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

  /** Writes the whole store as one crash-safe snapshot. */
  async persist(): Promise<void> {
    const meta: SnapshotMeta = { version: 1, dimension: this.dimension, documents: [...this.docs.values()], chunks: this.chunkList };
    await writeFileAtomic(path.join(this.dir, SNAPSHOT), encodeSnapshot(meta, this.index.toBuffer()));
  }
}
