/** Opens the retrieval store RAGGUARD_STORE names: faiss in this process, or PostgreSQL. */
import type { Config } from '../config/config.js';
import { FaissStore } from './faiss-store.js';
import { PostgresStore } from './postgres-store.js';
import type { RetrievalStore } from './retrieval-store.js';

type StoreSettings = 'store' | 'indexDir' | 'bm25K1' | 'bm25B' | 'pgEfSearch' | 'pgPoolSize' | 'pgConnectTimeoutMs' | 'pgStatementTimeoutMs' |
  'pgHnswM' | 'pgHnswEfConstruction' | 'pgMigrate' | 'faissAnnMin' | 'faissEfSearch' | 'faissHnswM' | 'faissEfConstruction' | 'faissLogBytes';

export function openStore(cfg: Pick<Config, StoreSettings>, dimension: number): Promise<RetrievalStore> {
  const bm25 = { k1: cfg.bm25K1, b: cfg.bm25B };
  if (cfg.store === 'faiss') {
    return FaissStore.open(cfg.indexDir, dimension, bm25, {
      annMin: cfg.faissAnnMin, efSearch: cfg.faissEfSearch, hnswM: cfg.faissHnswM, efConstruction: cfg.faissEfConstruction, logBytes: cfg.faissLogBytes,
    });
  }
  return PostgresStore.open(cfg.store, dimension, {
    bm25, efSearch: cfg.pgEfSearch, poolSize: cfg.pgPoolSize, connectTimeoutMs: cfg.pgConnectTimeoutMs,
    statementTimeoutMs: cfg.pgStatementTimeoutMs, hnswM: cfg.pgHnswM, hnswEfConstruction: cfg.pgHnswEfConstruction, migrate: cfg.pgMigrate,
  });
}

