/**
 * The Postgres store's schema as a library call (the CLI's `ragguard migrate`): `migrateStore` brings it
 * to this build's version, applying the missing migrations in order in one transaction
 * (retrieval/pg-schema.ts), and says what it applied; `storeSchema` only reads where it stands. Run it
 * with a role that owns the schema; the servers then need only select, insert, update and delete
 * (RAGGUARD_PG_MIGRATE=never makes them refuse a schema that is behind rather than try).
 *
 * The vector column's dimension is the embedder's: read from the database when the schema exists (a
 * `dimension` that differs is refused: a migration does not change it), else `dimension`, else the
 * configured embedder's (RAGGUARD_EMBEDDER, loaded once to ask it). HNSW m and
 * ef_construction come from RAGGUARD_PG_HNSW_M and RAGGUARD_PG_HNSW_EF_CONSTRUCTION. `grant` then gives
 * that role what a server needs and no more: select, insert, update and delete on the tables, and the
 * sequences' use.
 */
import { InvalidRequestError } from '../runtime/errors.js';
import { storeLabel } from '../retrieval/store-label.js';
import { resolveConfig, type RagguardOptions } from './ragguard.js';

export interface MigrateOptions extends RagguardOptions {
  /** The database (postgres://...); RAGGUARD_STORE's when left out. */
  store?: string;
  /** The vector column's dimension for a new schema (1..16000); else the configured embedder's. */
  dimension?: number | string;
  /** A role to give what a server needs, once migrated. */
  grant?: string;
}

export interface SchemaStatus {
  /** The database, without its password. */
  store: string;
  version: number;
  /** This build's version. */
  latest: number;
}

export interface MigrateResult {
  store: string;
  from: number;
  to: number;
  /** The migrations applied, in order ("3 collection_hnsw"). */
  applied: string[];
  /** The collections whose HNSW index was built. */
  indexed: string[];
  granted?: string;
}

/** Where the database's schema stands against this build's, with the vector column's dimension when it exists. */
export async function storeSchema(opts: MigrateOptions = {}): Promise<SchemaStatus & { dimension?: number }> {
  const { url, cfg } = target(opts);
  const [{ SCHEMA_VERSION, schemaVersion }, { default: pg }] = await Promise.all([import('../retrieval/pg-schema.js'), import('pg')]);
  const client = new pg.Client({ connectionString: url, ...(cfg.pgConnectTimeoutMs ? { connectionTimeoutMillis: cfg.pgConnectTimeoutMs } : {}) });
  const where = storeLabel(url);
  await client.connect().catch((e: Error) => {
    throw new Error(`cannot connect to PostgreSQL at ${where}: ${e.message}`);
  });
  try {
    const version = await schemaVersion(client);
    let dimension: number | undefined;
    if (version >= 1) {
      const { rows } = await client.query<{ dims: number }>(
        "SELECT atttypmod AS dims FROM pg_attribute WHERE attrelid = 'ragguard_chunks'::regclass AND attname = 'embedding'");
      dimension = rows[0]?.dims;
    }
    return { store: where, version, latest: SCHEMA_VERSION, ...(dimension === undefined ? {} : { dimension }) };
  } finally {
    await client.end();
  }
}

/** Brings the schema to this build's version (nothing to do when it is there), then grants `opts.grant`. */
export async function migrateStore(opts: MigrateOptions = {}): Promise<MigrateResult> {
  const { url, cfg } = target(opts);
  const asked = opts.dimension === undefined ? undefined : vectorDimension(opts.dimension);
  const status = await storeSchema(opts);
  if (asked !== undefined && status.dimension !== undefined && asked !== status.dimension) {
    throw new InvalidRequestError('dimension_mismatch',
      `the database's vectors have ${status.dimension} dimensions, not ${asked}: a migration does not change them (a new database, or the embedder of ${status.dimension})`);
  }
  let dimension = status.dimension ?? asked;
  if (dimension === undefined && status.version < status.latest) {
    const { Embedder } = await import('../retrieval/embedder.js');
    dimension = (await Embedder.load(cfg.embedderPath, cfg.providers.embedder, { webgpuBufferCache: cfg.webgpuBufferCache })).dimension;
  }
  const { grantServerRole, migrateDatabase } = await import('../retrieval/postgres-store.js');
  const r = await migrateDatabase(url, { dimension: dimension ?? 0, hnswM: cfg.pgHnswM, hnswEfConstruction: cfg.pgHnswEfConstruction, connectTimeoutMs: cfg.pgConnectTimeoutMs });
  if (opts.grant !== undefined) await grantServerRole(url, opts.grant);
  return { store: status.store, from: r.from, to: r.to, applied: r.applied, indexed: r.indexed, ...(opts.grant !== undefined ? { granted: opts.grant } : {}) };
}

/** A vector column's dimension, an integer in pgvector's 1..16000, given as a number or as text (a CLI option). */
function vectorDimension(value: number | string): number {
  const n = typeof value === 'string' && value.trim() !== '' ? Number(value) : value;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 1 || n > 16000) {
    throw new InvalidRequestError('invalid_dimension', `the dimension must be an integer in 1..16000, got ${JSON.stringify(value)}`);
  }
  return n;
}

function target(opts: MigrateOptions) {
  const cfg = resolveConfig(opts);
  const url = opts.store ?? cfg.store;
  if (!/^postgres(ql)?:\/\/./.test(url)) throw new InvalidRequestError('not_postgres', 'migrate is for the Postgres store: set RAGGUARD_STORE=postgres://... or give --store URL');
  return { url, cfg };
}
