/**
 * A Postgres search as one round trip (postgres-store.ts): its settings and its statement are one
 * simple-protocol query string, run as one transaction. A transaction of several round trips keeps its
 * connection "idle in transaction" while Node turns between them, and under load that wait, not the
 * search, held the connections (bench:scale-real at 20k chunks: 1.1
 * connections executing a search on average, 5.5 idle in transaction). The simple protocol takes no bind
 * parameters, so a search's values are written into its text here, each by one writer: strings through
 * pg's escapeLiteral only, numbers checked finite (integers where an integer is meant) before they are
 * written, the query vector as pgvector's text form with float32's digits. Pure: no connection needed.
 */
import pg from 'pg';

/** `s` as an SQL string literal (pg's escapeLiteral: quotes doubled; a backslash makes it an E'' literal). */
export function textLiteral(s: string): string {
  if (typeof s !== 'string') throw new TypeError(`not a string: ${String(s)}`);
  return pg.escapeLiteral(s);
}

/** `n` as an SQL integer literal; refuses anything but a safe integer (NaN, Infinity, fractions). */
export function intLiteral(n: number): string {
  if (!Number.isSafeInteger(n)) throw new RangeError(`not an integer to write into SQL: ${n}`);
  return n < 0 ? `(${n})` : String(n);
}

/** `n` as an SQL float8; refuses NaN and the infinities. JS's shortest digits read back to the same double. */
export function floatLiteral(n: number): string {
  if (!Number.isFinite(n)) throw new RangeError(`not a finite number to write into SQL: ${n}`);
  return `${n < 0 ? `(${n})` : String(n)}::float8`;
}

/** `value` as JSON text in a jsonb literal. */
export function jsonbLiteral(value: unknown): string {
  const text = JSON.stringify(value);
  if (text === undefined) throw new TypeError('not a JSON value');
  return `${textLiteral(text)}::jsonb`;
}

/** A text[] literal of `items` (each through textLiteral). */
export function textArrayLiteral(items: readonly string[]): string {
  return items.length === 0 ? "'{}'::text[]" : `ARRAY[${items.map(textLiteral).join(',')}]::text[]`;
}

/**
 * One float32 in the fewest characters that read back to it exactly: 9 significant digits always do
 * (FLT_DECIMAL_DIG), trailing zeros dropped. pgvector stores float32s: a double's 17 digits (pgvector's
 * toSql) would almost double the text for nothing.
 */
export function float32Text(x: number): string {
  if (!Number.isFinite(x)) throw new RangeError(`not a finite number in a vector: ${x}`);
  const f = Math.fround(x);
  if (f === 0) return '0';
  if (!Number.isFinite(f)) throw new RangeError(`outside float32's range in a vector: ${x}`);
  const s = f.toPrecision(9);
  // Only the zeros that end a fraction: "100000000" (no point) and an exponent's "e-30" keep theirs.
  const e = s.indexOf('e');
  const mantissa = e < 0 ? s : s.slice(0, e);
  return (mantissa.includes('.') ? mantissa.replace(/\.?0+$/, '') : mantissa) + (e < 0 ? '' : s.slice(e));
}

/** A query vector as a pgvector literal, '[x,y,...]'::vector; refuses NaN and the infinities. */
export function vectorLiteral(v: ArrayLike<number>): string {
  const parts = new Array<string>(v.length);
  for (let i = 0; i < v.length; i++) parts[i] = float32Text(v[i]!);
  return `'[${parts.join(',')}]'::vector`;
}

/**
 * A search as one query string: `settings` (one SELECT of local set_configs, pg-search-settings.ts), then
 * `statement`. PostgreSQL runs the statements of a multi-statement query as one implicit transaction: it
 * commits after the last, or ends at a failed one (the rest skipped, nothing left open on the connection).
 * Nothing may follow the statement: oneShotRows takes the last result's rows. The settings' statement_timeout
 * times the statement on its own (PostgreSQL 13 and later time each statement of a query).
 */
export function oneShotSql(settings: string, statement: string): string {
  if (statement.trimEnd().endsWith(';')) throw new Error('a one-shot statement ends without a semicolon');
  return `${settings}; ${statement}`;
}

/** The rows of a one-shot search's statement, from what pg returns for the two-statement query. */
export function oneShotRows<R extends pg.QueryResultRow>(results: pg.QueryResult<R> | pg.QueryResult<R>[]): R[] {
  const all = Array.isArray(results) ? results : [results];
  if (all.length !== 2 || all[0]!.command !== 'SELECT' || all[0]!.rowCount !== 1) {
    throw new Error(`a one-shot search did not run as sent (its results: ${all.map((r) => `${r.command} ${r.rowCount}`).join(', ')})`);
  }
  return all[1]!.rows;
}
