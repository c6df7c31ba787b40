/** `ragguard migrate` against the Postgres store's database (cli/migrate.ts; postgres-store.ts re-exports these). */
import pg from 'pg';
import { migrate, type MigrateResult } from './pg-schema.js';

export function schemaOptions(dimension: number, opts: { hnswM?: number; hnswEfConstruction?: number }) {
  return { dimension, hnswM: opts.hnswM ?? 16, hnswEfConstruction: opts.hnswEfConstruction ?? 64 };
}

/**
 * `ragguard migrate`: brings the database's schema to this build's version (a role that owns the schema
 * or may create in it), saying what it applied.
 */
export async function migrateDatabase(url: string, opts: { dimension: number; hnswM?: number; hnswEfConstruction?: number; connectTimeoutMs?: number }): Promise<MigrateResult> {
  const client = new pg.Client({ connectionString: url, ...(opts.connectTimeoutMs ? { connectionTimeoutMillis: opts.connectTimeoutMs } : {}) });
  await client.connect();
  try {
    return await migrate(client, schemaOptions(opts.dimension, opts));
  } finally {
    await client.end();
  }
}

/**
 * What a server's role needs on a migrated schema, and no more: select, insert, update and delete on the
 * store's tables (the per-key limits' counts in ragguard_key_usage included), usage of their sequences
 * (`ragguard migrate --grant ROLE`).
 */
export async function grantServerRole(url: string, role: string): Promise<void> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const r = client.escapeIdentifier(role);
    await client.query(`BEGIN;
      GRANT SELECT, INSERT, UPDATE, DELETE ON ragguard_documents, ragguard_chunks, ragguard_terms, ragguard_collection_stats, ragguard_key_usage TO ${r};
      GRANT SELECT ON ragguard_schema_migrations TO ${r};
      GRANT USAGE, SELECT ON SEQUENCE ragguard_documents_seq_seq, ragguard_chunks_id_seq TO ${r};
      COMMIT`);
  } finally {
    await client.end();
  }
}
