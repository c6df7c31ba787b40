/**
 * Where the per-key limits count (rate-limits.ts decides with what they count): requests and tokens per
 * key in fixed windows of one minute, keyed by the key's name and the window's start.
 *
 *   memory    this process's own counts (the embedded faiss store: one process, one allowance);
 *   postgres  a table of the Postgres store's database (ragguard_key_usage, migration 4 in
 *             retrieval/pg-schema.ts), shared by every replica pointed at it, so that N replicas give a
 *             key its limit once. Each count is one atomic statement (INSERT ... ON CONFLICT DO UPDATE
 *             ... RETURNING): the row's lock orders concurrent replicas, and the cap is checked on the
 *             row as it is when the update runs, so a key gets exactly its requests per window. The
 *             window is the database's clock's minute (every replica agrees on it whatever its own).
 *
 * A request is counted only while its window holds fewer than its cap (a refused request takes
 * nothing); tokens are added whatever the count (a generation is charged after it ran, so a window
 * may end above its allowance; the next window starts from zero). Old windows are deleted now and
 * then by whichever replica counts.
 */
import pg from 'pg';
import { StoreUnavailableError } from '../retrieval/retrieval-store.js';

export const WINDOW_MS = 60_000;

export type LimitCode = 'rate_limited' | 'token_limit';

/** What the limits tell as they decide (metrics.ts counts them by key name). */
export interface LimitEvents {
  /** A request let in, and tokens charged, by key name. */
  request?(key: string): void;
  tokens?(key: string, n: number): void;
  limited?(key: string, code: LimitCode): void;
}

/** A key's window after a count. */
export interface WindowUsage {
  /** Whether the request was counted (false: the window already held its cap). */
  counted: boolean;
  /** Requests counted in the window (undefined where the request was refused). */
  requests: number | undefined;
  /** Tokens charged in the window (undefined where the request was refused). */
  tokens: number | undefined;
  /** Milliseconds until the window ends (and the key's counts start again). */
  resetMs: number;
}

export interface UsageStore {
  readonly kind: 'memory' | 'postgres';
  /** Counts one request of `key` unless its window already holds `cap` (undefined: no cap); the window after. */
  countRequest(key: string, cap: number | undefined): Promise<WindowUsage>;
  /** Adds `n` tokens to `key`'s window. */
  addTokens(key: string, n: number): Promise<void>;
  /** The counts of `key`'s window now (tests, /debug). */
  usage(key: string): Promise<{ requests: number; tokens: number; resetMs: number }>;
  close(): Promise<void>;
}

/** This process's counts. */
export class MemoryUsageStore implements UsageStore {
  readonly kind = 'memory';
  private readonly windows = new Map<string, { start: number; requests: number; tokens: number }>();

  constructor(private readonly clock: () => number = Date.now) {}

  private window(key: string, now: number) {
    const start = now - (now % WINDOW_MS);
    let w = this.windows.get(key);
    if (!w || w.start !== start) {
      // Windows past are dropped as the keys come back (a key's own entry is replaced).
      this.windows.set(key, (w = { start, requests: 0, tokens: 0 }));
    }
    return w;
  }

  async countRequest(key: string, cap: number | undefined): Promise<WindowUsage> {
    const now = this.clock();
    const w = this.window(key, now);
    const resetMs = w.start + WINDOW_MS - now;
    if (cap !== undefined && w.requests >= cap) return { counted: false, requests: undefined, tokens: undefined, resetMs };
    w.requests += 1;
    return { counted: true, requests: w.requests, tokens: w.tokens, resetMs };
  }

  async addTokens(key: string, n: number): Promise<void> {
    this.window(key, this.clock()).tokens += n;
  }

  async usage(key: string) {
    const now = this.clock();
    const w = this.window(key, now);
    return { requests: w.requests, tokens: w.tokens, resetMs: w.start + WINDOW_MS - now };
  }

  async close(): Promise<void> {}
}

/** Windows older than this are deleted (an hour: enough to read a recent minute's counts by hand). */
const KEEP = '1 hour';
/** How often one replica deletes old windows (at most once a this many milliseconds). */
const PRUNE_EVERY_MS = 5 * 60_000;

/** The counts in the Postgres store's database, shared by the replicas. */
export class PostgresUsageStore implements UsageStore {
  readonly kind = 'postgres';
  private readonly pool: pg.Pool;
  private prunedAt = 0;

  /**
   * A small pool of its own on the store's URL (the store's pool is for searches and writes; a limit's
   * count must not wait behind them). Idle connections do not hold the process open.
   */
  constructor(url: string, opts: { connectTimeoutMs?: number; statementTimeoutMs?: number; poolSize?: number } = {}) {
    this.pool = new pg.Pool({
      connectionString: url, max: opts.poolSize ?? 4, allowExitOnIdle: true, idleTimeoutMillis: 10_000, keepAlive: true,
      ...(opts.connectTimeoutMs ? { connectionTimeoutMillis: opts.connectTimeoutMs } : {}),
      ...(opts.statementTimeoutMs ? { query_timeout: opts.statementTimeoutMs + 5000 } : {}),
    });
    this.pool.on('error', () => undefined);
  }

  private async query<R extends pg.QueryResultRow>(text: string, values: unknown[]): Promise<pg.QueryResult<R>> {
    try {
      return await this.pool.query<R>(text, values);
    } catch (e) {
      // The database not answering is the store's outage (503 with Retry-After), not a bug of the request.
      // Not an SQLSTATE (no code, or a socket's: ECONNREFUSED), or a connection, resource or operator class.
      const code = (e as { code?: string }).code;
      if (code === undefined || !/^[0-9A-Z]{5}$/.test(code) || /^(08|53|57)/.test(code)) {
        throw new StoreUnavailableError(`the per-key limits' counts could not be read from PostgreSQL: ${(e as Error).message}`, 2, { cause: e });
      }
      if (code === '42501') {
        throw new Error(`this role may not count per-key limits in ragguard_key_usage (${(e as Error).message}): ` +
          'GRANT SELECT, INSERT, UPDATE, DELETE ON ragguard_key_usage TO the server\'s role', { cause: e });
      }
      throw e;
    }
  }

  async countRequest(key: string, cap: number | undefined): Promise<WindowUsage> {
    this.prune();
    const { rows } = await this.query<{ requests: string | null; tokens: string | null; reset_ms: string }>(`
      WITH w AS (SELECT date_trunc('minute', clock_timestamp()) AS start, clock_timestamp() AS now),
      up AS (
        INSERT INTO ragguard_key_usage AS u (key_name, window_start, requests, tokens)
        SELECT $1, w.start, 1, 0 FROM w
        ON CONFLICT (key_name, window_start) DO UPDATE SET requests = u.requests + 1
          WHERE $2::bigint IS NULL OR u.requests < $2::bigint
        RETURNING u.requests, u.tokens)
      SELECT (SELECT requests FROM up) AS requests, (SELECT tokens FROM up) AS tokens,
             ceil(extract(epoch FROM w.start + interval '1 minute' - w.now) * 1000) AS reset_ms
      FROM w`, [key, cap ?? null]);
    const r = rows[0]!;
    const resetMs = Math.max(0, Number(r.reset_ms));
    if (r.requests === null) return { counted: false, requests: undefined, tokens: undefined, resetMs };
    return { counted: true, requests: Number(r.requests), tokens: Number(r.tokens), resetMs };
  }

  async addTokens(key: string, n: number): Promise<void> {
    await this.query(`
      INSERT INTO ragguard_key_usage AS u (key_name, window_start, requests, tokens)
      VALUES ($1, date_trunc('minute', clock_timestamp()), 0, $2)
      ON CONFLICT (key_name, window_start) DO UPDATE SET tokens = u.tokens + $2`, [key, n]);
  }

  async usage(key: string) {
    const { rows } = await this.query<{ requests: string | null; tokens: string | null; reset_ms: string }>(`
      WITH w AS (SELECT date_trunc('minute', clock_timestamp()) AS start, clock_timestamp() AS now)
      SELECT u.requests, u.tokens, ceil(extract(epoch FROM w.start + interval '1 minute' - w.now) * 1000) AS reset_ms
      FROM w LEFT JOIN ragguard_key_usage u ON u.key_name = $1 AND u.window_start = w.start`, [key]);
    const r = rows[0]!;
    return { requests: Number(r.requests ?? 0), tokens: Number(r.tokens ?? 0), resetMs: Number(r.reset_ms) };
  }

  /** Deletes old windows, at most every PRUNE_EVERY_MS per process, never holding a request up. */
  private prune(): void {
    const now = Date.now();
    if (now - this.prunedAt < PRUNE_EVERY_MS) return;
    this.prunedAt = now;
    void this.pool.query(`DELETE FROM ragguard_key_usage WHERE window_start < clock_timestamp() - interval '${KEEP}'`).catch(() => undefined);
  }

  async close(): Promise<void> {
    await this.pool.end();
  }
}
