/**
 * The Postgres store's searches (postgres-store.ts), each run in a search's read-only transaction: dense
 * (pgvector's HNSW scan, filled by an exact scan where a selective filter leaves it short) and lexical
 * (Okapi BM25 in SQL over the collection's own figures, as lexical.ts scores it).
 */
import type pg from 'pg';
import pgvector from 'pgvector';
import { lexicalTerms } from './lexical.js';
import { CHUNK_COLUMNS, toChunk, type ChunkRow } from './pg-rows.js';
import type { Bm25Params, Hit, SearchFilter } from './retrieval-store.js';

/** Runs a query in a search's transaction (the store's `searching`). */
export type Searching = <T>(work: (client: pg.PoolClient) => Promise<T>) => Promise<T>;

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

/**
 * The dense search's statement: `order` is the distance (an index may order by it) or an expression no
 * index orders by (an exact scan). The collection is a parameter: the statement is planned with its value,
 * so the planner takes that collection's own HNSW index where there is one (pg-collection-index.ts), else
 * scans the collection's rows through the btree on collection.
 */
export function denseStatement(query: Float32Array, k: number, filter: SearchFilter, exact = false): { text: string; params: unknown[] } {
  const params: unknown[] = [pgvector.toSql(Array.from(query)), k];
  const where = filterSql(filter, params);
  const order = exact ? '(c.embedding <=> $1::vector) + 0' : 'c.embedding <=> $1::vector';
  return {
    text: `WITH nearest AS MATERIALIZED (
         SELECT c.id, c.embedding <=> $1::vector AS distance FROM ragguard_chunks c WHERE ${where} ORDER BY ${order} LIMIT $2)
       SELECT ${CHUNK_COLUMNS}, 1 - n.distance AS score
       FROM nearest n JOIN ragguard_chunks c ON c.id = n.id JOIN ragguard_documents d ON d.collection = c.collection AND d.doc_id = c.doc_id
       ORDER BY n.distance, c.id`,
    params,
  };
}

/** The k nearest chunks by cosine similarity that pass the filter, best first. */
export async function searchDense(searching: Searching, query: Float32Array, k: number, filter: SearchFilter): Promise<Hit[]> {
  if (k <= 0) return [];
  const rows = await searching(async (client) => {
    const run = async (exact: boolean) => {
      const { text, params } = denseStatement(query, k, filter, exact);
      return (await client.query<ChunkRow>(text, params)).rows;
    };
    // The HNSW scan (relaxed order: re-sorted above); the graph may give up before k rows pass a selective filter.
    const found = await run(false);
    // An expression the index cannot order by: an exact scan of the rows that pass (via the btree/GIN indexes).
    return found.length < k ? run(true) : found;
  });
  return rows.map((r) => ({ chunk: toChunk(r), score: Number(r.score) }));
}

/** The k best chunks by BM25 that pass the filter, best first. */
export async function searchLexical(searching: Searching, bm25: Bm25Params, query: string, k: number, filter: SearchFilter): Promise<Hit[]> {
  const terms = [...new Set(lexicalTerms(query))];
  if (k <= 0 || terms.length === 0) return [];
  const params: unknown[] = [terms, bm25.k1, bm25.b, k, filter.collection];
  const where = filterSql(filter, params);
  // Okapi BM25 with Lucene's idf over the collection's chunks (as the embedded store's index of that
  // collection), lengths in distinct terms: every figure is the collection's own.
  const rows = await searching(async (client) => (await client.query<ChunkRow>(
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
