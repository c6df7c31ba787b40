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

/** 10^i, exact doubles (to 10^22). */
const POW10 = Array.from({ length: 23 }, (_, i) => 10 ** i);
/** Bytes a component takes at most: a sign, 9 digits, a point, "e-45" and leading zeros ("0.00000") to spare. */
const MAX_COMPONENT_BYTES = 24;
const [MINUS, DOT, ZERO] = [0x2d, 0x2e, 0x30];

/**
 * Writes one float32 (`f`, finite, already rounded to float32) into `out` at `at` in at most 9 significant
 * digits, which always read back to it exactly (FLT_DECIMAL_DIG), trailing zeros dropped; returns the end.
 * pgvector stores float32s: a double's 17 digits (pgvector's toSql) would almost double the text for
 * nothing. It runs once per component of every query vector, so the usual range has a path of its own
 * (toPrecision, a regular expression and a string a component were a quarter of a search's time in Node,
 * bench:scale-real's profile): the value rounded to 9 digits in integer arithmetic, m / 10^d. m is within
 * half a unit of a·10^d (the product's double error is 1e-16 of it), a unit of m is at most 1e-8 of the
 * value, and a float32's neighbours are at least 6e-8 of it away: what is written reads back to it alone.
 */
function writeFloat32(out: Uint8Array, at: number, f: number): number {
  if (f === 0) {
    out[at] = ZERO;
    return at + 1;
  }
  const a = f < 0 ? -f : f;
  if (a >= 1e-6 && a < 1e8) {
    // d decimals for 9 significant digits; log10 may land a digit off next to a power of ten: checked.
    let d = 8 - Math.floor(Math.log10(a));
    let m = Math.round(a * POW10[d]!);
    if (m >= 1e9) m = Math.round(a * POW10[--d]!);
    else if (m < 1e8) m = Math.round(a * POW10[++d]!);
    if (m >= 1e8 && m < 1e9) {
      let n = m | 0;
      while (d > 0 && n % 10 === 0) {
        n = (n / 10) | 0;
        d--;
      }
      let digits = 1;
      for (let t = 10; t <= n; t *= 10) digits++;
      if (f < 0) out[at++] = MINUS;
      if (d >= digits) {
        out[at++] = ZERO;
        out[at++] = DOT;
        for (let z = d - digits; z > 0; z--) out[at++] = ZERO;
      }
      // The digits from the last, the point d from the end.
      const end = at + digits + (d > 0 && d < digits ? 1 : 0);
      let p = end;
      for (let i = 0; i < digits; i++) {
        if (i === d && d > 0 && d < digits) out[--p] = DOT;
        out[--p] = ZERO + (n % 10);
        n = (n / 10) | 0;
      }
      return end;
    }
  }
  const s = f.toPrecision(9);
  // Only the zeros that end a fraction: "100000000" (no point) and an exponent's "e-30" keep theirs.
  const e = s.indexOf('e');
  const mantissa = e < 0 ? s : s.slice(0, e);
  const text = (mantissa.includes('.') ? mantissa.replace(/\.?0+$/, '') : mantissa) + (e < 0 ? '' : s.slice(e));
  for (let i = 0; i < text.length; i++) out[at++] = text.charCodeAt(i);
  return at;
}

/** A float32 as writeFloat32 writes it; refuses NaN, the infinities and what float32 cannot hold. */
function checkedFloat32(x: number): number {
  if (!Number.isFinite(x)) throw new RangeError(`not a finite number in a vector: ${x}`);
  const f = Math.fround(x);
  if (!Number.isFinite(f)) throw new RangeError(`outside float32's range in a vector: ${x}`);
  return f;
}

/** One float32 in the fewest of 9 significant digits that read back to it exactly (writeFloat32). */
export function float32Text(x: number): string {
  const out = Buffer.allocUnsafe(MAX_COMPONENT_BYTES);
  return out.toString('latin1', 0, writeFloat32(out, 0, checkedFloat32(x)));
}

/** A query vector as a pgvector literal, '[x,y,...]'::vector; refuses NaN and the infinities. */
export function vectorLiteral(v: ArrayLike<number>): string {
  const out = Buffer.allocUnsafe(v.length * (MAX_COMPONENT_BYTES + 1) + 2);
  let at = 0;
  out[at++] = 0x5b; // [
  for (let i = 0; i < v.length; i++) {
    if (i > 0) out[at++] = 0x2c; // ,
    at = writeFloat32(out, at, checkedFloat32(v[i]!));
  }
  out[at++] = 0x5d; // ]
  return `'${out.toString('latin1', 0, at)}'::vector`;
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
