/**
 * The embedded retrieval store: documents and chunk texts beside a faiss inner-product index over the
 * chunks' unit embeddings (so scores are cosine similarities), BM25 (lexical.ts) over the same chunks,
 * all in this process, persisted as a crash-safe snapshot (snapshot.ts) and a write log (write-log.ts).
 * docs/store-growth.md tells the whole story; in short:
 *
 * - The index is exact (IndexFlatIP) until the store holds `annMin` chunks, then HNSW (vector-index.ts),
 *   rebuilt on a worker thread while the exact one keeps serving. Chunk ids are stable; positions in the
 *   index follow the ids (positions.ts). A removed chunk leaves a tombstone that every search's bitmap
 *   leaves out, until a rebuild drops them (once they are a quarter of the positions).
 * - Filters (a collection, metadata conditions) are a bitmap of positions applied inside faiss's search,
 *   so top_k stays full; a filter that leaves few chunks is searched exactly over its collection's own vectors.
 * - Writes: while the snapshot is small (under `logBytes`), each write builds the next state beside the
 *   live one and swaps it in once the new snapshot holding it is durable, as before. Past that size a
 *   write appends one record to the log (durable before it is acknowledged) and then changes the live
 *   state in place, in one turn of the event loop: a search sees the write whole or not at all, and one
 *   document costs its own bytes, not a rewrite. Compaction folds the log into a new snapshot in the
 *   background once the log passes `logBytes` and a quarter of the snapshot.
 *
 * Its parts: the state (faiss-state.ts), a write as one change (faiss-change.ts), search with filters
 * (faiss-search.ts), the snapshot's sections (faiss-snapshot-sections.ts), the options (faiss-options.ts).
 */
import { mkdir, stat } from 'node:fs/promises';
import path from 'node:path';
import { apply, concatVectors, encodeChange, loggedBatch, noChange, replay, type Applied, type Change } from './faiss-change.js';
import { defaults, defaultWarn, type FaissStoreOptions } from './faiss-options.js';
import { everything, lexicalEntry, nothing, passes, searchState } from './faiss-search.js';
import { captureView, encodeState, encodeView, loadState, SNAPSHOT } from './faiss-snapshot-sections.js';
import { collectionVectorBytes, concat, copyState, dropTombstones, emptyState, groupByCollection, key, liveChunks, type State } from './faiss-state.js';
import { lockDir, type DirLock } from './dir-lock.js';
import { CollectionLexicon } from './lexical.js';
import {
  DEFAULT_COLLECTION, DocumentExistsError,
  type Bm25Params, type Hit, type NewDocument, type RetrievalStore, type SearchFilter, type StoreCounts,
  type StoredChunk, type StoredDocument,
} from './retrieval-store.js';
import { readSnapshot, writeSectionsAtomic } from './snapshot.js';
import { VectorIndex, type HnswParams } from './vector-index.js';
import { WriteLog } from './write-log.js';

export type { Hit, NewDocument, StoredChunk, StoredDocument } from './retrieval-store.js';
export type { FaissStoreOptions } from './faiss-options.js';

/** A rebuild drops tombstones once they are this share of the positions. */
const TOMBSTONE_SHARE = 0.25;
/** Chunks in the log from which compaction runs whatever the snapshot's size, and from which close() compacts. */
const REPLAY_CHUNKS_MAX = 50_000;
const CLOSE_COMPACT_CHUNKS = 2000;
/** Vectors written during a rebuild that its swap adds on the event loop; more, and the rebuild starts over. */
const CATCH_UP_MAX = 2000;

export class FaissStore implements RetrievalStore {
  readonly kind = 'faiss';
  private state: State;
  /** BM25 over the chunks, per collection: built at the first lexical search, then kept level with every write. */
  private lexical: CollectionLexicon | undefined;
  private writeTail: Promise<unknown> = Promise.resolve();
  private readonly opts: Required<Omit<FaissStoreOptions, 'warn'>>;
  private readonly warn: (message: string) => void;
  /** Bytes of the snapshot on disk. */
  private snapshotBytes: number;
  private compaction: Promise<void> | undefined;
  private rebuilding: Promise<void> | undefined;
  /** A compaction is due whatever the log's size (the index changed form). */
  private compactionDue = false;
  private closed = false;
  /** The directory's lock, held from open to close. */
  private lock: DirLock | undefined;

  private constructor(
    readonly dir: string,
    readonly dimension: number,
    private readonly bm25: Bm25Params,
    state: State,
    private readonly log: WriteLog,
    snapshotBytes: number,
    options: FaissStoreOptions,
  ) {
    this.state = state;
    this.snapshotBytes = snapshotBytes;
    const { warn, ...rest } = options;
    const opts = { ...defaults(), ...rest };
    this.opts = { ...opts, compactBytes: opts.compactBytes ?? opts.logBytes };
    this.warn = warn ?? defaultWarn;
  }

  /**
   * Opens the snapshot in `dir` (or an empty store when there is none) and replays the log after it.
   * A damaged or truncated snapshot, or a damaged log record before its last, throws
   * CorruptSnapshotError naming the file and the section.
   */
  static async open(dir: string, dimension: number, bm25: Bm25Params = { k1: 1.2, b: 0.75 }, options: FaissStoreOptions = {}): Promise<FaissStore> {
    await mkdir(dir, { recursive: true });
    // One process per directory: a second refuses here, naming the first (dir-lock.ts).
    const lock = await lockDir(dir);
    try {
      const store = await FaissStore.load(dir, dimension, bm25, options);
      store.lock = lock;
      return store;
    } catch (e) {
      await lock.release();
      throw e;
    }
  }

  private static async load(dir: string, dimension: number, bm25: Bm25Params, options: FaissStoreOptions): Promise<FaissStore> {
    const file = path.join(dir, SNAPSHOT);
    const contents = await readSnapshot(file);
    const { state, seq } = contents ? loadState(contents, file, dimension) : { state: emptyState(dimension), seq: 0 };
    groupByCollection(state); // each collection's own vectors (not persisted); the log's replay adds to them
    const warn = options.warn ?? defaultWarn;
    // The log's vectors go into the index at the end, in one call: faiss inserts a batch into the graph
    // on all its threads, record by record it would use one.
    state.pending = [];
    const log = await WriteLog.open(dir, seq, (r) => replay(state, r, dimension), warn);
    state.index.add(concat(state.pending));
    state.pending = undefined;
    if (state.index.size !== state.table.size) throw new Error(`the index holds ${state.index.size} vectors for ${state.table.size} positions`);
    const snapshotBytes = contents ? (await stat(file)).size : 0;
    const store = new FaissStore(dir, dimension, bm25, state, log, snapshotBytes, { ...options, warn });
    store.state.index.tune({ efSearch: store.opts.efSearch });
    store.maintain();
    return store;
  }

  get documentCount(): number {
    return this.state.docs.size;
  }

  get chunkCount(): number {
    return this.state.table.liveCount;
  }

  /** Bytes of the faiss indexes: the store-wide one's vectors (removed ones until a rebuild), its links, the collections' own copies. */
  get indexBytes(): number {
    const m = this.state.index.memoryBytes();
    return m.vectors + m.graph + collectionVectorBytes(this.state);
  }

  get indexDetail(): string {
    const s = this.state;
    const m = s.index.memoryBytes();
    const hnsw = s.index.hnsw;
    const form = hnsw ? `HNSW (M ${hnsw.M}, efSearch ${hnsw.efSearch}): ${m.vectors} bytes of vectors + ${m.graph} of links` : 'exact';
    return `${s.table.size} vectors x ${this.dimension} float32 (faiss, ${form}); ${s.table.tombstones} removed, left out until a rebuild; ` +
      `each collection's vectors also kept together for its searches (${s.byCollection.size} collections, ${collectionVectorBytes(s)} bytes); ` +
      `position table ${s.table.bytes + s.selections.bytes} bytes; write log ${this.log.bytes} bytes on disk`;
  }

  /**
   * Bytes this process holds for the stored documents, kept as a running total: the index (vectors,
   * HNSW links), the position table and filter bitmaps, the documents' and chunks' objects and texts,
   * and the lexical postings (predicted per token, built or not).
   */
  get residentBytes(): number {
    const s = this.state;
    return this.indexBytes + s.table.bytes + s.selections.bytes + s.objectBytes;
  }

  /** The index's form now, and the background work in flight (tests, the scale bench). */
  get status(): { index: 'flat' | 'hnsw'; positions: number; tombstones: number; logBytes: number; snapshotBytes: number; compacting: boolean; rebuilding: boolean } {
    const s = this.state;
    return {
      index: s.index.kind, positions: s.table.size, tombstones: s.table.tombstones, logBytes: this.log.bytes,
      snapshotBytes: this.snapshotBytes, compacting: this.compaction !== undefined, rebuilding: this.rebuilding !== undefined,
    };
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
    const out: StoredDocument[] = [];
    let i = 0;
    for (const d of this.state.docs.values()) {
      if (i++ < offset) continue;
      if (out.length >= limit) break;
      out.push(d);
    }
    return out;
  }

  /** Every chunk, in index order. */
  allChunks(): StoredChunk[] {
    return liveChunks(this.state);
  }

  async counts(collection?: string): Promise<StoreCounts> {
    if (collection === undefined) return { documents: this.documentCount, chunks: this.chunkCount };
    return { ...(this.state.collections.get(collection) ?? { documents: 0, chunks: 0 }) };
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

  /** Adds the batch; visible (to search, counts, later snapshots) only once it is durable. */
  addBatch(batch: readonly NewDocument[]): Promise<StoredDocument[]> {
    return this.write(() => {
      const seen = new Set<string>();
      for (const { doc } of batch) {
        const collection = doc.collection ?? DEFAULT_COLLECTION;
        const k = key(collection, doc.docId);
        if (this.state.docs.has(k) || seen.has(k)) throw new DocumentExistsError(doc.docId, collection);
        seen.add(k);
      }
      return { op: 'add', docs: loggedBatch(batch, this.state.nextId, this.dimension) };
    }, batch, (a) => a.documents);
  }

  /** Older name of addBatch. */
  addDurably(batch: readonly NewDocument[]): Promise<StoredDocument[]> {
    return this.addBatch(batch);
  }

  /** Replaces (or creates) each document of the batch, all in one write. */
  replaceBatch(batch: readonly NewDocument[]): Promise<{ document: StoredDocument; replaced: boolean }[]> {
    return this.write(() => {
      const seen = new Set<string>();
      for (const { doc } of batch) {
        const k = key(doc.collection ?? DEFAULT_COLLECTION, doc.docId);
        if (seen.has(k)) throw new Error(`document '${doc.docId}' appears twice in one batch`);
        seen.add(k);
      }
      return { op: 'replace', docs: loggedBatch(batch, this.state.nextId, this.dimension) };
    }, batch, (a) => a.documents.map((document, i) => ({ document, replaced: a.replaced[i]! })));
  }

  remove(collection: string, docId: string): Promise<StoredDocument | undefined> {
    if (!this.has(docId, collection)) return Promise.resolve(undefined);
    return this.write(() => (this.has(docId, collection) ? { op: 'remove', collection, docId } : undefined), [], (a) => a.removed);
  }

  async searchDense(query: Float32Array, k: number, filter: SearchFilter): Promise<Hit[]> {
    return this.search(query, k, filter);
  }

  /** The k nearest chunks by cosine similarity that pass the filter (none: every chunk), best first. */
  search(query: Float32Array, k: number, filter?: SearchFilter): Hit[] {
    return searchState(this.state, this.opts, query, k, filter);
  }

  async searchLexical(query: string, k: number, filter: SearchFilter): Promise<Hit[]> {
    const lexical = this.lexicalIndex();
    const { chunks } = this.state;
    const pass = passes(this.state, filter);
    if (pass === nothing) return [];
    return lexical.search(filter.collection, query, k, pass === everything ? undefined : (id) => pass(chunks.get(id)!))
      .map((h) => ({ chunk: chunks.get(h.chunkId)!, score: h.score }));
  }

  /** Whether the BM25 index is built (the service builds it at start, not in a first query's turn). */
  get lexicalReady(): boolean {
    return this.lexical !== undefined;
  }

  /** The BM25 indexes (one per collection), built now if this is the first lexical search (the service builds them at start). */
  lexicalIndex(): CollectionLexicon {
    if (!this.lexical) {
      const lexical = new CollectionLexicon(this.bm25);
      lexical.add(this.allChunks().map(lexicalEntry));
      this.lexical = lexical;
    }
    return this.lexical;
  }

  /** Resolves once no compaction or rebuild is running or due (the scale bench waits for it). */
  async idle(): Promise<void> {
    for (;;) {
      await this.writeTail;
      const pending = this.compaction ?? this.rebuilding;
      if (!pending) return;
      // A failure was reported through `warn`; idle means nothing is running.
      await pending.catch(() => undefined);
    }
  }

  /**
   * Waits for the writes begun and a compaction in flight, and compacts a log that would take the next
   * start more than a moment to replay; a rebuild in flight is abandoned (it runs again at the next open).
   */
  async close(): Promise<void> {
    await this.writeTail;
    if (this.log.bytes > CLOSE_COMPACT_CHUNKS * this.chunkLogBytes) {
      await this.compaction?.catch(() => undefined);
      await this.compact().catch((e: Error) => this.warn(`compacting the write log at close failed (the next start replays it): ${e.message}`));
    }
    this.closed = true;
    await this.writeTail;
    await this.compaction?.catch(() => undefined);
    await this.log.close();
    await this.lock?.release();
    this.lock = undefined;
  }

  /** Whether writes rewrite the snapshot (under logBytes) rather than append to the log. */
  private get small(): boolean {
    return this.snapshotBytes + this.log.bytes < this.opts.logBytes;
  }

  /** About the bytes one chunk takes in the log (its vector and its share of the record's JSON). */
  private get chunkLogBytes(): number {
    return this.dimension * 4 + 200;
  }

  /** Writes a snapshot (a test may make it fail). */
  persist(sections: ReadonlyArray<readonly [string, Uint8Array]>): Promise<number> {
    return writeSectionsAtomic(path.join(this.dir, SNAPSHOT), sections);
  }

  /** Appends a record to the log and makes it durable (a test may make it fail). */
  appendLog(body: Uint8Array): Promise<number> {
    return this.log.append(body);
  }



  /**
   * Runs a write after the earlier ones. `plan` validates against the state now and says the change
   * (undefined: nothing to do). A small store writes the next state's snapshot before swapping it in;
   * a large one appends the change to the log, then applies it in place.
   */
  private write<T>(plan: () => Change | undefined, batch: readonly NewDocument[], result: (a: Applied) => T): Promise<T> {
    const run = this.writeTail.then(async () => {
      const change = plan();
      if (!change) return result(noChange());
      const vectors = concatVectors(batch, this.dimension);
      let applied: Applied;
      if (!this.compaction && this.small) {
        const next = copyState(this.state);
        applied = apply(next, change, vectors, this.dimension);
        // An exact index drops removed vectors at once here (the copy is being rewritten anyway).
        if (next.index.kind === 'flat' && next.table.tombstones > 0) dropTombstones(next);
        const seq = this.log.lastSeq;
        this.snapshotBytes = await this.persist(await encodeState(next, next.index.toBuffer(), seq));
        this.state = next;
        // The snapshot holds every logged record too.
        if (this.log.bytes > 0) await this.log.dropAll().catch((e: Error) => this.warn(`removing the folded write log failed: ${e.message}`));
      } else {
        await this.appendLog(encodeChange(change, vectors));
        applied = apply(this.state, change, vectors, this.dimension);
      }
      if (this.lexical) {
        this.lexical.remove(applied.removedChunks);
        this.lexical.add(applied.addedChunks.map(lexicalEntry));
      }
      this.maintain();
      return result(applied);
    });
    this.writeTail = run.then(settled, settled);
    return run;
  }

  /** Runs `work` as the one writer (after the writes begun), for background tasks' steps. */
  private exclusive<T>(work: () => Promise<T> | T): Promise<T> {
    const run = this.writeTail.then(work);
    // The tail settles with nothing, not with `work`'s result: a compaction's serialised index or a
    // rebuild's vectors (a snapshot's size: 1.9 GB at 1M chunks) would otherwise stay reachable from it
    // until the next write, outside every prediction (bench:scale measured 3.9 GB resident against
    // 2.3 GB predicted at 1M chunks).
    this.writeTail = run.then(settled, settled);
    return run;
  }

  /** Starts the background work that is due: a rebuild of the index, a compaction of the log. */
  private maintain(): void {
    if (this.closed) return;
    const s = this.state;
    const live = s.table.liveCount;
    const { annMin } = this.opts;
    const kind = s.index.kind;
    const target = annMin > 0 && live >= annMin ? 'hnsw' : kind === 'hnsw' && annMin > 0 && live >= annMin / 2 ? 'hnsw' : 'flat';
    const tombstones = s.table.tombstones > 0 && s.table.tombstones >= TOMBSTONE_SHARE * s.table.size;
    if (!this.rebuilding && (target !== kind || tombstones)) {
      // After a failure, the next write tries again (not at once: the same failure would repeat).
      this.rebuilding = this.rebuild(target).then(
        () => {
          this.rebuilding = undefined;
          this.maintain();
        },
        (e: Error) => {
          this.rebuilding = undefined;
          this.warn(`rebuilding the index failed: ${e.message}`);
        },
      );
    }
    // A quarter of the snapshot keeps the rewrites' cost in proportion to what was written; the cap keeps
    // the replay after a crash (each logged chunk inserted into the graph again) to tens of seconds.
    const replayCap = REPLAY_CHUNKS_MAX * this.chunkLogBytes;
    const logFull = this.log.bytes > 0 && this.log.bytes >= Math.max(this.opts.compactBytes, Math.min(this.snapshotBytes / 4, replayCap));
    if (logFull || this.compactionDue) {
      this.compact().catch((e: Error) => this.warn(`compacting the write log failed (it is kept, and tried again after the next write): ${e.message}`));
    }
  }

  /**
   * Writes a snapshot of the state now and drops the log records it holds (in the background once
   * the log is large, or after a rebuild; callable at any time). Joins one in flight.
   */
  compact(): Promise<void> {
    if (this.compaction) return this.compaction;
    this.compactionDue = false;
    this.compaction = this.compactNow().then(
      () => {
        this.compaction = undefined;
        // Due again meanwhile (a rebuild swapped the index after this one took the state).
        if (this.compactionDue) this.maintain();
      },
      (e: unknown) => {
        this.compaction = undefined;
        throw e;
      },
    );
    return this.compaction;
  }

  /**
   * Writes a snapshot of the state now and drops the log records it holds. The state is taken as the
   * one writer, and the index serialised on a worker thread meanwhile (writes wait for that, searches
   * do not); encoding, hashing and writing follow while writes go on into a new log segment.
   */
  private async compactNow(): Promise<void> {
    const { seq, view } = await this.exclusive(async () => {
      const seq = await this.log.rotate();
      const s = this.state;
      return { seq, view: { ...captureView(s), vectors: await s.index.toBufferAsync() } };
    });
    this.snapshotBytes = await this.persist(await encodeView(view, this.dimension, seq));
    await this.log.dropThrough(seq);
  }

  /**
   * Builds the index anew from the live vectors (dropping tombstones), as `kind`: HNSW on a worker
   * thread while the old index serves, then swapped in as the one writer, with the vectors written
   * meanwhile added (or, when there are many, the build runs again from the state then).
   */
  private async rebuild(kind: 'flat' | 'hnsw'): Promise<void> {
    for (;;) {
      const start = await this.exclusive(() => {
        if (this.closed) return undefined;
        const s = this.state;
        const end = s.table.size;
        const kept = s.table.livePositions(end);
        return { end, kept, vectors: s.index.vectorsAt(kept) };
      });
      if (!start) return;
      const params: HnswParams = { M: this.opts.hnswM, efConstruction: this.opts.efConstruction, efSearch: this.opts.efSearch };
      const built = kind === 'hnsw'
        ? await VectorIndex.hnswOf(this.dimension, start.vectors, params)
        : VectorIndex.flatOf(this.dimension, start.vectors);
      const done = await this.exclusive(() => {
        if (this.closed) return true;
        const s = this.state;
        const appended = Int32Array.from({ length: s.table.size - start.end }, (_, i) => start.end + i).filter((p) => s.table.idAt(p) >= 0);
        if (appended.length > CATCH_UP_MAX) return false;
        built.add(s.index.vectorsAt(appended));
        s.table = s.table.remap(start.kept, appended);
        s.index = built;
        s.selections.clear();
        // Persisted by a compaction, so that the next start reads the new index instead of building it
        // again; a small store's next write persists it (it rewrites the snapshot anyway).
        if (!this.small) this.compactionDue = true;
        return true;
      });
      if (done) return;
    }
  }
}

/** What the write queue's tail settles with: nothing that holds memory. */
const settled = (): undefined => undefined;
