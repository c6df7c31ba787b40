/**
 * ragguard as a library: the one door to it, for applications and for ragguard's own server binary and
 * CLI (cli/), which import nothing else of src/.
 *
 * - `createRagguard()` (library/ragguard.ts): the models and the store loaded, and the service (ingest,
 *   query, generate, close) with the HTTP API as an express router to mount under any path of an app;
 * - `serve()` (library/serve.ts): that router on a port, listening at once, ready once loaded, drained on
 *   stop: what `ragguard serve` and `npm start` run;
 * - `readFolder` and `ingestDirect` (library/folder.ts, library/direct-ingest.ts): a folder tree as
 *   documents, and documents into the store with no server running;
 * - `migrateStore` and `storeSchema` (library/migrate.ts): the Postgres store's schema.
 *
 * Importing it loads none of the models' runtimes (ONNX Runtime, faiss, the parsers): they load with the
 * first call that needs them, so that a server answers its probes before they do.
 */
import type { FileDocument, FileInput } from './retrieval/files/registry.js';
import { UnreadableFileError, UnsupportedFileError } from './retrieval/files/parsed-file.js';

export { ConfigError, loadConfig } from './config/config.js';
export { BusyError, ClosedError, InvalidRequestError, RagguardError, TooLargeError } from './runtime/errors.js';
export { createLogger, type Logger } from './server/logging.js';
export {
  createRagguard, Ragguard, resolveConfig,
  type ChatMessage, type Citation, type Config, type DocumentInput, type FinishReason, type GenerateOptions, type GenerateResult,
  type IngestResult, type QueryOptions, type QueryResult, type RagguardOptions, type RouterOptions, type SamplingOptions,
  type SearchFilter, type StartOptions,
} from './library/ragguard.js';
export { serve, type ServeOptions, type Serving } from './library/serve.js';
export { docIdFor, readFolder, type FolderDocument, type Skipped } from './library/folder.js';
export { ingestDirect, type DirectResult } from './library/direct-ingest.js';
export { migrateStore, storeSchema, type MigrateOptions, type MigrateResult, type SchemaStatus } from './library/migrate.js';
// The router's prefix key of a tokenized prompt (docs/deploy-cluster.md#prefix-key), for a client that tokenizes itself.
export { commonPrefix, ROUTE_KEY_HEADER, routeKey, type RouteKey, type RouteKeyOptions } from './service/route-key.js';
export { UnreadableFileError, UnsupportedFileError, type FileDocument, type FileInput };

/** A file (PDF, DOCX, HTML, Markdown, text) as a document for ingest: `rag.ingest([await fileDocument(f)])`. */
export async function fileDocument(f: FileInput): Promise<FileDocument> {
  // The parsers load with the first file, not with the library.
  return (await import('./retrieval/files/registry.js')).fileDocument(f);
}
