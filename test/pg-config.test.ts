/**
 * The Postgres store's settings: defaults, bounds, and the one rule across two of them (pgvector refuses an
 * HNSW ef_construction under 2 x m); open-store passes every one to the store.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ConfigError, loadConfig } from '../src/config/config.js';

test('defaults of the Postgres store settings', () => {
  const c = loadConfig({});
  assert.deepEqual(
    [c.pgPoolSize, c.pgConnectTimeoutMs, c.pgStatementTimeoutMs, c.pgHnswM, c.pgHnswEfConstruction, c.pgMigrate],
    [10, 5000, 30000, 16, 64, 'auto'],
  );
});

test('values set, and values refused with the variable named', () => {
  const c = loadConfig({
    RAGGUARD_PG_POOL_SIZE: '3', RAGGUARD_PG_CONNECT_TIMEOUT_MS: '0', RAGGUARD_PG_STATEMENT_TIMEOUT_MS: '1500',
    RAGGUARD_PG_HNSW_M: '24', RAGGUARD_PG_HNSW_EF_CONSTRUCTION: '200', RAGGUARD_PG_MIGRATE: 'never',
  });
  assert.deepEqual([c.pgPoolSize, c.pgConnectTimeoutMs, c.pgStatementTimeoutMs, c.pgHnswM, c.pgHnswEfConstruction, c.pgMigrate], [3, 0, 1500, 24, 200, 'never']);
  for (const [name, value, why] of [
    ['RAGGUARD_PG_POOL_SIZE', '0', /RAGGUARD_PG_POOL_SIZE/],
    ['RAGGUARD_PG_STATEMENT_TIMEOUT_MS', '-1', /RAGGUARD_PG_STATEMENT_TIMEOUT_MS/],
    ['RAGGUARD_PG_MIGRATE', 'sometimes', /RAGGUARD_PG_MIGRATE/],
    ['RAGGUARD_PG_HNSW_EF_CONSTRUCTION', '20', /RAGGUARD_PG_HNSW_EF_CONSTRUCTION: must be at least 2 x RAGGUARD_PG_HNSW_M/],
  ] as const) {
    assert.throws(() => loadConfig({ [name]: value }), (e) => e instanceof ConfigError && why.test(e.message), `${name}=${value}`);
  }
});
