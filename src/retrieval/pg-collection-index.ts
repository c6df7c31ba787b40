/**
 * The Postgres store's dense index per collection (postgres-store.ts): every search is filtered to one
 * collection, so one HNSW graph over the whole table made a search's cost follow the store and lost recall
 * (bench:scale-real at 1M rows in 100 collections: a collection is 1% of the graph, the filtered scan
 * walked mostly past other tenants' rows and stopped, recall@10 0.82 in the worst collection, p95 259 ms).
 * pgvector's answer for a filter of few distinct values is a partial index per value: here a collection
 * past COLLECTION_INDEX_ROWS chunks gets its own HNSW index
 *
 *   CREATE INDEX CONCURRENTLY ragguard_chunks_hnsw_<md5 of the name> ON ragguard_chunks
 *     USING hnsw (embedding vector_cosine_ops) WITH (m, ef_construction) WHERE collection = '<name>'
 *
 * which the planner uses for `collection = $n` (a search's statement is planned with its values), and a
 * smaller collection is searched exactly through the btree on (collection, doc_id, ord): at most that many
 * vectors, cheaper than a graph and exact. Either way a search reads its collection's rows only.
 *
 * Who builds them: the store, in the background, after a write leaves a collection past the threshold,
 * when its role owns the table (CREATE INDEX needs that); a server with a DML-only role cannot, says so
 * once, and searches such a collection exactly until `ragguard migrate` (which builds the missing ones)
 * runs. CONCURRENTLY: writes go on during the build (a plain CREATE INDEX would hold them for its whole
 * duration). Replicas that start one at once meet in the catalog (IF NOT EXISTS: one builds, the others
 * skip), which also works through PgBouncer, where a session's advisory lock would not; a build cut off
 * (a crash, a cancelled statement) leaves an invalid index, which the next build drops and starts again.
 *
 * Limits: each build reads the whole table twice (CONCURRENTLY's two passes), and the planner weighs
 * every partial index on a search: this is for up to some hundreds of large collections; past that,
 * partitioning the table by collection is the next step.
 */
import { createHash } from 'node:crypto';
import type pg from 'pg';

/** A collection with this many chunks or more gets its own HNSW index; below, its exact scan reads at most that many vectors. */
export const COLLECTION_INDEX_ROWS = 1000;

const PREFIX = 'ragguard_chunks_hnsw_';

/** The index's name: a hash of the collection's (any text; identifiers stop at 63 bytes). */
export function collectionIndexName(collection: string): string {
  return PREFIX + createHash('md5').update(collection).digest('hex').slice(0, 24);
}

/**
 * A dense search's hnsw.ef_search follows its collection's size: ceil(chunks / CHUNKS_PER_CANDIDATE),
 * within [EF_SEARCH_MIN, the configured most (RAGGUARD_PG_EF_SEARCH)]: 200 up to 10,000 chunks, the most
 * (1000) from 50,000. A collection's graph holds its own rows alone, and a graph of thousands of the
 * embedder's vectors reaches exact search's recall with far fewer candidates than one of a million:
 * bench:scale-real (16 clients while ingesting, recall@10 against exact search in every collection)
 * measured, at 100 collections of 1,000 chunks, recall min 1.0 at 200 (0.994 at 100) as at 1000, p95 37 ms
 * against 60 (708 queries/s against 408); at 20 of 10,000, min 0.994 at 200 against 0.9998 at 1000, p95
 * 50 ms against 148 (499 queries/s against 150). A single collection of 1M (bench:scale) needs 400-1000
 * for 0.95 and keeps the most. Uniform random vectors (no neighbourhoods, unlike any embedder's) are the
 * hard case: 0.94 at 200 over 5,000 of 384 dimensions; RAGGUARD_PG_EF_SEARCH below 200 caps it lower.
 */
export const EF_SEARCH_MIN = 200;
export const CHUNKS_PER_CANDIDATE = 50;

/**
 * The rule as one SQL expression of `chunks` (an SQL expression for the collection's chunk count): the
 * only definition, run by every dense search and evaluated by the tests.
 */
export function collectionEfSearchExpr(chunks: string, most: number): string {
  return `least(${Number(most)}, greatest(${EF_SEARCH_MIN}, ceil((${chunks}) / ${CHUNKS_PER_CANDIDATE}.0)))::int`;
}

/**
 * The rule's ef_search for a collection (`literal`: its name as an escaped SQL literal) as an SQL integer
 * expression, read from its row of ragguard_collection_stats in the search's own round trip; a collection
 * without one keeps `most`.
 */
export function collectionEfSearchValue(literal: string, most: number): string {
  return `coalesce((SELECT ${collectionEfSearchExpr('chunks', most)} FROM ragguard_collection_stats WHERE collection = ${literal}), ${Number(most)})`;
}

export interface HnswBuild {
  hnswM: number;
  hnswEfConstruction: number;
}

/** The names of the valid (built, usable by the planner) per-collection indexes. */
export async function validCollectionIndexes(client: pg.ClientBase): Promise<Set<string>> {
  const { rows } = await client.query<{ name: string }>(
    `SELECT c.relname AS name FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
     WHERE i.indrelid = 'ragguard_chunks'::regclass AND i.indisvalid AND c.relname LIKE $1`, [`${PREFIX}%`]);
  return new Set(rows.map((r) => r.name));
}

/** The statement that builds a collection's index (CONCURRENTLY: outside a transaction block only). */
export function collectionIndexSql(client: pg.ClientBase, collection: string, o: HnswBuild, concurrently: boolean): string {
  return `CREATE INDEX ${concurrently ? 'CONCURRENTLY ' : ''}IF NOT EXISTS ${collectionIndexName(collection)} ON ragguard_chunks
    USING hnsw (embedding vector_cosine_ops) WITH (m = ${Number(o.hnswM)}, ef_construction = ${Number(o.hnswEfConstruction)})
    WHERE collection = ${client.escapeLiteral(collection)}`;
}

/**
 * Builds a collection's index with CREATE INDEX CONCURRENTLY on `client` (a connection of its own, not in a
 * transaction), first dropping an invalid one that no build is filling (one cut off). Returns whether the
 * index is valid afterwards (false: another session is building it). Throws what Postgres says (42501
 * where the role does not own the table).
 */
export async function buildCollectionIndex(client: pg.ClientBase, collection: string, o: HnswBuild): Promise<boolean> {
  const name = collectionIndexName(collection);
  const { rows } = await client.query<{ valid: boolean; building: boolean }>(
    `SELECT i.indisvalid AS valid,
            EXISTS (SELECT 1 FROM pg_stat_progress_create_index p WHERE p.index_relid = i.indexrelid) AS building
     FROM pg_index i WHERE i.indexrelid = to_regclass($1)`, [name]);
  const found = rows[0];
  if (found?.valid) return true;
  if (found && found.building) return false;
  if (found) await client.query(`DROP INDEX CONCURRENTLY IF EXISTS ${name}`);
  await client.query(collectionIndexSql(client, collection, o, true));
  return (await validCollectionIndexes(client)).has(name);
}

/** The collections with at least `rows` chunks that have no valid index. */
export async function collectionsWanting(client: pg.ClientBase, rows: number): Promise<string[]> {
  const valid = await validCollectionIndexes(client);
  const { rows: big } = await client.query<{ collection: string }>(
    'SELECT collection FROM ragguard_collection_stats WHERE chunks >= $1 ORDER BY collection', [rows]);
  return big.map((r) => r.collection).filter((c) => !valid.has(collectionIndexName(c)));
}
