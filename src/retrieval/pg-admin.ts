/** `ragguard migrate` against the Postgres store's database (library/migrate.ts; postgres-store.ts re-exports these). */
import pg from 'pg';
import { buildCollectionIndex, COLLECTION_INDEX_ROWS, collectionsWanting } from './pg-collection-index.js';
import { migrate, type MigrateResult } from './pg-schema.js';

export function schemaOptions(dimension: number, opts: { hnswM?: number; hnswEfConstruction?: number }) {
  return { dimension, hnswM: opts.hnswM ?? 16, hnswEfConstruction: opts.hnswEfConstruction ?? 64 };
}

/**
 * `ragguard migrate`: brings the database's schema to this build's version (a role that owns the schema
 * or may create in it), saying what it applied; then builds the HNSW index of each collection past the
 * threshold that has none (pg-collection-index.ts: a server whose role may not build them searches such
 * a collection exactly until this runs), CONCURRENTLY, so running servers keep writing meanwhile.
 */
export async function migrateDatabase(url: string, opts: { dimension: number; hnswM?: number; hnswEfConstruction?: number; connectTimeoutMs?: number }): Promise<MigrateResult & { indexed: string[] }> {
  const client = new pg.Client({ connectionString: url, ...(opts.connectTimeoutMs ? { connectionTimeoutMillis: opts.connectTimeoutMs } : {}) });
  await client.connect();
  try {
    const o = schemaOptions(opts.dimension, opts);
    const done = await migrate(client, o);
    const indexed: string[] = [];
    for (const collection of await collectionsWanting(client, COLLECTION_INDEX_ROWS)) {
      if (await buildCollectionIndex(client, collection, o)) indexed.push(collection);
    }
    return { ...done, indexed };
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
