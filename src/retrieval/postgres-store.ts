/**
 * The shared retrieval store: PostgreSQL with pgvector (RAGGUARD_STORE=postgres://...). Documents, chunks,
 * their vectors (an HNSW cosine index) and the lexical side all live in the database, so any number of
 * replicas read one index, and every read goes to it (what another replica committed is seen by the next
 * query; the one thing reused is the whole store's counts, for GET /healthz, for 2 s).
 *
 * The lexical side is BM25 kept in the database rather than Postgres full-text search: a postings table
 * (collection, term, chunk, term frequency) written with each chunk, and each collection's figures
 * (documents, chunks, summed lengths) in one row per collection updated by the same transaction. A query
 * computes Okapi BM25 in SQL with the terms, lengths (distinct terms of "title\ntext") and idf the embedded
 * store's MiniSearch uses (lexical.ts), every figure the collection's own, so both stores score alike,
 * retrieval quality does not depend on the store, and one tenant's writes never move another's scores;
 * ts_rank is not BM25 (no idf, no length normalisation of that form) and would rank differently.
 *
 * Nothing depends on a session's state: a search is one read-only transaction that makes its settings local
 * to it (ef_search, the iterative scan, the statement timeout), so it runs as configured behind a pooler
 * in transaction mode (PgBouncer), and the whole transaction is sent as one query: one round trip
 * (pg-one-shot.ts). The schema is versioned (pg-schema.ts): an open of a current schema only reads, so the
 * server's role needs DML rights alone. The database not answering is StoreUnavailableError (a 503
 * store_unavailable), never a bug's 500.
 *
 * Writes are one transaction each (a whole batch, or nothing). Every search is filtered to one collection,
 * and its cost follows that collection, not the store (pg-collection-index.ts): a collection past
 * COLLECTION_INDEX_ROWS chunks has its own HNSW index (partial, WHERE collection = ...), built by the store
 * in the background once a write takes it past (when its role owns the table; else by `ragguard
 * migrate`); a smaller one (or one whose index is not built yet) is searched exactly through the btree on
 * collection. Metadata conditions are in the WHERE clause of the index scan; pgvector's iterative scan
 * (hnsw.iterative_scan) keeps scanning the graph until the LIMIT is met, and where the graph still comes
 * up short (a very selective filter), an exact scan of the matching rows fills top_k.
 *
 * Its parts: the schema and its migrations (pg-schema.ts), rows (pg-rows.ts), searches (pg-search.ts),
 * writes (pg-writes.ts), transactions (pg-transaction.ts, pg-one-shot.ts), errors (pg-errors.ts), `ragguard
 * migrate` (pg-admin.ts).
 */
import pg from 'pg';
import { grantServerRole, migrateDatabase, schemaOptions } from './pg-admin.js';
import { buildCollectionIndex, COLLECTION_INDEX_ROWS, collectionIndexName, validCollectionIndexes } from './pg-collection-index.js';
import { oneShotSql } from './pg-one-shot.js';
import { searchSettingsSql, writeTransactionSql } from './pg-search-settings.js';
import { INSUFFICIENT_PRIVILEGE, isUnavailable, placeOf, RETRY_AFTER_S } from './pg-errors.js';
import { toChunk, toDocument, CHUNK_COLUMNS, type ChunkRow, type DocumentRow } from './pg-rows.js';
import { SchemaBehindError, SCHEMA_VERSION, migrate, schemaVersion, type MigrateResult } from './pg-schema.js';
import { searchDense, searchLexical } from './pg-search.js';
import { oneShot, transaction } from './pg-transaction.js';
import { applyDelta, deleteDocument, insertDocument, keyOrder, listPlaces, type Delta } from './pg-writes.js';
import {
  DEFAULT_COLLECTION, DocumentExistsError, StoreUnavailableError,
  type Bm25Params, type Hit, type NewDocument, type RetrievalStore, type SearchFilter, type StoreCounts,
  type StoredChunk, type StoredDocument,
} from './retrieval-store.js';

export { grantServerRole, isUnavailable, migrateDatabase };

export interface PostgresStoreOptions {
  bm25: Bm25Params;
  /** Connections in the pool (RAGGUARD_PG_POOL_SIZE). */
  poolSize?: number;
  /**
   * HNSW candidate list per scan at most (pgvector's hnsw.ef_search; higher: better recall, slower; default
   * 1000, the most pgvector takes; RAGGUARD_PG_EF_SEARCH says why); a dense search of a collection takes
   * fewer where its size allows (collectionEfSearchExpr).
   */
  efSearch?: number;
  /** Milliseconds a new connection may take (RAGGUARD_PG_CONNECT_TIMEOUT_MS; 0: no limit). */
  connectTimeoutMs?: number;
  /** Milliseconds a statement may run (RAGGUARD_PG_STATEMENT_TIMEOUT_MS; 0: no limit). */
  statementTimeoutMs?: number;
  /** pgvector's HNSW build settings, for a new database's index (RAGGUARD_PG_HNSW_M, _EF_CONSTRUCTION). */
  hnswM?: number;
  hnswEfConstruction?: number;
  /**
   * A collection with this many chunks gets its own HNSW index, built by the store (default
   * COLLECTION_INDEX_ROWS; Infinity: never by the store, as for a bench that builds it itself).
   */
  collectionIndexRows?: number;
  /** 'auto': bring a schema that is behind forward at open when the role may; 'never': refuse to open. */
  migrate?: 'auto' | 'never';
  /** Where open says what it did (a migration). */
  log?: (message: string) => void;
}

/** How long a collection whose index another session was building waits before this store looks again. */
const INDEX_RETRY_MS = 10_000;

/** How long the whole store's counts (GET /healthz) are reused. */
const COUNTS_TTL_MS = 2000;
/** How long a caller of the whole store's counts (a liveness probe) waits for the database. */
const COUNTS_WAIT_MS = 1000;

export class PostgresStore implements RetrievalStore {
  readonly kind = 'postgres';
  /** The index lives in the database server: this process holds none of it. */
  readonly indexBytes = 0;
  readonly residentBytes = 0;
  /** The whole store's counts and when they were read (GET /healthz reuses them for COUNTS_TTL_MS). */
  private cachedCounts: { at: number; counts: StoreCounts } | undefined;
  /** The whole store's counts being read (probes at once share it). */
  private countsRead: Promise<StoreCounts> | undefined;
  /** Writes this instance finished (a counts read from before one is not kept). */
  private writes = 0;
  /** A search's settings (one not of a collection's graph) and what opens a write's transaction. */
  private readonly searchSettings: string;
  private readonly writePreamble: string;
  /** The per-collection indexes known valid (their names), and those wanted, in order of want. */
  private indexed = new Set<string>();
  private readonly indexQueue = new Set<string>();
  /** A collection's next try after another session was building its index, or a build failed. */
  private readonly indexRetryAt = new Map<string, number>();
  /** The one build in flight (builds run one at a time, each on a connection of its own). */
  private indexing: Promise<void> | undefined;
  private indexClient: pg.Client | undefined;
  /** This role may not build indexes (said once); `ragguard migrate` builds them. */
  private indexDenied = false;
  private closed = false;

  private constructor(
    private readonly pool: pg.Pool,
    readonly dimension: number,
    private readonly bm25: Bm25Params,
    private readonly where: string,
    private readonly efSearch: number,
    private readonly statementTimeoutMs: number,
    private readonly url: string,
    private readonly indexOpts: { rows: number; hnswM: number; hnswEfConstruction: number; log: (message: string) => void },
  ) {
    // Local to the transaction for searches and writes alike, so they survive transaction pooling (pg-search-settings.ts).
    this.searchSettings = searchSettingsSql({ efSearch, statementTimeoutMs });
    this.writePreamble = writeTransactionSql({ statementTimeoutMs });
  }

  get indexDetail(): string {
    return `held by PostgreSQL at ${this.where} (pgvector HNSW, cosine)`;
  }

  /**
   * Connects, checks the schema's version (brings it forward when it is behind, the role may and
   * opts.migrate is not 'never'; else refuses, naming `ragguard migrate`), checks that the stored vectors
   * have the embedder's dimension and that a search transaction takes its settings. A schema that is
   * current needs no right beyond select, insert, update and delete.
   */
  static async open(url: string, dimension: number, opts: PostgresStoreOptions): Promise<PostgresStore> {
    const efSearch = opts.efSearch ?? 1000;
    // pgvector refuses a value outside 1..1000, and a connection would then search at its default of 40:
    // a recall far below the one asked for, silently (bench:scale at ef_search 1024 measured 0.75).
    if (!Number.isInteger(efSearch) || efSearch < 1 || efSearch > 1000) {
      throw new RangeError(`efSearch ${efSearch} is outside pgvector's hnsw.ef_search range (an integer in 1..1000)`);
    }
    const statementTimeoutMs = opts.statementTimeoutMs ?? 30_000;
    const pool = new pg.Pool({
      connectionString: url, max: opts.poolSize ?? 10,
      ...(opts.connectTimeoutMs ? { connectionTimeoutMillis: opts.connectTimeoutMs } : {}),
      // A connection that stops answering (a host gone, not closed) fails its query past the statement
      // timeout instead of holding the request: the client side of the same limit, with a margin.
      ...(statementTimeoutMs > 0 ? { query_timeout: statementTimeoutMs + 5000 } : {}),
      keepAlive: true,
    });
    // An idle connection the server closed (a restart, a failover) is an error on the pool, not a crash.
    pool.on('error', () => undefined);
    const where = placeOf(url);
    const client = await pool.connect().catch(async (e: Error) => {
      await pool.end();
      throw new StoreUnavailableError(`cannot connect to PostgreSQL at ${where}: ${e.message}`, RETRY_AFTER_S, { cause: e });
    });
    try {
      const version = await schemaVersion(client);
      if (version < SCHEMA_VERSION) {
        if (opts.migrate === 'never') throw new SchemaBehindError(version, 'RAGGUARD_PG_MIGRATE=never');
        let done: MigrateResult;
        try {
          done = await migrate(client, schemaOptions(dimension, opts));
        } catch (e) {
          if ((e as { code?: string }).code === INSUFFICIENT_PRIVILEGE) {
            throw new SchemaBehindError(version, `this role may not change it: ${(e as Error).message}`);
          }
          throw e;
        }
        if (done.applied.length > 0) {
          (opts.log ?? ((m: string) => console.warn(`[postgres-store] ${m}`)))(
            done.from === 0 ? `created the schema at ${where} (version ${done.to})`
              : `migrated the schema at ${where} from version ${done.from} to ${done.to}: ${done.applied.join('; ')}`);
        }
      } else if (version > SCHEMA_VERSION) {
        throw new Error(`the database's ragguard schema at ${where} is at version ${version}, newer than this build's ${SCHEMA_VERSION}: run a newer ragguard`);
      }
      const { rows } = await client.query<{ dims: number }>(
        "SELECT atttypmod AS dims FROM pg_attribute WHERE attrelid = 'ragguard_chunks'::regclass AND attname = 'embedding'");
      if (rows[0]?.dims !== dimension) {
        throw new Error(`PostgreSQL at ${where} holds ${rows[0]?.dims}-dimensional vectors but the embedder makes ${dimension}: ` +
          'point RAGGUARD_STORE at another database (or schema)');
      }
    } catch (e) {
      client.release();
      await pool.end();
      throw e;
    }
    let indexed: Set<string>;
    try {
      indexed = await validCollectionIndexes(client);
    } finally {
      client.release();
    }
    const { hnswM, hnswEfConstruction } = schemaOptions(dimension, opts);
    const store = new PostgresStore(pool, dimension, opts.bm25, where, efSearch, statementTimeoutMs, url, {
      rows: opts.collectionIndexRows ?? COLLECTION_INDEX_ROWS, hnswM, hnswEfConstruction,
      log: opts.log ?? ((m: string) => console.warn(`[postgres-store] ${m}`)),
    });
    store.indexed = indexed;
    // A search's settings are made in its own transaction: checked once here (pgvector 0.8 or later).
    const set = await store.settings().catch(async (e: Error) => {
      await pool.end();
      throw new Error(`PostgreSQL at ${where} did not take hnsw.iterative_scan = relaxed_order and hnsw.ef_search = ${efSearch}: ` +
        `${e.message} (pgvector 0.8 or later is needed)`);
    });
    if (set.iterativeScan !== 'relaxed_order' || set.efSearch !== efSearch) {
      await pool.end();
      throw new Error(`PostgreSQL at ${where} did not take hnsw.iterative_scan = relaxed_order and hnsw.ef_search = ${efSearch} ` +
        `(it has ${set.iterativeScan} and ${set.efSearch}): pgvector 0.8 or later is needed`);
    }
    return store;
  }

  /**
   * The settings a search runs with, read inside a search's own transaction (what the tests check): a
   * dense search of `collection` where given (its ef_search follows the collection's size), else the rest.
   */
  async settings(collection?: string): Promise<{ iterativeScan: string; efSearch: number }> {
    const read = "SELECT current_setting('hnsw.iterative_scan') AS s, current_setting('hnsw.ef_search') AS e";
    const rows = collection === undefined ? await this.searching<{ s: string; e: string }>(read)
      : await this.searchingDense<{ s: string; e: string }>(collection, read);
    return { iterativeScan: rows[0]!.s, efSearch: Number(rows[0]!.e) };
  }

  /**
   * Whether the database answers now (a trivial statement on a pooled connection); the reason when not.
   * For readiness: a replica whose database is down should not be sent queries.
   */
  async ready(): Promise<{ ok: true } | { ok: false; reason: string }> {
    try {
      await this.guard(() => this.pool.query('SELECT 1'));
      return { ok: true };
    } catch (e) {
      return { ok: false, reason: (e as Error).message };
    }
  }

  /**
   * Documents and chunks from the collections' figures (kept by every write's transaction: no count(*)).
   * The whole store's (GET /healthz probes them) are reused for COUNTS_TTL_MS, refreshed by this
   * instance's own writes, read by one query however many probes ask at once, and waited for at most
   * COUNTS_WAIT_MS: a liveness probe never hangs on a database that does not answer (it is told
   * StoreUnavailableError, and the read goes on to refresh the figures when it can).
   */
  async counts(collection?: string): Promise<StoreCounts> {
    if (collection !== undefined) return this.readCounts(collection);
    const now = Date.now();
    if (this.cachedCounts && now - this.cachedCounts.at < COUNTS_TTL_MS) return { ...this.cachedCounts.counts };
    const writes = this.writes;
    this.countsRead ??= this.readCounts().then((counts) => {
      // Not kept when this instance wrote meanwhile (the figures may be from before the write).
      if (writes === this.writes) this.cachedCounts = { at: now, counts };
      return counts;
    }).finally(() => {
      this.countsRead = undefined;
    });
    const read = this.countsRead;
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new StoreUnavailableError(
        `PostgreSQL at ${this.where} did not answer within ${COUNTS_WAIT_MS} ms`, RETRY_AFTER_S)), COUNTS_WAIT_MS);
      timer.unref();
    });
    read.catch(() => undefined); // a read given up on here still settles quietly
    try {
      return { ...(await Promise.race([read, late])) };
    } finally {
      clearTimeout(timer);
    }
  }

  private async readCounts(collection?: string): Promise<StoreCounts> {
    const where = collection === undefined ? '' : 'WHERE collection = $1';
    const params = collection === undefined ? [] : [collection];
    const { rows } = await this.guard(() => this.pool.query<{ documents: string; chunks: string }>(
      `SELECT coalesce(sum(documents), 0) AS documents, coalesce(sum(chunks), 0) AS chunks FROM ragguard_collection_stats ${where}`, params));
    return { documents: Number(rows[0]!.documents), chunks: Number(rows[0]!.chunks) };
  }

  async get(collection: string, docId: string): Promise<StoredDocument | undefined> {
    const { rows } = await this.guard(() => this.pool.query<DocumentRow>(
      `SELECT d.collection, d.doc_id, d.title, d.bytes, d.metadata,
              ARRAY(SELECT c.id FROM ragguard_chunks c WHERE c.collection = d.collection AND c.doc_id = d.doc_id ORDER BY c.ord) AS chunk_ids
       FROM ragguard_documents d WHERE d.collection = $1 AND d.doc_id = $2`, [collection, docId]));
    return rows[0] ? toDocument(rows[0]) : undefined;
  }

  async list(collection: string, offset: number, limit: number): Promise<{ documents: StoredDocument[]; total: number }> {
    // One statement: the page and the total from one snapshot.
    const { rows } = await this.guard(() => this.pool.query<{ total: string; page: DocumentRow[] }>(
      `SELECT coalesce((SELECT documents FROM ragguard_collection_stats WHERE collection = $1), 0) AS total,
              COALESCE((SELECT json_agg(p ORDER BY p.seq) FROM (
                SELECT d.seq, d.collection, d.doc_id, d.title, d.bytes, d.metadata,
                       ARRAY(SELECT c.id FROM ragguard_chunks c WHERE c.collection = d.collection AND c.doc_id = d.doc_id ORDER BY c.ord) AS chunk_ids
                FROM ragguard_documents d WHERE d.collection = $1 ORDER BY d.seq OFFSET $2 LIMIT $3) p), '[]'::json) AS page`,
      [collection, offset, limit]));
    return { documents: rows[0]!.page.map(toDocument), total: Number(rows[0]!.total) };
  }

  async chunksOf(collection: string, docId: string): Promise<StoredChunk[]> {
    const { rows } = await this.guard(() => this.pool.query<ChunkRow>(
      `SELECT ${CHUNK_COLUMNS}, 0 AS score FROM ragguard_chunks c JOIN ragguard_documents d ON d.collection = c.collection AND d.doc_id = c.doc_id
       WHERE c.collection = $1 AND c.doc_id = $2 ORDER BY c.ord`, [collection, docId]));
    return rows.map(toChunk);
  }

  addBatch(batch: readonly NewDocument[]): Promise<StoredDocument[]> {
    return this.writing(async (client) => {
      const delta: Delta = new Map();
      const seqs = await listPlaces(client, batch.length);
      const out: StoredDocument[] = [];
      for (const i of keyOrder(batch)) out[i] = await insertDocument(client, this.dimension, batch[i]!, seqs[i]!, delta);
      return { out, chunks: await applyDelta(client, delta) };
    }).then(({ out, chunks }) => {
      this.wantIndexes(chunks);
      return out;
    });
  }

  async replaceBatch(batch: readonly NewDocument[]): Promise<{ document: StoredDocument; replaced: boolean }[]> {
    // Two replicas replacing one new document at once: the later insert meets the earlier's row; once
    // that one has committed, a retry replaces it.
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.writing(async (client) => {
          const delta: Delta = new Map();
          const seqs = await listPlaces(client, batch.length);
          const out: { document: StoredDocument; replaced: boolean }[] = [];
          for (const i of keyOrder(batch)) {
            const doc = batch[i]!;
            const replaced = (await deleteDocument(client, doc.doc.collection ?? DEFAULT_COLLECTION, doc.doc.docId, delta)) !== undefined;
            out[i] = { document: await insertDocument(client, this.dimension, doc, seqs[i]!, delta), replaced };
          }
          this.wantIndexes(await applyDelta(client, delta));
          return out;
        });
      } catch (e) {
        if (!(e instanceof DocumentExistsError) || attempt >= 2) throw e;
      }
    }
  }

  remove(collection: string, docId: string): Promise<StoredDocument | undefined> {
    return this.writing(async (client) => {
      const delta: Delta = new Map();
      const removed = await deleteDocument(client, collection, docId, delta);
      await applyDelta(client, delta);
      return removed;
    });
  }

  searchDense(query: Float32Array, k: number, filter: SearchFilter): Promise<Hit[]> {
    return searchDense((statement) => this.searchingDense(filter.collection, statement), query, k, filter);
  }

  searchLexical(query: string, k: number, filter: SearchFilter): Promise<Hit[]> {
    return searchLexical((statement) => this.searching(statement), this.bm25, query, k, filter);
  }

  /**
   * Resolves once no collection index is being built or waiting to be (a bench or a test waits for it;
   * a collection another session is building, or whose build failed, is not waited for).
   */
  async indexesBuilt(): Promise<void> {
    while (this.indexing) await this.indexing;
  }

  /** The collections that have their own valid HNSW index, as this store last read the catalog. */
  hasCollectionIndex(collection: string): boolean {
    return this.indexed.has(collectionIndexName(collection));
  }

  /** After a committed write: each collection it left past the threshold without an index is queued for one. */
  private wantIndexes(chunks: Map<string, number>): void {
    if (this.indexDenied || this.closed) return;
    const now = Date.now();
    for (const [collection, n] of chunks) {
      if (n < this.indexOpts.rows || this.indexed.has(collectionIndexName(collection))) continue;
      if ((this.indexRetryAt.get(collection) ?? 0) > now) continue;
      this.indexQueue.add(collection);
    }
    if (this.indexQueue.size > 0 && !this.indexing) {
      this.indexing = this.buildIndexes().finally(() => {
        this.indexing = undefined;
      });
    }
  }

  /**
   * Builds the queued collections' indexes one at a time, in the background (a write never waits for one:
   * CREATE INDEX CONCURRENTLY lets writes go on meanwhile), on a connection of its own outside the pool
   * (a build holds it for seconds to minutes, and CONCURRENTLY cannot run in a transaction block).
   */
  private async buildIndexes(): Promise<void> {
    const { log, hnswM, hnswEfConstruction } = this.indexOpts;
    try {
      while (this.indexQueue.size > 0 && !this.closed && !this.indexDenied) {
        const collection = this.indexQueue.values().next().value!;
        this.indexQueue.delete(collection);
        try {
          this.indexClient ??= await this.connectForIndex();
          const valid = await buildCollectionIndex(this.indexClient, collection, { hnswM, hnswEfConstruction });
          this.indexed = await validCollectionIndexes(this.indexClient);
          if (!valid) this.indexRetryAt.set(collection, Date.now() + INDEX_RETRY_MS);
        } catch (e) {
          if (this.closed) return;
          if ((e as { code?: string }).code === INSUFFICIENT_PRIVILEGE) {
            this.indexDenied = true;
            this.indexQueue.clear();
            log(`collection '${collection}' has ${this.indexOpts.rows} chunks or more, past which it gets its own HNSW index, ` +
              `and this role may not build one (${(e as Error).message}): its searches are exact scans of the collection until ` +
              '`ragguard migrate` (with a role that owns the schema) builds the missing indexes');
            return;
          }
          log(`building the HNSW index of collection '${collection}' failed (tried again after a later write): ${(e as Error).message}`);
          this.indexRetryAt.set(collection, Date.now() + INDEX_RETRY_MS);
          await this.indexClient?.end().catch(() => undefined);
          this.indexClient = undefined;
        }
      }
    } finally {
      if (this.indexQueue.size === 0 || this.closed) {
        await this.indexClient?.end().catch(() => undefined);
        this.indexClient = undefined;
      }
    }
  }

  private async connectForIndex(): Promise<pg.Client> {
    const client = new pg.Client({ connectionString: this.url });
    client.on('error', () => undefined);
    await client.connect();
    return client;
  }

  async close(): Promise<void> {
    this.closed = true;
    // A build in flight is cut off (ending its connection cancels it): it leaves an invalid index, which
    // the next build drops and makes again.
    await this.indexClient?.end().catch(() => undefined);
    await this.indexing?.catch(() => undefined);
    await this.pool.end();
  }

  /** Runs `work`, its failures for want of the database as StoreUnavailableError. */
  private async guard<T>(work: () => Promise<T>): Promise<T> {
    try {
      return await work();
    } catch (e) {
      if (e instanceof StoreUnavailableError || !isUnavailable(e)) throw e;
      throw new StoreUnavailableError(`PostgreSQL at ${this.where} is unavailable: ${(e as Error).message}`, RETRY_AFTER_S, { cause: e });
    }
  }

  /** `statement` in a read-only transaction with the search settings (local to it): its rows. */
  private searching<R extends pg.QueryResultRow>(statement: string): Promise<R[]> {
    return this.guard(() => oneShot(this.pool, oneShotSql(this.searchSettings, statement)));
  }

  /** The same for a dense search of `collection`: ef_search from its size, set in the same round trip. */
  private searchingDense<R extends pg.QueryResultRow>(collection: string, statement: string): Promise<R[]> {
    const settings = searchSettingsSql({ efSearch: this.efSearch, statementTimeoutMs: this.statementTimeoutMs, collection });
    return this.guard(() => oneShot(this.pool, oneShotSql(settings, statement)));
  }

  /** A write's transaction (the statement timeout set for it); the cached counts go stale with it. */
  private async writing<T>(work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    try {
      return await this.guard(() => transaction(this.pool, this.writePreamble, work));
    } finally {
      this.writes++;
      this.cachedCounts = undefined;
    }
  }
}
