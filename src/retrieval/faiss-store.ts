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
 *   so top_k stays full; a filter that leaves few chunks is searched exactly.
 * - Writes: while the snapshot is small (under `logBytes`), each write builds the next state beside the
 *   live one and swaps it in once the new snapshot holding it is durable, as before. Past that size a
 *   write appends one record to the log (durable before it is acknowledged) and then changes the live
 *   state in place, in one turn of the event loop: a search sees the write whole or not at all, and one
 *   document costs its own bytes, not a rewrite. Compaction folds the log into a new snapshot in the
 *   background once the log passes `logBytes` and a quarter of the snapshot.
 */
import { mkdir, stat } from 'node:fs/promises';
import path from 'node:path';
import { setImmediate as turn } from 'node:timers/promises';
import { loadConfig } from '../config/config.js';
import { lockDir, type DirLock } from './dir-lock.js';
import { CollectionLexicon } from './lexical.js';
import { Bitmap, PositionTable, Selections } from './positions.js';
import {
  DEFAULT_COLLECTION, DocumentExistsError, metadataMatches,
  type Bm25Params, type Hit, type Metadata, type NewDocument, type RetrievalStore, type SearchFilter, type StoreCounts,
  type StoredChunk, type StoredDocument,
} from './retrieval-store.js';
import { CorruptSnapshotError, decodeSnapshot, readSnapshot, writeSectionsAtomic } from './snapshot.js';
import { VectorIndex, type HnswParams } from './vector-index.js';
import { WriteLog, type LogRecord } from './write-log.js';

export type { Hit, NewDocument, StoredChunk, StoredDocument } from './retrieval-store.js';

export interface FaissStoreOptions {
  /** Live chunks from which the index is HNSW (0: always exact). */
  annMin?: number;
  /** HNSW: candidates per search, links per node, candidates while inserting. */
  efSearch?: number;
  hnswM?: number;
  efConstruction?: number;
  /** Snapshot size under which every write rewrites it; past it writes go to the log. */
  logBytes?: number;
  /** Log size from which compaction runs (also at least a quarter of the snapshot); default logBytes. */
  compactBytes?: number;
  /** Where warnings go (a torn log record dropped, a background task that failed). */
  warn?: (message: string) => void;
}

/** The settings RAGGUARD_FAISS_* default to (config.ts has them and their docs). */
function defaults(): Required<Omit<FaissStoreOptions, 'warn' | 'compactBytes'>> {
  const c = loadConfig({});
  return { annMin: c.faissAnnMin, efSearch: c.faissEfSearch, hnswM: c.faissHnswM, efConstruction: c.faissEfConstruction, logBytes: c.faissLogBytes };
}

/** Predicted bytes of a chunk's lexical postings per token, and of its objects (chunk, ids, map entries). */
const POSTING_BYTES = 24;
const CHUNK_OBJECT_BYTES = 256;
/** A document's object, map entry and arrays besides its title, metadata and chunk ids. */
const DOCUMENT_OBJECT_BYTES = 256;
/** A rebuild drops tombstones once they are this share of the positions. */
const TOMBSTONE_SHARE = 0.25;
/** A filter passing under this share of the positions is searched exactly (the graph would walk mostly past it). */
const EXACT_SHARE = 0.1;
/** Candidates of a filtered HNSW search grow as the filter narrows, up to this many times efSearch. */
const MAX_EF_FACTOR = 10;
/** Chunks in the log from which compaction runs whatever the snapshot's size, and from which close() compacts. */
const REPLAY_CHUNKS_MAX = 50_000;
const CLOSE_COMPACT_CHUNKS = 2000;
/** Vectors written during a rebuild that its swap adds on the event loop; more, and the rebuild starts over. */
const CATCH_UP_MAX = 2000;
/** Items per JSON section of a snapshot (documents, chunks, texts): no one string near V8's limit. */
const PART_ITEMS = 50_000;

const SNAPSHOT = 'index.snapshot';
const key = (collection: string, docId: string) => `${collection}\u0000${docId}`;

/** As stored: what older snapshots lack (collection, metadata, title on chunks) is optional. */
type DocumentRecord = Omit<StoredDocument, 'collection' | 'metadata'> & { collection?: string; metadata?: Metadata };
type ChunkRecord = Omit<StoredChunk, 'text' | 'collection' | 'title'> & { collection?: string; title?: string };

/** The metadata section: the chunks without their texts (those are the text sections), in position order. */
interface SectionMeta {
  version: 2 | 3;
  dimension: number;
  documents: DocumentRecord[];
  chunks: ChunkRecord[];
  /** The next chunk id (absent in older snapshots, whose ids are positions). */
  nextId?: number;
  /** Version 3: the last log record this snapshot holds. */
  seq?: number;
  /** Version 3: removed positions still in the index, with their chunk ids. */
  dead?: [number, number][];
  /** Version 3: numbered sections beyond the first part ('documents.1', 'chunks.1', 'text.1', ...). */
  parts?: { documents: number; chunks: number; text: number };
}

/** One state of the store. */
interface State {
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
  /** While the log is replayed: vectors for the index, added at the end. */
  pending?: Float32Array[];
}

/** A document as a log record carries it: its chunk ids are given (the first; they follow on). */
interface LoggedDocument {
  collection: string;
  docId: string;
  title: string;
  bytes: number;
  metadata: Metadata;
  firstId: number;
  chunks: { text: string; tokens: number; locator?: string }[];
}

/** One write: what the log records and what both the live write and the replay apply. */
type Change =
  | { op: 'add' | 'replace'; docs: LoggedDocument[] }
  | { op: 'remove'; collection: string; docId: string };

interface Applied {
  documents: StoredDocument[];
  replaced: boolean[];
  removed: StoredDocument | undefined;
  addedChunks: StoredChunk[];
  /** The chunks a write removed, with their collections (the lexical side is per collection). */
  removedChunks: { id: number; collection: string }[];
}

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

  /** Bytes of the faiss index: its vectors (removed ones until a rebuild) and an HNSW index's links. */
  get indexBytes(): number {
    const m = this.state.index.memoryBytes();
    return m.vectors + m.graph;
  }

  get indexDetail(): string {
    const s = this.state;
    const m = s.index.memoryBytes();
    const hnsw = s.index.hnsw;
    const form = hnsw ? `HNSW (M ${hnsw.M}, efSearch ${hnsw.efSearch}): ${m.vectors} bytes of vectors + ${m.graph} of links` : 'exact';
    return `${s.table.size} vectors x ${this.dimension} float32 (faiss, ${form}); ${s.table.tombstones} removed, left out until a rebuild; ` +
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
      return { op: 'add', docs: this.logged(batch) };
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
      return { op: 'replace', docs: this.logged(batch) };
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
    const s = this.state;
    if (k <= 0 || s.table.liveCount === 0) return [];
    const sel = this.selection(filter);
    if (sel.count === 0) return [];
    const want = Math.min(k, sel.count);
    const allow = sel.bits;
    let found: { positions: number[]; scores: number[] } | undefined;
    if (s.index.kind === 'flat') {
      found = s.index.search(query, want, { allow });
    } else {
      const share = sel.count / s.table.size;
      const exact = sel.count < this.opts.annMin || share < EXACT_SHARE;
      if (!exact) {
        // The graph walks past positions the bitmap leaves out: more candidates as the filter narrows.
        const efSearch = Math.min(this.opts.efSearch * MAX_EF_FACTOR, Math.max(this.opts.efSearch, want, Math.ceil(this.opts.efSearch / share)));
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

  async searchLexical(query: string, k: number, filter: SearchFilter): Promise<Hit[]> {
    const lexical = this.lexicalIndex();
    const { chunks } = this.state;
    const pass = this.passes(filter);
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

  /** The chunks a filter lets through, as a bitmap over positions (undefined: every position) and their count. */
  private selection(filter: SearchFilter | undefined): { bits?: Uint8Array; count: number } {
    const s = this.state;
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

  private passes(filter: SearchFilter | undefined): (c: StoredChunk) => boolean {
    if (!filter) return everything;
    const { collection, metadata } = filter;
    const s = this.state;
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

  /** The batch as log records carry it, chunk ids given from the next free one. */
  private logged(batch: readonly NewDocument[]): LoggedDocument[] {
    let next = this.state.nextId;
    return batch.map(({ doc, chunks, vectors }) => {
      if (vectors.length !== chunks.length * this.dimension) throw new Error('one embedding per chunk expected');
      const firstId = next;
      next += chunks.length;
      return {
        collection: doc.collection ?? DEFAULT_COLLECTION, docId: doc.docId, title: doc.title, bytes: doc.bytes,
        metadata: { ...doc.metadata }, firstId,
        chunks: chunks.map((c) => ({ text: c.text, tokens: c.tokens, ...(c.locator !== undefined ? { locator: c.locator } : {}) })),
      };
    });
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

const defaultWarn = (message: string) => console.warn(`[faiss-store] ${message}`);
const everything = (): boolean => true;
const nothing = (): boolean => false;
/** What the write queue's tail settles with: nothing that holds memory. */
const settled = (): undefined => undefined;

/** What BM25 indexes of a chunk: "title\ntext", what the embedder sees. */
const lexicalEntry = (c: StoredChunk) => ({ id: c.id, collection: c.collection, text: `${c.title}\n${c.text}` });

function emptyState(dimension: number): State {
  return {
    docs: new Map(), chunks: new Map(), table: PositionTable.empty(), index: VectorIndex.flat(dimension), nextId: 0,
    collections: new Map(), objectBytes: 0, selections: new Selections(),
  };
}

/** The next state of a small store's write: the live one stays as it is until the write is durable. */
function copyState(s: State): State {
  return {
    docs: new Map(s.docs), chunks: new Map(s.chunks), table: s.table.copy(), index: s.index.clone(), nextId: s.nextId,
    collections: new Map([...s.collections].map(([c, n]) => [c, { ...n }])), objectBytes: s.objectBytes, selections: new Selections(),
  };
}

/** An exact index without its removed vectors (positions move down; ids stay). */
function dropTombstones(s: State): void {
  const kept = s.table.livePositions();
  s.index = VectorIndex.flatOf(s.index.dimension, s.index.vectorsAt(kept));
  s.table = s.table.remap(kept, new Int32Array(0));
  s.selections.clear();
}

function noChange(): Applied {
  return { documents: [], replaced: [], removed: undefined, addedChunks: [], removedChunks: [] };
}

// eslint-disable-next-line no-control-regex
const LATIN1 = /^[\u0000-\u00ff]*$/;

/** V8 holds a Latin-1 string at a byte a character, others at two. */
const stringBytes = (s: string) => s.length * (LATIN1.test(s) ? 1 : 2);

function chunkObjectBytes(c: StoredChunk): number {
  return stringBytes(c.text) + (c.locator?.length ?? 0) * 2 + c.tokens * POSTING_BYTES + CHUNK_OBJECT_BYTES;
}

function documentObjectBytes(d: StoredDocument): number {
  return DOCUMENT_OBJECT_BYTES + stringBytes(d.docId) + stringBytes(d.title) + JSON.stringify(d.metadata).length * 2 + d.chunkIds.length * 8;
}

function countIn(s: State, collection: string, documents: number, chunks: number): void {
  const n = s.collections.get(collection) ?? { documents: 0, chunks: 0 };
  n.documents += documents;
  n.chunks += chunks;
  if (n.documents === 0) s.collections.delete(collection);
  else s.collections.set(collection, n);
}

function addDocument(s: State, d: LoggedDocument, vectors: Float32Array): StoredDocument {
  if (d.firstId < s.nextId) throw new Error(`chunk id ${d.firstId} was given before (next is ${s.nextId})`);
  const ids = d.chunks.map((_, i) => d.firstId + i);
  const stored: StoredDocument = { collection: d.collection, docId: d.docId, title: d.title, bytes: d.bytes, metadata: d.metadata, chunkIds: ids };
  const first = s.table.append(ids);
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
function apply(s: State, change: Change, vectors: Float32Array, dimension: number): Applied {
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

function concat(parts: readonly Float32Array[]): Float32Array {
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

function concatVectors(batch: readonly NewDocument[], dimension: number): Float32Array {
  for (const d of batch) if (d.vectors.length !== d.chunks.length * dimension) throw new Error('one embedding per chunk expected');
  return concat(batch.map((d) => d.vectors));
}

/** A log record's body: u32 LE length of the change's JSON | the JSON | the vectors (float32, little-endian). */
function encodeChange(change: Change, vectors: Float32Array): Buffer {
  const json = Buffer.from(JSON.stringify(change));
  const len = Buffer.alloc(4);
  len.writeUInt32LE(json.length);
  return Buffer.concat([len, json, Buffer.from(vectors.buffer, vectors.byteOffset, vectors.byteLength)]);
}

function replay(s: State, r: LogRecord, dimension: number): void {
  const n = r.body.readUInt32LE(0);
  const change = JSON.parse(r.body.subarray(4, 4 + n).toString('utf8')) as Change;
  const raw = r.body.subarray(4 + n);
  // A copy: the record's bytes need not be aligned for a Float32Array view.
  const vectors = new Float32Array(Uint8Array.from(raw).buffer);
  apply(s, change, vectors, dimension);
}

function liveChunks(s: State): StoredChunk[] {
  const out: StoredChunk[] = [];
  for (let p = 0; p < s.table.size; p++) {
    const id = s.table.idAt(p);
    if (id >= 0) out.push(s.chunks.get(id)!);
  }
  return out;
}

/** What a snapshot holds of a state, taken at once (the objects are never changed afterwards, only replaced). */
interface View {
  docs: StoredDocument[];
  chunks: StoredChunk[];
  dead: [number, number][];
  nextId: number;
}

function captureView(s: State): View {
  const labels = s.table.snapshot();
  const dead: [number, number][] = [];
  labels.forEach((l, p) => {
    if (l < 0) dead.push([p, -l - 1]);
  });
  return { docs: [...s.docs.values()], chunks: liveChunks(s), dead, nextId: s.nextId };
}

function encodeState(s: State, vectors: Buffer, seq: number): Promise<[string, Uint8Array][]> {
  return encodeView({ ...captureView(s), vectors }, s.index.dimension, seq);
}

/**
 * Sections: metadata (documents, chunks without texts, tombstones), text (the chunks' texts), vectors
 * (faiss's bytes); a large store's documents, chunks and texts continue in numbered sections
 * ('chunks.1', ...), each part encoded in its own turn of the event loop.
 */
async function encodeView(v: View & { vectors: Buffer }, dimension: number, seq: number): Promise<[string, Uint8Array][]> {
  const parts = <T>(items: T[]) => Array.from({ length: Math.max(1, Math.ceil(items.length / PART_ITEMS)) }, (_, i) => items.slice(i * PART_ITEMS, (i + 1) * PART_ITEMS));
  const docParts = parts(v.docs);
  const chunkParts = parts(v.chunks.map(({ text: _text, ...c }) => c));
  const textParts = parts(v.chunks.map((c) => c.text));
  const meta: SectionMeta = {
    version: 3, dimension, nextId: v.nextId, seq, dead: v.dead,
    parts: { documents: docParts.length, chunks: chunkParts.length, text: textParts.length },
    documents: docParts[0]!, chunks: chunkParts[0]!,
  };
  const out: [string, Uint8Array][] = [['metadata', Buffer.from(JSON.stringify(meta))]];
  for (const [name, list] of [['documents', docParts], ['chunks', chunkParts]] as const) {
    for (let i = 1; i < list.length; i++) {
      await turn();
      out.push([`${name}.${i}`, Buffer.from(JSON.stringify(list[i]))]);
    }
  }
  for (let i = 0; i < textParts.length; i++) {
    if (i > 0) await turn();
    out.push([i === 0 ? 'text' : `text.${i}`, Buffer.from(JSON.stringify(textParts[i]))]);
  }
  out.push(['vectors', v.vectors]);
  return out;
}

/** The state a snapshot holds (any version), and the last log record it holds. */
function loadState(contents: NonNullable<Awaited<ReturnType<typeof readSnapshot>>>, file: string, dimension: number): { state: State; seq: number } {
  const { meta, texts, vectors } = readSections(contents, file);
  if (meta.dimension !== dimension) {
    throw new Error(`${file} holds ${meta.dimension}-dimensional vectors but the embedder makes ${dimension}: ` +
      'point RAGGUARD_INDEX_DIR elsewhere or remove the snapshot to re-ingest');
  }
  let index: VectorIndex;
  try {
    index = VectorIndex.fromBuffer(vectors);
  } catch (e) {
    throw new CorruptSnapshotError(`${file}: section 'vectors' is not a faiss index (${(e as Error).message})`, file, 'vectors');
  }
  const dead = meta.dead ?? [];
  const positions = meta.chunks.length + dead.length;
  if (index.dimension !== dimension || index.size !== positions) {
    throw new CorruptSnapshotError(`${file}: section 'vectors' holds ${index.size} vectors of ${index.dimension} for ${positions} positions of ${dimension}`, file, 'vectors');
  }
  const s = emptyState(dimension);
  s.index = index;
  for (const d of meta.documents) {
    const collection = d.collection ?? DEFAULT_COLLECTION;
    const doc: StoredDocument = { ...d, collection, metadata: d.metadata ?? {} };
    s.docs.set(key(collection, d.docId), doc);
    s.objectBytes += documentObjectBytes(doc);
    countIn(s, collection, 1, doc.chunkIds.length);
  }
  const labels = new Int32Array(positions);
  const deadAt = new Map(dead);
  let next = 0;
  for (let p = 0; p < positions; p++) {
    const gone = deadAt.get(p);
    if (gone !== undefined) {
      labels[p] = -gone - 1;
      continue;
    }
    const c = meta.chunks[next]!;
    const text = texts[next++]!;
    const collection = c.collection ?? DEFAULT_COLLECTION;
    const title = c.title ?? s.docs.get(key(collection, c.docId))?.title ?? c.docId;
    const chunk: StoredChunk = { ...c, collection, title, text };
    s.chunks.set(c.id, chunk);
    s.objectBytes += chunkObjectBytes(chunk);
    labels[p] = c.id;
  }
  try {
    s.table = PositionTable.of(labels);
  } catch (e) {
    throw new CorruptSnapshotError(`${file}: section 'metadata' lists ${(e as Error).message}`, file, 'metadata');
  }
  s.nextId = meta.nextId ?? meta.chunks.reduce((m, c) => Math.max(m, c.id + 1), 0);
  return { state: s, seq: meta.seq ?? 0 };
}

function readSections(contents: NonNullable<Awaited<ReturnType<typeof readSnapshot>>>, file: string): { meta: SectionMeta; texts: string[]; vectors: Buffer } {
  if ('v1' in contents) {
    // Version 1: no checksums to verify (written before they existed); the texts are in the metadata.
    const { meta, payload } = decodeSnapshot<{ version: 1; dimension: number; documents: DocumentRecord[]; chunks: (ChunkRecord & { text: string })[] }>(contents.v1, file);
    if (meta.version !== 1) throw new CorruptSnapshotError(`${file}: unknown snapshot version ${String(meta.version)}`, file, 'metadata');
    return {
      meta: { version: 2, dimension: meta.dimension, documents: meta.documents, chunks: meta.chunks.map(({ text: _t, ...c }) => c) },
      texts: meta.chunks.map((c) => c.text), vectors: payload,
    };
  }
  const { sections } = contents;
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
  if (meta.version !== 2 && meta.version !== 3) throw new CorruptSnapshotError(`${file}: unknown snapshot version ${String(meta.version)}`, file, 'metadata');
  const rest = <T>(name: string, first: T[], count = 1): T[] => {
    const out = first;
    for (let i = 1; i < count; i++) for (const x of json<T[]>(`${name}.${i}`)) out.push(x);
    return out;
  };
  meta.documents = rest('documents', meta.documents, meta.parts?.documents);
  meta.chunks = rest('chunks', meta.chunks, meta.parts?.chunks);
  const texts = rest('text', json<string[]>('text'), meta.parts?.text);
  if (!Array.isArray(texts) || texts.length !== meta.chunks.length) {
    throw new CorruptSnapshotError(`${file}: section 'text' holds ${texts?.length} texts for ${meta.chunks.length} chunks`, file, 'text');
  }
  return { meta, texts, vectors: need('vectors') };
}
