/**
 * The Postgres store's searches (postgres-store.ts), each a statement run by the store's one-round-trip
 * search transaction (pg-one-shot.ts), its values written into its text: dense (pgvector's HNSW scan,
 * filled by an exact scan where a selective filter leaves it short) and lexical (Okapi BM25 in SQL over the
 * collection's own figures, as lexical.ts scores it).
 */
import type pg from 'pg';
import { lexicalTerms } from './lexical.js';
import { floatLiteral, intLiteral, jsonbLiteral, textArrayLiteral, textLiteral, vectorLiteral } from './pg-one-shot.js';
import { CHUNK_COLUMNS, CHUNK_TABLE_COLUMNS, toChunk, type ChunkRow } from './pg-rows.js';
import type { Bm25Params, Hit, SearchFilter } from './retrieval-store.js';

/** Runs a search's statement in a search's transaction, one round trip (the store's `searching`): its rows. */
export type Searching = <R extends pg.QueryResultRow>(statement: string) => Promise<R[]>;

/** The filter as SQL over the chunk alias `c`, its values as literals. */
function filterSql(filter: SearchFilter): string {
  const parts = [`c.collection = ${textLiteral(filter.collection)}`];
  for (const [field, cond] of Object.entries(filter.metadata ?? {})) {
    const values = typeof cond === 'object' ? cond.in : [cond];
    if (values.length === 0) return 'false';
    // Containment (@>) is what the GIN index answers; JSON keeps 1 and '1' apart, as the embedded store does.
    const alternatives = values.map((v) => `c.metadata @> ${jsonbLiteral({ [field]: v })}`);
    parts.push(alternatives.length === 1 ? alternatives[0]! : `(${alternatives.join(' OR ')})`);
  }
  return parts.join(' AND ');
}

/**
 * The dense search's statement: `order` is the distance (an index may order by it) or an expression no
 * index orders by (an exact scan). The collection is a literal: the statement is planned with its value,
 * so the planner takes that collection's own HNSW index where there is one (pg-collection-index.ts), else
 * scans the collection's rows through the btree on collection. ragguard_chunks appears once: the planner
 * opens and weighs every index of a table for each of its references, and with a partial HNSW index per
 * collection a second reference (a join back by id for the columns) cost more planning than the join
 * saved (0.26 against 0.17 ms a plan over 100 partial indexes). The scan reads the chunk's columns of
 * the k rows it returns only; the documents join outside, after the limit, so it cannot change the plan.
 */
export function denseStatement(query: Float32Array, k: number, filter: SearchFilter, exact = false): string {
  return denseSql(vectorLiteral(query), k, filter, exact);
}

/** denseStatement with the query's vector literal already written (the exact fill reuses the first statement's). */
function denseSql(vector: string, k: number, filter: SearchFilter, exact: boolean): string {
  const where = filterSql(filter);
  const order = exact ? `(c.embedding <=> ${vector}) + 0` : 'distance';
  return `WITH nearest AS MATERIALIZED (
         SELECT ${CHUNK_TABLE_COLUMNS}, c.embedding <=> ${vector} AS distance FROM ragguard_chunks c WHERE ${where} ORDER BY ${order} LIMIT ${intLiteral(k)})
       SELECT ${CHUNK_COLUMNS}, 1 - c.distance AS score
       FROM nearest c JOIN ragguard_documents d ON d.collection = c.collection AND d.doc_id = c.doc_id
       ORDER BY c.distance, c.id`;
}

/**
 * The k nearest chunks by cosine similarity that pass the filter, best first. `searching` runs a statement
 * in a dense search's transaction (ef_search by the collection's size).
 */
export async function searchDense(searching: Searching, query: Float32Array, k: number, filter: SearchFilter): Promise<Hit[]> {
  if (k <= 0) return [];
  // The HNSW scan (relaxed order: re-sorted above); the graph may give up before k rows pass a selective filter.
  const vector = vectorLiteral(query);
  let rows = await searching<ChunkRow>(denseSql(vector, k, filter, false));
  // Then an expression the index cannot order by: an exact scan of the rows that pass (via the btree/GIN
  // indexes), in a transaction of its own, as it follows from the first one's count.
  if (rows.length < k) rows = await searching<ChunkRow>(denseSql(vector, k, filter, true));
  return rows.map((r) => ({ chunk: toChunk(r), score: Number(r.score) }));
}

/** The k best chunks by BM25 that pass the filter, best first. */
export async function searchLexical(searching: Searching, bm25: Bm25Params, query: string, k: number, filter: SearchFilter): Promise<Hit[]> {
  const terms = [...new Set(lexicalTerms(query))];
  if (k <= 0 || terms.length === 0) return [];
  const [termList, k1, b, limit, collection] = [textArrayLiteral(terms), floatLiteral(bm25.k1), floatLiteral(bm25.b), intLiteral(k), textLiteral(filter.collection)];
  const where = filterSql(filter);
  // Okapi BM25 with Lucene's idf over the collection's chunks (as the embedded store's index of that
  // collection), lengths in distinct terms: every figure is the collection's own.
  const rows = await searching<ChunkRow>(
    `WITH st AS (
       SELECT chunks::float8 AS n, CASE WHEN chunks > 0 THEN total_terms::float8 / chunks ELSE 1 END AS avgdl
       FROM ragguard_collection_stats WHERE collection = ${collection}),
     df AS (SELECT term, count(*)::float8 AS df FROM ragguard_terms WHERE collection = ${collection} AND term = ANY(${termList}) GROUP BY term),
     scored AS (
       SELECT t.chunk_id AS id,
              sum(ln(1 + (st.n - df.df + 0.5) / (df.df + 0.5)) * t.tf * (${k1} + 1)
                  / (t.tf + ${k1} * (1 - ${b} + ${b} * c.nterms / st.avgdl))) AS score
       FROM ragguard_terms t JOIN df ON df.term = t.term JOIN ragguard_chunks c ON c.id = t.chunk_id CROSS JOIN st
       WHERE t.collection = ${collection} AND t.term = ANY(${termList}) AND ${where}
       GROUP BY t.chunk_id
       ORDER BY score DESC, t.chunk_id LIMIT ${limit})
     SELECT ${CHUNK_COLUMNS}, s.score
     FROM scored s JOIN ragguard_chunks c ON c.id = s.id JOIN ragguard_documents d ON d.collection = c.collection AND d.doc_id = c.doc_id
     ORDER BY s.score DESC, c.id`);
  return rows.map((r) => ({ chunk: toChunk(r), score: Number(r.score) }));
}
