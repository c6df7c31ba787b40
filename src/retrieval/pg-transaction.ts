/**
 * The Postgres store's transactions on a pooled connection (postgres-store.ts): a search's, sent whole as
 * one query (pg-one-shot.ts), and a write's, whose statements follow from each other's results.
 * A search's query is an implicit transaction: a failed statement ends it on the server, and the connection
 * is idle again when the error arrives. A write's transaction block stays aborted on its connection after a
 * failed statement: it rolls back before the connection goes back to the pool, so the next request does not
 * meet it. A connection that failed, or cannot roll back, is dropped.
 */
import type pg from 'pg';
import { oneShotRows } from './pg-one-shot.js';
import { isUnavailable } from './pg-errors.js';

/** `sql`, a search's settings and statement (oneShotSql), in one round trip: the rows of its statement. */
export async function oneShot<R extends pg.QueryResultRow>(pool: pg.Pool, sql: string): Promise<R[]> {
  const client = await pool.connect();
  let results: pg.QueryResult<R> | pg.QueryResult<R>[];
  try {
    results = await client.query<R>(sql);
  } catch (e) {
    client.release(isUnavailable(e) ? (e as Error) : undefined);
    throw e;
  }
  client.release();
  return oneShotRows(results);
}

/** `work` between `begin` (BEGIN and its SET LOCALs) and COMMIT, on one connection. */
export async function transaction<T>(pool: pg.Pool, begin: string, work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  try {
    await client.query(begin);
    const out = await work(client);
    await client.query('COMMIT');
    client.release();
    return out;
  } catch (e) {
    await giveBack(client, e);
    throw e;
  }
}

async function giveBack(client: pg.PoolClient, e: unknown): Promise<void> {
  const rolledBack = isUnavailable(e) ? false : await client.query('ROLLBACK').then(() => true, () => false);
  client.release(rolledBack ? undefined : (e as Error));
}
