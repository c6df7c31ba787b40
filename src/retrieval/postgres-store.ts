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
 * Nothing depends on a session's state: a search is one read-only transaction that makes its settings with
 * SET LOCAL (ef_search, the iterative scan, the statement timeout), so it runs as configured behind a pooler
 * in transaction mode (PgBouncer). The schema is versioned (pg-schema.ts): an open of a current schema only
 * reads, so the server's role needs DML rights alone. The database not answering is StoreUnavailableError
 * (a 503 store_unavailable), never a bug's 500.
 *
 * Writes are one transaction each (a whole batch, or nothing). Searches apply the filter in the WHERE
 * clause of the index scan; pgvector's iterative scan (hnsw.iterative_scan) keeps scanning the graph
 * until the LIMIT is met, and where the graph still comes up short (a very selective filter), an exact
 * scan of the matching rows fills top_k.
 */
import pg from 'pg';
import pgvector from 'pgvector';
import { lexicalTerms } from './lexical.js';
import { SchemaBehindError, SCHEMA_VERSION, migrate, schemaVersion, termsOf, type MigrateResult } from './pg-schema.js';
import {
  DEFAULT_COLLECTION, DocumentExistsError, StoreUnavailableError,
  type Bm25Params, type Hit, type Metadata, type NewDocument, type RetrievalStore, type SearchFilter, type StoreCounts,
  type StoredChunk, type StoredDocument,
} from './retrieval-store.js';

export interface PostgresStoreOptions {
  bm25: Bm25Params;
  /** Connections in the pool (RAGGUARD_PG_POOL_SIZE). */
  poolSize?: number;
  /** HNSW candidate list per scan (pgvector's hnsw.ef_search; higher: better recall, slower; default 1000, the most pgvector takes; RAGGUARD_PG_EF_SEARCH says why). */
  efSearch?: number;
  /** Milliseconds a new connection may take (RAGGUARD_PG_CONNECT_TIMEOUT_MS; 0: no limit). */
  connectTimeoutMs?: number;
  /** Milliseconds a statement may run (RAGGUARD_PG_STATEMENT_TIMEOUT_MS; 0: no limit). */
  statementTimeoutMs?: number;
  /** pgvector's HNSW build settings, for a new database's index (RAGGUARD_PG_HNSW_M, _EF_CONSTRUCTION). */
  hnswM?: number;
  hnswEfConstruction?: number;
  /** 'auto': bring a schema that is behind forward at open when the role may; 'never': refuse to open. */
  migrate?: 'auto' | 'never';
  /** Where open says what it did (a migration). */
  log?: (message: string) => void;
}

/** Seconds a 503 store_unavailable tells the client to wait. */
const RETRY_AFTER_S = 2;
/** How long the whole store's counts (GET /healthz) are reused. */
const COUNTS_TTL_MS = 2000;
/** How long a caller of the whole store's counts (a liveness probe) waits for the database. */
const COUNTS_WAIT_MS = 1000;

const UNIQUE_VIOLATION = '23505';
const INSUFFICIENT_PRIVILEGE = '42501';

/** pg's errors that mean the database did not answer, not that the request was wrong. */
const UNAVAILABLE_SQLSTATES = new Set(['57P01', '57P02', '57P03', '53300', '57014', '25006']);
const UNAVAILABLE_ERRNOS = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EHOSTUNREACH', 'ENETUNREACH', 'EAI_AGAIN']);
const UNAVAILABLE_MESSAGES = /Connection terminated|connection timeout|timeout exceeded when trying to connect|Query read timeout|not queryable|Connection ended|server closed the connection/i;

/** Whether an error from pg means the database is unavailable (down, restarting, unreachable, too slow). */
export function isUnavailable(e: unknown): boolean {
  const err = e as { code?: unknown; message?: unknown } | undefined;
  const code = typeof err?.code === 'string' ? err.code : '';
  if (code.startsWith('08') || UNAVAILABLE_SQLSTATES.has(code) || UNAVAILABLE_ERRNOS.has(code)) return true;
  if (e instanceof AggregateError) return e.errors.some(isUnavailable);
  return typeof err?.message === 'string' && UNAVAILABLE_MESSAGES.test(err.message);
}

interface ChunkRow {
  id: string;
  collection: string;
  doc_id: string;
  title: string;
  ord: number;
  text: string;
  tokens: number;
  locator: string | null;
  score: number;
}

interface DocumentRow {
  collection: string;
  doc_id: string;
  title: string;
  bytes: string | number;
  metadata: Metadata;
  chunk_ids: (string | number)[];
}

const CHUNK_COLUMNS = 'c.id, c.collection, c.doc_id, d.title, c.ord, c.text, c.tokens, c.locator';

function toChunk(r: ChunkRow): StoredChunk {
  return {
    id: Number(r.id), collection: r.collection, docId: r.doc_id, title: r.title, ord: r.ord, text: r.text, tokens: r.tokens,
    ...(r.locator !== null ? { locator: r.locator } : {}),
  };
}

function toDocument(r: DocumentRow): StoredDocument {
  return {
    collection: r.collection, docId: r.doc_id, title: r.title, bytes: Number(r.bytes), metadata: r.metadata,
    chunkIds: (r.chunk_ids ?? []).map(Number),
  };
}

/** The filter as SQL over the chunk alias `c`, its values appended to `params`. */
function filterSql(filter: SearchFilter, params: unknown[]): string {
  params.push(filter.collection);
  const parts = [`c.collection = $${params.length}`];
  for (const [field, cond] of Object.entries(filter.metadata ?? {})) {
    const values = typeof cond === 'object' ? cond.in : [cond];
    if (values.length === 0) return 'false';
    // Containment (@>) is what the GIN index answers; JSON keeps 1 and '1' apart, as the embedded store does.
    const alternatives = values.map((v) => {
      params.push(JSON.stringify({ [field]: v }));
      return `c.metadata @> $${params.length}::jsonb`;
    });
    parts.push(alternatives.length === 1 ? alternatives[0]! : `(${alternatives.join(' OR ')})`);
  }
  return parts.join(' AND ');
}

/** What a write changes of a collection's figures (documents; chunks and summed lengths, which BM25 reads). */
interface Figures {
  documents: number;
  chunks: number;
  terms: number;
}

/** A write's changes to the figures, by collection. */
type Delta = Map<string, Figures>;

function change(delta: Delta, collection: string, documents: number, chunks: number, terms: number): void {
  const f = delta.get(collection) ?? { documents: 0, chunks: 0, terms: 0 };
  f.documents += documents;
  f.chunks += chunks;
  f.terms += terms;
  delta.set(collection, f);
}

/**
 * The collections' rows of figures, updated last in a write's transaction and in collection order:
 * concurrent writes (other replicas) to one collection queue on its row only for their commit, never hold
 * it while waiting on a document's row, and never take two rows in opposite orders.
 */
async function applyDelta(client: pg.PoolClient, delta: Delta): Promise<void> {
  for (const collection of [...delta.keys()].sort()) {
    const f = delta.get(collection)!;
    if (f.documents === 0 && f.chunks === 0 && f.terms === 0) continue;
    await client.query(
      `INSERT INTO ragguard_collection_stats AS s (collection, documents, chunks, total_terms) VALUES ($1, $2, $3, $4)
       ON CONFLICT (collection) DO UPDATE SET documents = s.documents + $2, chunks = s.chunks + $3, total_terms = s.total_terms + $4`,
      [collection, f.documents, f.chunks, f.terms]);
  }
}

/** Places in the documents' listing order for a batch, in batch order (the rows are written in another order). */
async function listPlaces(client: pg.PoolClient, n: number): Promise<string[]> {
  const { rows } = await client.query<{ seq: string }>(
    "SELECT nextval(pg_get_serial_sequence('ragguard_documents', 'seq')) AS seq FROM generate_series(1, $1::int) ORDER BY 1", [n]);
  return rows.map((r) => r.seq);
}

/**
 * The batch's positions in (collection, doc id) order: every write takes its documents' row locks in
 * one global order, so two overlapping batches (from two replicas) wait for each other, never deadlock.
 */
function keyOrder(batch: readonly NewDocument[]): number[] {
  const key = (d: NewDocument) => [d.doc.collection ?? DEFAULT_COLLECTION, d.doc.docId] as const;
  return batch.map((_, i) => i).sort((x, y) => {
    const [cx, ix] = key(batch[x]!);
    const [cy, iy] = key(batch[y]!);
    return cx < cy ? -1 : cx > cy ? 1 : ix < iy ? -1 : ix > iy ? 1 : x - y;
  });
}

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
  /** Sent as one statement ahead of a search: its settings, for its transaction only. */
  private readonly searchPreamble: string;
  private readonly writePreamble: string;

  private constructor(
    private readonly pool: pg.Pool,
    readonly dimension: number,
    private readonly bm25: Bm25Params,
    private readonly where: string,
    efSearch: number,
    statementTimeoutMs: number,
  ) {
    // SET LOCAL: the settings hold for the transaction and end with it, so they travel with the search
    // through a pooler in transaction mode (PgBouncer), where a session's SET stays on whichever server
    // connection ran it and the next transaction may run on another (at pgvector's default ef_search 40).
    const timeout = `SET LOCAL statement_timeout = ${statementTimeoutMs}`;
    this.searchPreamble = `BEGIN READ ONLY; SET LOCAL hnsw.iterative_scan = relaxed_order; SET LOCAL hnsw.ef_search = ${efSearch}; ${timeout}`;
    this.writePreamble = `BEGIN; ${timeout}`;
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
    client.release();
    const store = new PostgresStore(pool, dimension, opts.bm25, where, efSearch, statementTimeoutMs);
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

  /** The settings a search runs with, read inside a search's own transaction (what the tests check). */
  async settings(): Promise<{ iterativeScan: string; efSearch: number }> {
    return this.searching(async (client) => {
      const { rows } = await client.query<{ s: string; e: string }>(
        "SELECT current_setting('hnsw.iterative_scan') AS s, current_setting('hnsw.ef_search') AS e");
      return { iterativeScan: rows[0]!.s, efSearch: Number(rows[0]!.e) };
    });
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
      for (const i of keyOrder(batch)) out[i] = await this.insert(client, batch[i]!, seqs[i]!, delta);
      await applyDelta(client, delta);
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
            const replaced = (await this.delete(client, doc.doc.collection ?? DEFAULT_COLLECTION, doc.doc.docId, delta)) !== undefined;
            out[i] = { document: await this.insert(client, doc, seqs[i]!, delta), replaced };
          }
          await applyDelta(client, delta);
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
      const removed = await this.delete(client, collection, docId, delta);
      await applyDelta(client, delta);
      return removed;
    });
  }

  async searchDense(query: Float32Array, k: number, filter: SearchFilter): Promise<Hit[]> {
    if (k <= 0) return [];
    const params: unknown[] = [pgvector.toSql(Array.from(query)), k];
    const where = filterSql(filter, params);
    const rows = await this.searching(async (client) => {
      const run = async (order: string) => (await client.query<ChunkRow>(
        `WITH nearest AS MATERIALIZED (
           SELECT c.id, c.embedding <=> $1::vector AS distance FROM ragguard_chunks c WHERE ${where} ORDER BY ${order} LIMIT $2)
         SELECT ${CHUNK_COLUMNS}, 1 - n.distance AS score
         FROM nearest n JOIN ragguard_chunks c ON c.id = n.id JOIN ragguard_documents d ON d.collection = c.collection AND d.doc_id = c.doc_id
         ORDER BY n.distance, c.id`, params)).rows;
      // The HNSW scan (relaxed order: re-sorted above); the graph may give up before k rows pass a selective filter.
      const found = await run('c.embedding <=> $1::vector');
      // An expression the index cannot order by: an exact scan of the rows that pass (via the btree/GIN indexes).
      return found.length < k ? run('(c.embedding <=> $1::vector) + 0') : found;
    });
    return rows.map((r) => ({ chunk: toChunk(r), score: Number(r.score) }));
  }

  async searchLexical(query: string, k: number, filter: SearchFilter): Promise<Hit[]> {
    const terms = [...new Set(lexicalTerms(query))];
    if (k <= 0 || terms.length === 0) return [];
    const params: unknown[] = [terms, this.bm25.k1, this.bm25.b, k, filter.collection];
    const where = filterSql(filter, params);
    // Okapi BM25 with Lucene's idf over the collection's chunks (as the embedded store's index of that
    // collection), lengths in distinct terms: every figure is the collection's own.
    const rows = await this.searching(async (client) => (await client.query<ChunkRow>(
      `WITH st AS (
         SELECT chunks::float8 AS n, CASE WHEN chunks > 0 THEN total_terms::float8 / chunks ELSE 1 END AS avgdl
         FROM ragguard_collection_stats WHERE collection = $5),
       df AS (SELECT term, count(*)::float8 AS df FROM ragguard_terms WHERE collection = $5 AND term = ANY($1::text[]) GROUP BY term),
       scored AS (
         SELECT t.chunk_id AS id,
                sum(ln(1 + (st.n - df.df + 0.5) / (df.df + 0.5)) * t.tf * ($2::float8 + 1)
                    / (t.tf + $2::float8 * (1 - $3::float8 + $3::float8 * c.nterms / st.avgdl))) AS score
         FROM ragguard_terms t JOIN df ON df.term = t.term JOIN ragguard_chunks c ON c.id = t.chunk_id CROSS JOIN st
         WHERE t.collection = $5 AND t.term = ANY($1::text[]) AND ${where}
         GROUP BY t.chunk_id
         ORDER BY score DESC, t.chunk_id LIMIT $4)
       SELECT ${CHUNK_COLUMNS}, s.score
       FROM scored s JOIN ragguard_chunks c ON c.id = s.id JOIN ragguard_documents d ON d.collection = c.collection AND d.doc_id = c.doc_id
       ORDER BY s.score DESC, c.id`, params)).rows);
    return rows.map((r) => ({ chunk: toChunk(r), score: Number(r.score) }));
  }

  async close(): Promise<void> {
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

  /** A read-only transaction with the search settings (SET LOCAL), on one pooled connection. */
  private searching<T>(work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    return this.transaction(this.searchPreamble, work);
  }

  /** A write's transaction (the statement timeout set for it); the cached counts go stale with it. */
  private async writing<T>(work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    try {
      return await this.transaction(this.writePreamble, work);
    } finally {
      this.writes++;
      this.cachedCounts = undefined;
    }
  }

  private transaction<T>(begin: string, work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    return this.guard(async () => {
      const client = await this.pool.connect();
      try {
        await client.query(begin);
        const out = await work(client);
        await client.query('COMMIT');
        client.release();
        return out;
      } catch (e) {
        // A connection that failed (or cannot roll back) is dropped, not handed to the next request.
        const rolledBack = isUnavailable(e) ? false : await client.query('ROLLBACK').then(() => true, () => false);
        client.release(rolledBack ? undefined : (e as Error));
        throw e;
      }
    });
  }

  private async insert(client: pg.PoolClient, { doc, chunks, vectors }: NewDocument, seq: string, delta: Delta): Promise<StoredDocument> {
    const collection = doc.collection ?? DEFAULT_COLLECTION;
    const metadata = doc.metadata ?? {};
    if (vectors.length !== chunks.length * this.dimension) throw new Error('one embedding per chunk expected');
    try {
      await client.query('INSERT INTO ragguard_documents (collection, doc_id, seq, title, bytes, metadata) VALUES ($1, $2, $3, $4, $5, $6)',
        [collection, doc.docId, seq, doc.title, doc.bytes, JSON.stringify(metadata)]);
    } catch (e) {
      // The transaction is aborted now: the caller's rollback drops the whole batch.
      if ((e as { code?: string }).code === UNIQUE_VIOLATION) throw new DocumentExistsError(doc.docId, collection);
      throw e;
    }
    const lexical = chunks.map((c) => termsOf(doc.title, c.text));
    const rows = chunks.length === 0 ? [] : (await client.query<{ id: string; ord: number }>(
      `INSERT INTO ragguard_chunks (collection, doc_id, ord, text, tokens, locator, metadata, nterms, embedding)
       SELECT $1, $2, u.ord, u.text, u.tokens, u.locator, $3::jsonb, u.nterms, u.embedding::vector
       FROM unnest($4::int[], $5::text[], $6::int[], $7::text[], $8::int[], $9::text[]) AS u(ord, text, tokens, locator, nterms, embedding)
       RETURNING id, ord`,
      [collection, doc.docId, JSON.stringify(metadata), chunks.map((_, i) => i), chunks.map((c) => c.text), chunks.map((c) => c.tokens),
        chunks.map((c) => c.locator ?? null), lexical.map((l) => l.distinct),
        chunks.map((_, i) => pgvector.toSql(Array.from(vectors.subarray(i * this.dimension, (i + 1) * this.dimension))))])).rows;
    const ids: number[] = [];
    for (const r of rows) ids[r.ord] = Number(r.id);
    const terms: string[] = [];
    const chunkIds: number[] = [];
    const tfs: number[] = [];
    lexical.forEach((l, ord) => {
      for (const [term, tf] of l.terms) {
        terms.push(term);
        chunkIds.push(ids[ord]!);
        tfs.push(tf);
      }
    });
    if (terms.length > 0) {
      await client.query('INSERT INTO ragguard_terms (collection, term, chunk_id, tf) SELECT $1, u.term, u.chunk_id, u.tf FROM unnest($2::text[], $3::bigint[], $4::int[]) AS u(term, chunk_id, tf)',
        [collection, terms, chunkIds, tfs]);
    }
    change(delta, collection, 1, chunks.length, lexical.reduce((s, l) => s + l.distinct, 0));
    return { collection, docId: doc.docId, title: doc.title, bytes: doc.bytes, metadata: { ...metadata }, chunkIds: ids };
  }

  private async delete(client: pg.PoolClient, collection: string, docId: string, delta: Delta): Promise<StoredDocument | undefined> {
    const { rows } = await client.query<DocumentRow & { chunks: string; total_terms: string | null }>(
      `SELECT d.collection, d.doc_id, d.title, d.bytes, d.metadata,
              ARRAY(SELECT c.id FROM ragguard_chunks c WHERE c.collection = d.collection AND c.doc_id = d.doc_id ORDER BY c.ord) AS chunk_ids,
              (SELECT count(*) FROM ragguard_chunks c WHERE c.collection = d.collection AND c.doc_id = d.doc_id) AS chunks,
              (SELECT sum(nterms) FROM ragguard_chunks c WHERE c.collection = d.collection AND c.doc_id = d.doc_id) AS total_terms
       FROM ragguard_documents d WHERE d.collection = $1 AND d.doc_id = $2 FOR UPDATE`, [collection, docId]);
    const row = rows[0];
    if (!row) return undefined;
    await client.query('DELETE FROM ragguard_documents WHERE collection = $1 AND doc_id = $2', [collection, docId]);
    change(delta, collection, -1, -Number(row.chunks), -Number(row.total_terms ?? 0));
    return toDocument(row);
  }
}

/** host:port/database of a URL, for messages (no credentials). */
function placeOf(url: string): string {
  try {
    const u = new URL(url);
    return `${u.hostname}:${u.port || 5432}${u.pathname}`;
  } catch {
    return 'the configured database';
  }
}

function schemaOptions(dimension: number, opts: Pick<PostgresStoreOptions, 'hnswM' | 'hnswEfConstruction'>) {
  return { dimension, hnswM: opts.hnswM ?? 16, hnswEfConstruction: opts.hnswEfConstruction ?? 64 };
}

/**
 * `ragguard migrate`: brings the database's schema to this build's version (a role that owns the schema
 * or may create in it), saying what it applied.
 */
export async function migrateDatabase(url: string, opts: { dimension: number; hnswM?: number; hnswEfConstruction?: number; connectTimeoutMs?: number }): Promise<MigrateResult> {
  const client = new pg.Client({ connectionString: url, ...(opts.connectTimeoutMs ? { connectionTimeoutMillis: opts.connectTimeoutMs } : {}) });
  await client.connect();
  try {
    return await migrate(client, schemaOptions(opts.dimension, opts));
  } finally {
    await client.end();
  }
}

/**
 * What a server's role needs on a migrated schema, and no more: select, insert, update and delete on the
 * store's tables (the per-key limits' counts in ragguard_key_usage included), usage of their sequences
 * (`ragguard migrate --grant ROLE`).
 */
export async function grantServerRole(url: string, role: string): Promise<void> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const r = client.escapeIdentifier(role);
    await client.query(`BEGIN;
      GRANT SELECT, INSERT, UPDATE, DELETE ON ragguard_documents, ragguard_chunks, ragguard_terms, ragguard_collection_stats, ragguard_key_usage TO ${r};
      GRANT SELECT ON ragguard_schema_migrations TO ${r};
      GRANT USAGE, SELECT ON SEQUENCE ragguard_documents_seq_seq, ragguard_chunks_id_seq TO ${r};
      COMMIT`);
  } finally {
    await client.end();
  }
}
