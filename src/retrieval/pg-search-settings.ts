/**
 * The settings of a Postgres transaction, local to it. A search's: read only, pgvector's iterative scan,
 * `ef_search` (for a dense search of one collection, from that collection's size: pg-collection-index.ts)
 * and the statement timeout. A write's: the statement timeout.
 * Local (SET LOCAL, set_config(..., true)): the settings hold for the transaction and end with it, so they
 * travel with it through a pooler in transaction mode (PgBouncer), where a session's SET stays on
 * whichever server connection ran it and the next transaction may run on another (at pgvector's default
 * ef_search 40).
 * A search's settings are one SELECT of set_config calls, sent with the search's statement as one
 * simple-protocol query (pg-one-shot.ts): PostgreSQL runs the statements of such a query as one implicit
 * transaction, which the settings end with. One statement where BEGIN READ ONLY, three SET LOCALs, the
 * ef_search read and COMMIT were six: each statement of a query is parsed, planned and run on its own
 * (pgbench over 100 partial HNSW indexes, 8 clients: 667 -> 777 searches a second with the search reading
 * the chunks once, 821 with the settings as one statement as well). One source for the store and for bench:scale-real's plan
 * probe, so the plan the bench prints is the plan a search gets.
 */
import { collectionEfSearchValue } from './pg-collection-index.js';
import { intLiteral, textLiteral } from './pg-one-shot.js';

export function searchSettingsSql(opts: { efSearch: number; statementTimeoutMs: number; collection?: string }): string {
  // transaction_read_only may turn on after the transaction's first snapshot (only turning it off may not).
  const efSearch = opts.collection === undefined ? `'${intLiteral(opts.efSearch)}'`
    : `${collectionEfSearchValue(textLiteral(opts.collection), opts.efSearch)}::text`;
  return `SELECT set_config('transaction_read_only', 'on', true), set_config('hnsw.iterative_scan', 'relaxed_order', true), ` +
    `set_config('hnsw.ef_search', ${efSearch}, true), set_config('statement_timeout', '${intLiteral(opts.statementTimeoutMs)}', true)`;
}

export function writeTransactionSql(opts: { statementTimeoutMs: number }): string {
  return `BEGIN; SET LOCAL statement_timeout = ${intLiteral(opts.statementTimeoutMs)}`;
}
