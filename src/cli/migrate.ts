/**
 * `ragguard migrate`: brings the Postgres store's schema (RAGGUARD_STORE, or --store) to this build's
 * version, applying the missing migrations in order in one transaction (src/retrieval/pg-schema.ts), and
 * says what it applied. Run it with a role that owns the schema; the servers then need only select,
 * insert, update and delete (RAGGUARD_PG_MIGRATE=never makes them refuse a schema that is behind rather
 * than try).
 *
 * The vector column's dimension is the embedder's: read from the database when the schema exists, else
 * --dimension, else the configured embedder's (RAGGUARD_EMBEDDER, loaded once to ask it). HNSW m and
 * ef_construction come from RAGGUARD_PG_HNSW_M and RAGGUARD_PG_HNSW_EF_CONSTRUCTION.
 * --status only prints the database's version and this build's. --grant ROLE then gives ROLE what a
 * server needs and no more: select, insert, update and delete on the tables, and the sequences' use.
 */
import { parseArgs } from 'node:util';
import pg from 'pg';
import { loadConfig } from '../config/config.js';
import { Embedder } from '../retrieval/embedder.js';
import { SCHEMA_VERSION, schemaVersion } from '../retrieval/pg-schema.js';
import { grantServerRole, migrateDatabase } from '../retrieval/postgres-store.js';
import { storeLabel } from '../retrieval/open-store.js';

export class MigrateUsageError extends Error {}

export async function migrateCommand(args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args, allowPositionals: true,
    options: { store: { type: 'string' }, dimension: { type: 'string' }, json: { type: 'boolean' }, status: { type: 'boolean' }, grant: { type: 'string' } },
  });
  if (positionals.length > 0) throw new MigrateUsageError('migrate takes no arguments besides its options');
  const cfg = loadConfig();
  const url = values.store ?? cfg.store;
  if (!/^postgres(ql)?:\/\/./.test(url)) throw new MigrateUsageError('migrate is for the Postgres store: set RAGGUARD_STORE=postgres://... or give --store URL');
  let dimension: number | undefined;
  if (values.dimension !== undefined) {
    dimension = Number(values.dimension);
    if (!Number.isInteger(dimension) || dimension < 1 || dimension > 16000) throw new MigrateUsageError(`--dimension must be an integer in 1..16000, got '${values.dimension}'`);
  }
  const client = new pg.Client({ connectionString: url, ...(cfg.pgConnectTimeoutMs ? { connectionTimeoutMillis: cfg.pgConnectTimeoutMs } : {}) });
  const where = storeLabel(url);
  await client.connect().catch((e: Error) => {
    throw new Error(`cannot connect to PostgreSQL at ${where}: ${e.message}`);
  });
  let version: number;
  try {
    version = await schemaVersion(client);
    if (version >= 1 && dimension === undefined) {
      const { rows } = await client.query<{ dims: number }>(
        "SELECT atttypmod AS dims FROM pg_attribute WHERE attrelid = 'ragguard_chunks'::regclass AND attname = 'embedding'");
      dimension = rows[0]?.dims;
    }
  } finally {
    await client.end();
  }
  if (values.status) {
    const report = { store: where, version, latest: SCHEMA_VERSION };
    process.stdout.write(values.json ? `${JSON.stringify(report)}\n` : `${where}: schema version ${version}, this build's ${SCHEMA_VERSION}${version < SCHEMA_VERSION ? ' (ragguard migrate brings it forward)' : ''}\n`);
    return 0;
  }
  if (dimension === undefined && version < SCHEMA_VERSION) {
    dimension = (await Embedder.load(cfg.embedderPath, cfg.providers.embedder, { webgpuBufferCache: cfg.webgpuBufferCache })).dimension;
  }
  const r = await migrateDatabase(url, { dimension: dimension ?? 0, hnswM: cfg.pgHnswM, hnswEfConstruction: cfg.pgHnswEfConstruction, connectTimeoutMs: cfg.pgConnectTimeoutMs });
  if (values.grant !== undefined) await grantServerRole(url, values.grant);
  if (values.json) {
    process.stdout.write(`${JSON.stringify({ store: where, from: r.from, to: r.to, applied: r.applied, indexed: r.indexed, ...(values.grant !== undefined ? { granted: values.grant } : {}) })}\n`);
  } else if (r.applied.length === 0) {
    process.stdout.write(`${where}: schema at version ${r.to}, nothing to do\n`);
  } else {
    process.stdout.write(`${where}: schema migrated from version ${r.from} to ${r.to}:\n${r.applied.map((a) => `  ${a}`).join('\n')}\n`);
  }
  if (!values.json && r.indexed.length > 0) {
    process.stdout.write(`${where}: built the HNSW index of ${r.indexed.length} collection(s): ${r.indexed.join(', ')}\n`);
  }
  return 0;
}
