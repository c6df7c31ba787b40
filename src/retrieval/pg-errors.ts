/** The Postgres store's errors (postgres-store.ts): which of pg's mean the database did not answer, and the SQLSTATEs it tells apart. */

/** Seconds a 503 store_unavailable tells the client to wait. */
export const RETRY_AFTER_S = 2;

export const UNIQUE_VIOLATION = '23505';
export const INSUFFICIENT_PRIVILEGE = '42501';

/** pg's errors that mean the database did not answer, not that the request was wrong. */
const UNAVAILABLE_SQLSTATES = new Set(['57P01', '57P02', '57P03', '53300', '57014', '25006']);
const UNAVAILABLE_ERRNOS = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EHOSTUNREACH', 'ENETUNREACH', 'EAI_AGAIN']);
const UNAVAILABLE_MESSAGES = /Connection terminated|connection timeout|timeout exceeded when trying to connect|Query read timeout|not queryable|Connection ended|server closed the connection/i;

/** Whether an error from pg means the database is unavailable (down, restarting, unreachable, too slow). */
export function isUnavailable(e: unknown): boolean {
  const err = e as { code?: unknown; message?: unknown } | undefined;
  const code = typeof err?.code === 'string' ? err.code : '';
  if (code.startsWith('08') || UNAVAILABLE_SQLSTATES.has(code) || UNAVAILABLE_ERRNOS.has(code)) return true;
  if (e instanceof AggregateError) return e.errors.some(isUnavailable);
  return typeof err?.message === 'string' && UNAVAILABLE_MESSAGES.test(err.message);
}

/** host:port/database of a URL, for messages (no credentials). */
export function placeOf(url: string): string {
  try {
    const u = new URL(url);
    return `${u.hostname}:${u.port || 5432}${u.pathname}`;
  } catch {
    return 'the configured database';
  }
}
