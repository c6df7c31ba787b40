/** The retrieval store: the index directory, the store (faiss or PostgreSQL) and each one's settings (config.ts: VARIABLES, in the README's order). */
import { int, str, oneOf, rel, type Variable } from './parse.js';

export const STORE_VARIABLES: readonly Variable[] = [
  {
    name: 'RAGGUARD_INDEX_DIR', default: 'data/index',
    doc: 'Directory of the persisted index snapshot (created when missing).',
    apply: str((c, v) => (c.indexDir = rel(v))),
  },
  {
    name: 'RAGGUARD_STORE', default: 'faiss',
    doc: "Retrieval store: faiss (embedded: faiss + BM25 in this process, snapshot in RAGGUARD_INDEX_DIR) or a PostgreSQL URL (postgres://user:password@host:port/db, pgvector 0.8+): documents, chunks, an HNSW index and BM25 in the database, shared by every replica pointed at it. The schema is versioned and brought forward by `ragguard migrate` (or at start, RAGGUARD_PG_MIGRATE); the vector extension must exist or the migrating role may create it.",
    apply: (c, raw) => {
      const v = raw.trim();
      if (v !== 'faiss' && !/^postgres(ql)?:\/\/./.test(v)) throw new Error("must be 'faiss' or a postgres:// URL");
      c.store = v;
    },
  },
  {
    name: 'RAGGUARD_PG_EF_SEARCH', default: '1000',
    doc: "pgvector's hnsw.ef_search on the Postgres store, at most: candidates per HNSW scan (higher: better recall, slower; pgvector's most is 1000); filtered scans continue past it (hnsw.iterative_scan). A search takes fewer where its collection's own graph is small: chunks / 50, from 200 (up to 10,000 chunks) to this (from 50,000): bench:scale-real at 20 collections of 10,000 real chunks, recall@10 min 0.994 at 200 against 0.9998 at 1000, p95 50 ms against 148 (docs/tenants-and-postgres.md). bench:scale at 1M chunks in one collection of 384 dimensions (pgvector's default m 16, ef_construction 64), two builds: recall@10 0.87 at 100, 0.95 at 400, 0.96 and 0.9505 at 800, p95 11-13 ms at 400 and 800: builds vary, so the most is the most pgvector takes.",
    apply: int(10, 1000, (c, v) => (c.pgEfSearch = v)),
  },
  {
    name: 'RAGGUARD_PG_POOL_SIZE', default: '10',
    doc: 'Connections the Postgres store keeps open at most (per replica). Behind PgBouncer in transaction mode every search and write is one transaction carrying its own settings (local to it, as SET LOCAL), so any pool size there is safe.',
    apply: int(1, 1000, (c, v) => (c.pgPoolSize = v)),
  },
  {
    name: 'RAGGUARD_PG_CONNECT_TIMEOUT_MS', default: '5000',
    doc: 'Milliseconds a new connection to the Postgres store may take (0: no limit). A request that needs the database while it does not answer gets 503 store_unavailable with Retry-After once this passes.',
    apply: int(0, 600_000, (c, v) => (c.pgConnectTimeoutMs = v)),
  },
  {
    name: 'RAGGUARD_PG_STATEMENT_TIMEOUT_MS', default: '30000',
    doc: "Milliseconds a statement of the Postgres store may run (statement_timeout set local to each of its transactions; 0: no limit); a connection silent for 5 s longer is dropped. Past it the request gets 503 store_unavailable.",
    apply: int(0, 3_600_000, (c, v) => (c.pgStatementTimeoutMs = v)),
  },
  {
    name: 'RAGGUARD_PG_HNSW_M', default: '16',
    doc: "pgvector's HNSW m (links per node) for the Postgres store's vector index, used when the schema is created (`ragguard migrate` or the first start); an existing index keeps its own (REINDEX to change it).",
    apply: int(2, 100, (c, v) => (c.pgHnswM = v)),
  },
  {
    name: 'RAGGUARD_PG_HNSW_EF_CONSTRUCTION', default: '64',
    doc: "pgvector's HNSW ef_construction (candidates while inserting) for the Postgres store's vector index, used when the schema is created; at least 2 x RAGGUARD_PG_HNSW_M (pgvector refuses less).",
    apply: int(4, 1000, (c, v) => (c.pgHnswEfConstruction = v)),
  },
  {
    name: 'RAGGUARD_PG_MIGRATE', default: 'auto',
    doc: "auto: a server whose Postgres schema is behind this build's applies the missing migrations at start when its role may (saying so), and stops naming `ragguard migrate` when it may not; never: it stops. With a schema that is current the server needs only select, insert, update and delete.",
    apply: oneOf(['auto', 'never'] as const, (c, v) => (c.pgMigrate = v)),
  },
  {
    name: 'RAGGUARD_FAISS_ANN_MIN', default: '20000',
    doc: 'The faiss store searches exactly (a flat index) below this many chunks and through an HNSW graph (approximate; recall checked against exact search by test and bench:scale) from it on; the switch is built on a worker thread while the exact index serves. 0: always exact. A filter that leaves fewer chunks than this (or under a tenth of the store) is searched exactly. docs/store-growth.md.',
    apply: int(0, 2 ** 31 - 1, (c, v) => (c.faissAnnMin = v)),
  },
  {
    name: 'RAGGUARD_FAISS_EF_SEARCH', default: '512',
    doc: "Candidates an HNSW search of the faiss store keeps (faiss's efSearch; higher: better recall, slower). A filtered search raises it as the filter narrows (up to ten times). bench:scale at 1M chunks of 384 dimensions (M 32, efConstruction 128): recall@10 0.999 at 256 (p95 3.1 ms), 1.0 at 512 (p95 3.8 ms), 0.9995 at 1024 (p95 6.4 ms).",
    apply: int(8, 4096, (c, v) => (c.faissEfSearch = v)),
  },
  {
    name: 'RAGGUARD_FAISS_HNSW_M', default: '32',
    doc: "Links per node of the faiss store's HNSW graph (twice as many on its bottom layer): memory (about 8 x M bytes a chunk) and build time against recall. Applies to the next build of the graph.",
    apply: int(4, 128, (c, v) => (c.faissHnswM = v)),
  },
  {
    name: 'RAGGUARD_FAISS_EF_CONSTRUCTION', default: '128',
    doc: "Candidates kept while inserting into the faiss store's HNSW graph (faiss's efConstruction): build time and one document's insertion against the graph's quality. At 40 (faiss' own default, under the 64 links of the bottom layer) the graph, not the search, held recall@10 at 1M chunks to 0.93-0.94 whatever efSearch; at 128 it is 1.0 at efSearch 512 (bench:scale on this 2-core machine: 1M chunks ingested in 30 min, 22-30 at 40; one-document ingest p95 67 ms).",
    apply: int(8, 1024, (c, v) => (c.faissEfConstruction = v)),
  },
  {
    name: 'RAGGUARD_FAISS_LOG_BYTES', default: '16777216',
    doc: 'While the faiss store\'s snapshot is smaller than this, every write rewrites it; past it, a write appends one record to the write log beside it (fsynced before the write is acknowledged) and compaction writes a new snapshot in the background once the log passes this size and a quarter of the snapshot. 0: always the log.',
    apply: int(0, 2 ** 40, (c, v) => (c.faissLogBytes = v)),
  },
];
