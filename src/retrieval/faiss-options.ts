/** The faiss store's options (faiss-store.ts) and the settings they default to. */
import { loadConfig } from '../config/config.js';

export interface FaissStoreOptions {
  /** Live chunks from which the index is HNSW (0: always exact). */
  annMin?: number;
  /** HNSW: candidates per search, links per node, candidates while inserting. */
  efSearch?: number;
  hnswM?: number;
  efConstruction?: number;
  /** Snapshot size under which every write rewrites it; past it writes go to the log. */
  logBytes?: number;
  /** Log size from which compaction runs (also at least a quarter of the snapshot); default logBytes. */
  compactBytes?: number;
  /** Where warnings go (a torn log record dropped, a background task that failed). */
  warn?: (message: string) => void;
}

/** The settings RAGGUARD_FAISS_* default to (config.ts has them and their docs). */
export function defaults(): Required<Omit<FaissStoreOptions, 'warn' | 'compactBytes'>> {
  const c = loadConfig({});
  return { annMin: c.faissAnnMin, efSearch: c.faissEfSearch, hnswM: c.faissHnswM, efConstruction: c.faissEfConstruction, logBytes: c.faissLogBytes };
}

/** Where the store's warnings go when FaissStoreOptions.warn names nowhere. */
export const defaultWarn = (message: string): void => console.warn(`[faiss-store] ${message}`);
