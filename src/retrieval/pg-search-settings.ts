/**
 * The statements that open a Postgres search's transaction: read only, with its settings as SET LOCAL
 * (pgvector's iterative scan, `ef_search`, the statement timeout) and, for a dense search of one collection,
 * `ef_search` from that collection's size (pg-collection-index.ts). SET LOCAL: the settings hold for the
 * transaction and end with it, so they travel with the search through a pooler in transaction mode
 * (PgBouncer), where a session's SET stays on whichever server connection ran it and the next transaction may
 * run on another (at pgvector's default ef_search 40). One source for the store and for bench:scale-real's
 * plan probe, so the plan the bench prints is the plan a search gets.
 */
import pg from 'pg';
import { collectionEfSearchSql } from './pg-collection-index.js';

export function searchTransactionSql(opts: { efSearch: number; statementTimeoutMs: number; collection?: string }): string {
  const preamble = `BEGIN READ ONLY; SET LOCAL hnsw.iterative_scan = relaxed_order; SET LOCAL hnsw.ef_search = ${opts.efSearch}; ` +
    `SET LOCAL statement_timeout = ${opts.statementTimeoutMs}`;
  return opts.collection === undefined ? preamble : `${preamble}; ${collectionEfSearchSql(pg.escapeLiteral(opts.collection), opts.efSearch)}`;
}
