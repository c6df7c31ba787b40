/**
 * The Postgres store's schema, as ordered migrations. The database records the ones applied in
 * ragguard_schema_migrations (version, name, when); `ragguard migrate` applies the missing ones, in order,
 * in one transaction under an advisory lock (replicas starting at once, or a migrate beside a running
 * server, wait for each other; a failure leaves the schema as it was).
 *
 * The server does not need the right to change the schema: PostgresStore.open only reads the version
 * when it is current, so it opens with a role that may select, insert, update and delete and nothing
 * more. When the schema is behind and RAGGUARD_PG_MIGRATE is auto, the server tries the migrations
 * itself (saying so) and, when its role may not, stops saying to run `ragguard migrate`.
 *
 * Version 1 is the schema as it was created before there were migrations (its statements are the
 * same, IF NOT EXISTS), so a database made then is brought forward like a new one.
 */
import type pg from 'pg';
import { embeddingText } from './corpus.js';
import { lexicalTerms } from './lexical.js';
import { COLLECTION_INDEX_ROWS, collectionIndexSql, collectionsWanting } from './pg-collection-index.js';

export interface SchemaOptions {
  /** The embedder's dimension: the vector column's. */
  dimension: number;
  /** pgvector's HNSW build settings (m: links per node; ef_construction: candidates while inserting). */
  hnswM: number;
  hnswEfConstruction: number;
}

interface Migration {
  version: number;
  name: string;
  up(client: pg.ClientBase, opts: SchemaOptions): Promise<void>;
}

/** Serialises migrations between replicas starting at once and `ragguard migrate`. */
export const SCHEMA_LOCK = 0x72616767; // 'ragg'

export const MIGRATIONS: readonly Migration[] = [
  {
    version: 1,
    name: 'documents, chunks with their vectors (HNSW, cosine), BM25 postings',
    async up(client, o) {
      await client.query(`
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
          embedding vector(${o.dimension}) NOT NULL,
          FOREIGN KEY (collection, doc_id) REFERENCES ragguard_documents (collection, doc_id) ON DELETE CASCADE
        );
        CREATE INDEX IF NOT EXISTS ragguard_chunks_document ON ragguard_chunks (collection, doc_id, ord);
        CREATE INDEX IF NOT EXISTS ragguard_chunks_metadata ON ragguard_chunks USING gin (metadata jsonb_path_ops);
        CREATE INDEX IF NOT EXISTS ragguard_chunks_embedding ON ragguard_chunks USING hnsw (embedding vector_cosine_ops)
          WITH (m = ${o.hnswM}, ef_construction = ${o.hnswEfConstruction});
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
        INSERT INTO ragguard_lexical_stats VALUES (true, 0, 0) ON CONFLICT DO NOTHING;`);
    },
  },
  {
    version: 2,
    name: 'BM25 statistics per collection (postings keyed by collection; documents, chunks, lengths per collection)',
    async up(client) {
      await client.query(`
        CREATE TABLE ragguard_collection_stats (
          collection text PRIMARY KEY,
          documents bigint NOT NULL,
          chunks bigint NOT NULL,
          total_terms bigint NOT NULL
        );
        INSERT INTO ragguard_collection_stats (collection, documents, chunks, total_terms)
          SELECT d.collection, count(*),
                 coalesce(sum((SELECT count(*) FROM ragguard_chunks c WHERE c.collection = d.collection AND c.doc_id = d.doc_id)), 0),
                 coalesce(sum((SELECT sum(nterms) FROM ragguard_chunks c WHERE c.collection = d.collection AND c.doc_id = d.doc_id)), 0)
          FROM ragguard_documents d GROUP BY d.collection;
        ALTER TABLE ragguard_terms ADD COLUMN collection text;
        UPDATE ragguard_terms t SET collection = c.collection FROM ragguard_chunks c WHERE c.id = t.chunk_id;
        ALTER TABLE ragguard_terms ALTER COLUMN collection SET NOT NULL;
        ALTER TABLE ragguard_terms DROP CONSTRAINT ragguard_terms_pkey;
        ALTER TABLE ragguard_terms ADD PRIMARY KEY (collection, term, chunk_id);
        DROP TABLE ragguard_lexical_stats;`);
    },
  },
  {
    version: 3,
    name: 'Unicode terms (letters of every script, accents folded, CJK characters and pairs) for chunks with non-ASCII text',
    async up(client) {
      // On ASCII text the terms are those of before: only chunks whose title or text is not ASCII change.
      const { rows } = await client.query<{ id: string; collection: string; title: string; text: string; nterms: number }>(
        `SELECT c.id, c.collection, d.title, c.text, c.nterms FROM ragguard_chunks c
         JOIN ragguard_documents d ON d.collection = c.collection AND d.doc_id = c.doc_id
         WHERE c.text ~ '[^\\x01-\\x7f]' OR d.title ~ '[^\\x01-\\x7f]'`);
      const lengths = new Map<string, number>();
      for (const r of rows) {
        const { terms, distinct } = termsOf(r.title, r.text);
        await client.query('DELETE FROM ragguard_terms WHERE chunk_id = $1', [r.id]);
        await client.query(
          'INSERT INTO ragguard_terms (collection, term, chunk_id, tf) SELECT $1, u.term, $2, u.tf FROM unnest($3::text[], $4::int[]) AS u(term, tf)',
          [r.collection, r.id, [...terms.keys()], [...terms.values()]]);
        await client.query('UPDATE ragguard_chunks SET nterms = $1 WHERE id = $2', [distinct, r.id]);
        lengths.set(r.collection, (lengths.get(r.collection) ?? 0) + distinct - r.nterms);
      }
      for (const [collection, change] of lengths) {
        await client.query('UPDATE ragguard_collection_stats SET total_terms = total_terms + $2 WHERE collection = $1', [collection, change]);
      }
    },
  },
  {
    version: 4,
    name: 'per-key request and token counts in one-minute windows, shared by the replicas (server/limit-store.ts)',
    async up(client) {
      await client.query(`
        CREATE TABLE ragguard_key_usage (
          key_name text NOT NULL,
          window_start timestamptz NOT NULL,
          requests bigint NOT NULL DEFAULT 0,
          tokens bigint NOT NULL DEFAULT 0,
          PRIMARY KEY (key_name, window_start)
        );`);
      // The roles already given a server's rights on the store (ragguard migrate --grant) get the same here.
      const { rows } = await client.query<{ grantee: string }>(
        `SELECT DISTINCT grantee FROM information_schema.role_table_grants
         WHERE table_name = 'ragguard_chunks' AND table_schema = current_schema() AND privilege_type = 'INSERT'
           AND grantee <> current_user AND grantee <> 'PUBLIC'`);
      for (const r of rows) {
        await client.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON ragguard_key_usage TO ${client.escapeIdentifier(r.grantee)}`);
      }
    },
  },
  {
    version: 5,
    name: 'dense search per collection: an HNSW index per large collection (partial), the whole table\'s dropped (pg-collection-index.ts)',
    async up(client, o) {
      // Every search is filtered to one collection: the whole table's graph made its cost follow the
      // store's size and lost recall in each 1% collection; each write paid an insertion into it too.
      await client.query('DROP INDEX IF EXISTS ragguard_chunks_embedding');
      // Inside the migration's transaction (no CONCURRENTLY there): the collections already past the threshold.
      for (const collection of await collectionsWanting(client, COLLECTION_INDEX_ROWS)) {
        await client.query(collectionIndexSql(client, collection, o, false));
      }
    },
  },
];

/** The version this build reads and writes. */
export const SCHEMA_VERSION = MIGRATIONS[MIGRATIONS.length - 1]!.version;

/** BM25's view of a chunk: term frequencies and the number of distinct terms (its length). */
export function termsOf(title: string, text: string): { terms: Map<string, number>; distinct: number } {
  const terms = new Map<string, number>();
  for (const t of lexicalTerms(embeddingText(title, text))) terms.set(t, (terms.get(t) ?? 0) + 1);
  return { terms, distinct: terms.size };
}

/**
 * The schema version the database holds: 0 when it holds no ragguard tables, 1 when it holds those made
 * before migrations were recorded (that schema is version 1), else the highest applied.
 */
export async function schemaVersion(client: pg.ClientBase): Promise<number> {
  const { rows } = await client.query<{ migrations: string | null; chunks: string | null }>(
    "SELECT to_regclass('ragguard_schema_migrations')::text AS migrations, to_regclass('ragguard_chunks')::text AS chunks");
  if (rows[0]?.migrations) {
    const v = await client.query<{ v: number | null }>('SELECT max(version) AS v FROM ragguard_schema_migrations');
    return v.rows[0]?.v ?? 0;
  }
  return rows[0]?.chunks ? 1 : 0;
}

export interface MigrateResult {
  from: number;
  to: number;
  /** The migrations applied, "version: name". */
  applied: string[];
}

/**
 * Applies the missing migrations in order, in one transaction under the schema lock (concurrent callers
 * wait, then find nothing left to do). Refuses a database newer than this build.
 */
export async function migrate(client: pg.ClientBase, opts: SchemaOptions): Promise<MigrateResult> {
  await client.query('BEGIN');
  try {
    await client.query('SELECT pg_advisory_xact_lock($1)', [SCHEMA_LOCK]);
    const from = await schemaVersion(client);
    if (from > SCHEMA_VERSION) throw new SchemaTooNewError(from);
    await client.query(`CREATE TABLE IF NOT EXISTS ragguard_schema_migrations (
      version int PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`);
    const applied: string[] = [];
    for (const m of MIGRATIONS) {
      if (m.version <= from) continue;
      await m.up(client, opts);
      await client.query('INSERT INTO ragguard_schema_migrations (version, name) VALUES ($1, $2)', [m.version, m.name]);
      applied.push(`${m.version}: ${m.name}`);
    }
    // A database made before migrations were recorded: its version 1 is written down too.
    if (from === 1) {
      await client.query('INSERT INTO ragguard_schema_migrations (version, name) VALUES (1, $1) ON CONFLICT DO NOTHING', [MIGRATIONS[0]!.name]);
    }
    await client.query('COMMIT');
    return { from, to: SCHEMA_VERSION, applied };
  } catch (e) {
    await client.query('ROLLBACK').catch(() => undefined);
    throw e;
  }
}

export class SchemaTooNewError extends Error {
  constructor(readonly version: number) {
    super(`the database's ragguard schema is at version ${version}, newer than this build's ${SCHEMA_VERSION}: run a newer ragguard`);
  }
}

/** The schema is behind this build's and this process may not (or was told not to) bring it forward. */
export class SchemaBehindError extends Error {
  constructor(readonly version: number, reason: string) {
    super(`the database's ragguard schema is at version ${version}, this build needs ${SCHEMA_VERSION} (${reason}): ` +
      'run `ragguard migrate` with a role that owns the schema (RAGGUARD_STORE or --store names the database)');
  }
}
