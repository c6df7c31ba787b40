/**
 * The shared retrieval store: PostgreSQL with pgvector (RAGGUARD_STORE=postgres://...). Documents, chunks,
 * their vectors (an HNSW cosine index) and the lexical side all live in the database, so any number of
 * replicas read one index, and every read goes to it (nothing cached here goes stale: what another
 * replica committed is seen by the next query).
 *
 * The lexical side is BM25 kept in the database rather than Postgres full-text search: a postings table
 * (term, chunk, term frequency) written with each chunk, and the collection-wide figures (chunks, summed
 * lengths) in one row updated by the same transaction. A query computes Okapi BM25 in SQL with the terms,
 * lengths (distinct terms of "title\ntext") and idf the embedded store's MiniSearch uses (lexical.ts), so
 * both stores score alike and retrieval quality does not depend on the store; ts_rank is not BM25 (no
 * idf, no length normalisation of that form) and would rank differently.
 *
 * Writes are one transaction each (a whole batch, or nothing). Searches apply the filter in the WHERE
 * clause of the index scan; pgvector's iterative scan (hnsw.iterative_scan) keeps scanning the graph
 * until the LIMIT is met, and where the graph still comes up short (a very selective filter), an exact
 * scan of the matching rows fills top_k.
 */
import pg from 'pg';
import pgvector from 'pgvector';
import { lexicalTerms } from './lexical.js';
import {
  DEFAULT_COLLECTION, DocumentExistsError,
  type Bm25Params, type Hit, type Metadata, type NewDocument, type RetrievalStore, type SearchFilter, type StoreCounts,
  type StoredChunk, type StoredDocument,
} from './retrieval-store.js';

export interface PostgresStoreOptions {
  bm25: Bm25Params;
  /** Connections in the pool. */
  poolSize?: number;
  /** HNSW candidate list per scan (pgvector's hnsw.ef_search; higher: better recall, slower; default 1000, the most pgvector takes; RAGGUARD_PG_EF_SEARCH says why). */
  efSearch?: number;
}

/** Serialises schema creation between replicas starting at once. */
const SCHEMA_LOCK = 0x72616767; // 'ragg'

const UNIQUE_VIOLATION = '23505';

function schema(dimension: number): string {
  return `
    CREATE EXTENSION IF NOT EXISTS vector;
    CREATE TABLE IF NOT EXISTS ragguard_documents (
      collection text NOT NULL,
      doc_id text NOT NULL,
      seq bigserial NOT NULL,
      title text NOT NULL,
      bytes bigint NOT NULL,
      metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
      PRIMARY KEY (collection, doc_id)
    );
    CREATE INDEX IF NOT EXISTS ragguard_documents_seq ON ragguard_documents (collection, seq);
    CREATE TABLE IF NOT EXISTS ragguard_chunks (
      id bigserial PRIMARY KEY,
      collection text NOT NULL,
      doc_id text NOT NULL,
      ord int NOT NULL,
      text text NOT NULL,
      tokens int NOT NULL,
      locator text,
      -- the document's, copied so that a filter is a condition of the index scan itself
      metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
      -- distinct lexical terms of "title\\ntext": BM25's length
      nterms int NOT NULL,
      embedding vector(${dimension}) NOT NULL,
      FOREIGN KEY (collection, doc_id) REFERENCES ragguard_documents (collection, doc_id) ON DELETE CASCADE
    );
    CREATE INDEX IF NOT EXISTS ragguard_chunks_document ON ragguard_chunks (collection, doc_id, ord);
    CREATE INDEX IF NOT EXISTS ragguard_chunks_metadata ON ragguard_chunks USING gin (metadata jsonb_path_ops);
    CREATE INDEX IF NOT EXISTS ragguard_chunks_embedding ON ragguard_chunks USING hnsw (embedding vector_cosine_ops);
    CREATE TABLE IF NOT EXISTS ragguard_terms (
      term text NOT NULL,
      chunk_id bigint NOT NULL REFERENCES ragguard_chunks (id) ON DELETE CASCADE,
      tf int NOT NULL,
      PRIMARY KEY (term, chunk_id)
    );
    CREATE INDEX IF NOT EXISTS ragguard_terms_chunk ON ragguard_terms (chunk_id);
    CREATE TABLE IF NOT EXISTS ragguard_lexical_stats (
      one boolean PRIMARY KEY DEFAULT true CHECK (one),
      chunks bigint NOT NULL,
      total_terms bigint NOT NULL
    );
    INSERT INTO ragguard_lexical_stats VALUES (true, 0, 0) ON CONFLICT DO NOTHING;`;
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

/** BM25's view of a chunk: term frequencies and the number of distinct terms. */
function termsOf(title: string, text: string): { terms: Map<string, number>; distinct: number } {
  const terms = new Map<string, number>();
  for (const t of lexicalTerms(`${title}\n${text}`)) terms.set(t, (terms.get(t) ?? 0) + 1);
  return { terms, distinct: terms.size };
}

/** What a write changes of the corpus figures BM25 reads (chunks, summed lengths). */
interface LexicalDelta {
  chunks: number;
  terms: number;
}

/**
 * The one row of corpus figures, updated once, last in a write's transaction: concurrent writes (other
 * replicas) queue on it only for their commit, and never hold it while waiting on a document's row.
 */
async function applyDelta(client: pg.PoolClient, d: LexicalDelta): Promise<void> {
  if (d.chunks === 0 && d.terms === 0) return;
  await client.query('UPDATE ragguard_lexical_stats SET chunks = chunks + $1, total_terms = total_terms + $2', [d.chunks, d.terms]);
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

  private constructor(
    private readonly pool: pg.Pool,
    readonly dimension: number,
    private readonly bm25: Bm25Params,
    private readonly where: string,
  ) {}

  get indexDetail(): string {
    return `held by PostgreSQL at ${this.where} (pgvector HNSW, cosine)`;
  }

  /**
   * Connects, creates the schema where it is missing (tables, the HNSW index, the vector extension when
   * the role may) and checks that the stored vectors have the embedder's dimension.
   */
  static async open(url: string, dimension: number, opts: PostgresStoreOptions): Promise<PostgresStore> {
    const pool = new pg.Pool({ connectionString: url, max: opts.poolSize ?? 10 });
    // An idle connection the server closed (a restart, a failover) is an error on the pool, not a crash.
    pool.on('error', () => undefined);
    // Per connection, ahead of anything else on it (a client runs its queries in order); not as startup
    // options, which the URL's own ?options= would replace.
    const efSearch = opts.efSearch ?? 1000;
    // pgvector refuses a value outside 1..1000, and a connection would then search at its default of 40:
    // a recall far below the one asked for, silently (bench:scale at ef_search 1024 measured 0.75).
    if (!Number.isInteger(efSearch) || efSearch < 1 || efSearch > 1000) {
      throw new RangeError(`efSearch ${efSearch} is outside pgvector's hnsw.ef_search range (an integer in 1..1000)`);
    }
    pool.on('connect', (client) => {
      client.query(`SET hnsw.iterative_scan = relaxed_order; SET hnsw.ef_search = ${efSearch}`).catch(() => undefined);
    });
    let where = url;
    try {
      const u = new URL(url);
      where = `${u.hostname}:${u.port || 5432}${u.pathname}`;
    } catch { /* not a URL: keep it whole */ }
    const client = await pool.connect().catch(async (e: Error) => {
      await pool.end();
      throw new Error(`cannot connect to PostgreSQL at ${where}: ${e.message}`);
    });
    try {
      await client.query('BEGIN');
      await client.query('SELECT pg_advisory_xact_lock($1)', [SCHEMA_LOCK]);
      await client.query(schema(dimension));
      const { rows } = await client.query<{ dims: number }>(
        "SELECT atttypmod AS dims FROM pg_attribute WHERE attrelid = 'ragguard_chunks'::regclass AND attname = 'embedding'");
      if (rows[0]?.dims !== dimension) {
        throw new Error(`PostgreSQL at ${where} holds ${rows[0]?.dims}-dimensional vectors but the embedder makes ${dimension}: ` +
          'point RAGGUARD_STORE at another database (or schema)');
      }
      await client.query('COMMIT');
      // The settings are made as each connection opens, where a failure cannot be thrown: checked here.
      const set = await client.query<{ s: string; e: string }>("SELECT current_setting('hnsw.iterative_scan', true) AS s, current_setting('hnsw.ef_search', true) AS e");
      if (set.rows[0]?.s !== 'relaxed_order' || Number(set.rows[0]?.e) !== efSearch) {
        throw new Error(`PostgreSQL at ${where} did not take hnsw.iterative_scan = relaxed_order and hnsw.ef_search = ${efSearch} ` +
          `(it has ${set.rows[0]?.s ?? 'none'} and ${set.rows[0]?.e ?? 'none'}): pgvector 0.8 or later is needed`);
      }
    } catch (e) {
      await client.query('ROLLBACK').catch(() => undefined);
      client.release();
      await pool.end();
      throw e;
    }
    client.release();
    return new PostgresStore(pool, dimension, opts.bm25, where);
  }

  /** The search settings a connection of the pool runs with (what the tests check). */
  async settings(): Promise<{ iterativeScan: string; efSearch: number }> {
    const { rows } = await this.pool.query<{ s: string; e: string }>("SELECT current_setting('hnsw.iterative_scan') AS s, current_setting('hnsw.ef_search') AS e");
    return { iterativeScan: rows[0]!.s, efSearch: Number(rows[0]!.e) };
  }

  async counts(collection?: string): Promise<StoreCounts> {
    const where = collection === undefined ? '' : 'WHERE collection = $1';
    const params = collection === undefined ? [] : [collection];
    const { rows } = await this.pool.query<{ documents: string; chunks: string }>(
      `SELECT (SELECT count(*) FROM ragguard_documents ${where}) AS documents, (SELECT count(*) FROM ragguard_chunks ${where}) AS chunks`, params);
    return { documents: Number(rows[0]!.documents), chunks: Number(rows[0]!.chunks) };
  }

  async get(collection: string, docId: string): Promise<StoredDocument | undefined> {
    const { rows } = await this.pool.query<DocumentRow>(
      `SELECT d.collection, d.doc_id, d.title, d.bytes, d.metadata,
              ARRAY(SELECT c.id FROM ragguard_chunks c WHERE c.collection = d.collection AND c.doc_id = d.doc_id ORDER BY c.ord) AS chunk_ids
       FROM ragguard_documents d WHERE d.collection = $1 AND d.doc_id = $2`, [collection, docId]);
    return rows[0] ? toDocument(rows[0]) : undefined;
  }

  async list(collection: string, offset: number, limit: number): Promise<{ documents: StoredDocument[]; total: number }> {
    // One statement: the page and the total from one snapshot.
    const { rows } = await this.pool.query<{ total: string; page: DocumentRow[] }>(
      `SELECT (SELECT count(*) FROM ragguard_documents WHERE collection = $1) AS total,
              COALESCE((SELECT json_agg(p ORDER BY p.seq) FROM (
                SELECT d.seq, d.collection, d.doc_id, d.title, d.bytes, d.metadata,
                       ARRAY(SELECT c.id FROM ragguard_chunks c WHERE c.collection = d.collection AND c.doc_id = d.doc_id ORDER BY c.ord) AS chunk_ids
                FROM ragguard_documents d WHERE d.collection = $1 ORDER BY d.seq OFFSET $2 LIMIT $3) p), '[]'::json) AS page`,
      [collection, offset, limit]);
    return { documents: rows[0]!.page.map(toDocument), total: Number(rows[0]!.total) };
  }

  async chunksOf(collection: string, docId: string): Promise<StoredChunk[]> {
    const { rows } = await this.pool.query<ChunkRow>(
      `SELECT ${CHUNK_COLUMNS}, 0 AS score FROM ragguard_chunks c JOIN ragguard_documents d ON d.collection = c.collection AND d.doc_id = c.doc_id
       WHERE c.collection = $1 AND c.doc_id = $2 ORDER BY c.ord`, [collection, docId]);
    return rows.map(toChunk);
  }

  addBatch(batch: readonly NewDocument[]): Promise<StoredDocument[]> {
    return this.transaction(async (client) => {
      const delta: LexicalDelta = { chunks: 0, terms: 0 };
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
        return await this.transaction(async (client) => {
          const delta: LexicalDelta = { chunks: 0, terms: 0 };
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
    return this.transaction(async (client) => {
      const delta: LexicalDelta = { chunks: 0, terms: 0 };
      const removed = await this.delete(client, collection, docId, delta);
      await applyDelta(client, delta);
      return removed;
    });
  }

  async searchDense(query: Float32Array, k: number, filter: SearchFilter): Promise<Hit[]> {
    if (k <= 0) return [];
    const params: unknown[] = [pgvector.toSql(Array.from(query)), k];
    const where = filterSql(filter, params);
    const run = async (order: string) => (await this.pool.query<ChunkRow>(
      `WITH nearest AS MATERIALIZED (
         SELECT c.id, c.embedding <=> $1::vector AS distance FROM ragguard_chunks c WHERE ${where} ORDER BY ${order} LIMIT $2)
       SELECT ${CHUNK_COLUMNS}, 1 - n.distance AS score
       FROM nearest n JOIN ragguard_chunks c ON c.id = n.id JOIN ragguard_documents d ON d.collection = c.collection AND d.doc_id = c.doc_id
       ORDER BY n.distance, c.id`, params)).rows;
    // The HNSW scan (relaxed order: re-sorted above); the graph may give up before k rows pass a selective filter.
    let rows = await run('c.embedding <=> $1::vector');
    if (rows.length < k) {
      // An expression the index cannot order by: an exact scan of the rows that pass (via the btree/GIN indexes).
      rows = await run('(c.embedding <=> $1::vector) + 0');
    }
    return rows.map((r) => ({ chunk: toChunk(r), score: Number(r.score) }));
  }

  async searchLexical(query: string, k: number, filter: SearchFilter): Promise<Hit[]> {
    const terms = [...new Set(lexicalTerms(query))];
    if (k <= 0 || terms.length === 0) return [];
    const params: unknown[] = [terms, this.bm25.k1, this.bm25.b, k];
    const where = filterSql(filter, params);
    // Okapi BM25 with Lucene's idf over every chunk (as the embedded store's one MiniSearch index), lengths in distinct terms.
    const { rows } = await this.pool.query<ChunkRow>(
      `WITH st AS (
         SELECT chunks::float8 AS n, CASE WHEN chunks > 0 THEN total_terms::float8 / chunks ELSE 1 END AS avgdl FROM ragguard_lexical_stats),
       df AS (SELECT term, count(*)::float8 AS df FROM ragguard_terms WHERE term = ANY($1::text[]) GROUP BY term),
       scored AS (
         SELECT t.chunk_id AS id,
                sum(ln(1 + (st.n - df.df + 0.5) / (df.df + 0.5)) * t.tf * ($2::float8 + 1)
                    / (t.tf + $2::float8 * (1 - $3::float8 + $3::float8 * c.nterms / st.avgdl))) AS score
         FROM ragguard_terms t JOIN df ON df.term = t.term JOIN ragguard_chunks c ON c.id = t.chunk_id CROSS JOIN st
         WHERE t.term = ANY($1::text[]) AND ${where}
         GROUP BY t.chunk_id
         ORDER BY score DESC, t.chunk_id LIMIT $4)
       SELECT ${CHUNK_COLUMNS}, s.score
       FROM scored s JOIN ragguard_chunks c ON c.id = s.id JOIN ragguard_documents d ON d.collection = c.collection AND d.doc_id = c.doc_id
       ORDER BY s.score DESC, c.id`, params);
    return rows.map((r) => ({ chunk: toChunk(r), score: Number(r.score) }));
  }

  async close(): Promise<void> {
    await this.pool.end();
  }

  private async transaction<T>(work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    const client = await this.pool.connect();
    try {
      await client.query('BEGIN');
      const out = await work(client);
      await client.query('COMMIT');
      return out;
    } catch (e) {
      await client.query('ROLLBACK').catch(() => undefined);
      throw e;
    } finally {
      client.release();
    }
  }

  private async insert(client: pg.PoolClient, { doc, chunks, vectors }: NewDocument, seq: string, delta: LexicalDelta): Promise<StoredDocument> {
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
      await client.query('INSERT INTO ragguard_terms (term, chunk_id, tf) SELECT * FROM unnest($1::text[], $2::bigint[], $3::int[])', [terms, chunkIds, tfs]);
    }
    delta.chunks += chunks.length;
    delta.terms += lexical.reduce((s, l) => s + l.distinct, 0);
    return { collection, docId: doc.docId, title: doc.title, bytes: doc.bytes, metadata: { ...metadata }, chunkIds: ids };
  }

  private async delete(client: pg.PoolClient, collection: string, docId: string, delta: LexicalDelta): Promise<StoredDocument | undefined> {
    const { rows } = await client.query<DocumentRow & { chunks: string; total_terms: string | null }>(
      `SELECT d.collection, d.doc_id, d.title, d.bytes, d.metadata,
              ARRAY(SELECT c.id FROM ragguard_chunks c WHERE c.collection = d.collection AND c.doc_id = d.doc_id ORDER BY c.ord) AS chunk_ids,
              (SELECT count(*) FROM ragguard_chunks c WHERE c.collection = d.collection AND c.doc_id = d.doc_id) AS chunks,
              (SELECT sum(nterms) FROM ragguard_chunks c WHERE c.collection = d.collection AND c.doc_id = d.doc_id) AS total_terms
       FROM ragguard_documents d WHERE d.collection = $1 AND d.doc_id = $2 FOR UPDATE`, [collection, docId]);
    const row = rows[0];
    if (!row) return undefined;
    await client.query('DELETE FROM ragguard_documents WHERE collection = $1 AND doc_id = $2', [collection, docId]);
    delta.chunks -= Number(row.chunks);
    delta.terms -= Number(row.total_terms ?? 0);
    return toDocument(row);
  }
}
