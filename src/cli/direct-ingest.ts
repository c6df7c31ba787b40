/**
 * `ragguard ingest --direct`: documents straight into the index on disk (RAGGUARD_INDEX_DIR), with no
 * server: the embedder alone is loaded, each document chunked and embedded as the server would, and
 * the snapshot written once, through the store's own transaction (all of the folder or nothing).
 * Only while no server runs on that index: a running server neither sees the new documents nor keeps
 * them (its next write persists its own copy).
 */
import { loadConfig } from '../config/config.js';
import { documentInfo, embedDocument, type EmbeddedDocument } from '../service/documents.js';
import { Embedder } from '../retrieval/embedder.js';
import { DocumentStore } from '../retrieval/store.js';
import type { FolderDocument } from './folder.js';

export interface DirectResult {
  created: string[];
  replaced: string[];
  chunks: number;
  indexDir: string;
}

export async function ingestDirect(documents: readonly FolderDocument[], progress: (done: number, label: string) => void): Promise<DirectResult> {
  const cfg = loadConfig();
  const embedder = await Embedder.load(cfg.embedderPath, cfg.providers.embedder, { webgpuBufferCache: cfg.webgpuBufferCache });
  const store = await DocumentStore.open(cfg.indexDir, embedder.dimension);
  const embedded: (EmbeddedDocument & { file: string })[] = [];
  for (const [i, d] of documents.entries()) {
    embedded.push({ ...(await embedDocument(embedder, cfg, d)), file: d.file });
    progress(i + 1, d.file);
  }
  const created: string[] = [];
  const replaced: string[] = [];
  let chunks = 0;
  await store.transact(() => {
    for (const e of embedded) {
      (store.remove(e.docId) ? replaced : created).push(e.file);
      store.add(documentInfo(e), e.spans, e.vectors);
      chunks += e.spans.length;
    }
  });
  return { created, replaced, chunks, indexDir: cfg.indexDir };
}
