/**
 * The statements that open a Postgres transaction with its settings as SET LOCAL. A search's: read only,
 * pgvector's iterative scan, `ef_search`, the statement timeout and, for a dense search of one collection,
 * `ef_search` from that collection's size (pg-collection-index.ts). A write's: the statement timeout.
 * SET LOCAL: the settings hold for the transaction and end with it, so they travel with it through a
 * pooler in transaction mode (PgBouncer), where a session's SET stays on whichever server connection ran
 * it and the next transaction may run on another (at pgvector's default ef_search 40). A search sends
 * these, its statement and COMMIT as one string (pg-one-shot.ts). One source for the store and for
 * bench:scale-real's plan probe, so the plan the bench prints is the plan a search gets.
 */
import { collectionEfSearchSql } from './pg-collection-index.js';
import { intLiteral, textLiteral } from './pg-one-shot.js';

export function searchTransactionSql(opts: { efSearch: number; statementTimeoutMs: number; collection?: string }): string {
  const preamble = `BEGIN READ ONLY; SET LOCAL hnsw.iterative_scan = relaxed_order; SET LOCAL hnsw.ef_search = ${intLiteral(opts.efSearch)}; ` +
    `SET LOCAL statement_timeout = ${intLiteral(opts.statementTimeoutMs)}`;
  return opts.collection === undefined ? preamble : `${preamble}; ${collectionEfSearchSql(textLiteral(opts.collection), opts.efSearch)}`;
}

export function writeTransactionSql(opts: { statementTimeoutMs: number }): string {
  return `BEGIN; SET LOCAL statement_timeout = ${intLiteral(opts.statementTimeoutMs)}`;
}
