/**
 * `ingestDirect` (the CLI's `ragguard ingest --direct`): documents straight into the index on disk (RAGGUARD_INDEX_DIR), with no
 * server: the embedder alone is loaded, each document chunked and embedded as the server would, and
 * the snapshot written once, through the store's own transaction (all of the folder or nothing).
 * With the embedded store, only while no server runs on that index: a running server neither sees the
 * new documents nor keeps them (its next write persists its own copy). With RAGGUARD_STORE=postgres://...
 * the batch is one transaction that running servers see at once.
 */
import type { EmbeddedDocument } from '../service/documents.js';
import type { FolderDocument } from './folder.js';
import { resolveConfig, type RagguardOptions } from './ragguard.js';

export interface DirectResult {
  created: string[];
  replaced: string[];
  chunks: number;
  indexDir: string;
}

/** Configured as createRagguard is (`opts.env`: RAGGUARD_* settings; process.env only when passed in). */
export async function ingestDirect(documents: readonly FolderDocument[], progress: (done: number, label: string) => void, opts: RagguardOptions = {}): Promise<DirectResult> {
  const cfg = resolveConfig(opts);
  // The embedder's runtime and the store load here, not with the library (ragguard.ts says why).
  const [{ documentInfo, embedDocument }, { Embedder }, { openStore }] = await Promise.all([
    import('../service/documents.js'), import('../retrieval/embedder.js'), import('../retrieval/open-store.js'),
  ]);
  const embedder = await Embedder.load(cfg.embedderPath, cfg.providers.embedder, { webgpuBufferCache: cfg.webgpuBufferCache });
  const store = await openStore(cfg, embedder.dimension);
  const embedded: (EmbeddedDocument & { file: string })[] = [];
  for (const [i, d] of documents.entries()) {
    embedded.push({ ...(await embedDocument(embedder, cfg, d)), file: d.file });
    progress(i + 1, d.file);
  }
  const created: string[] = [];
  const replaced: string[] = [];
  let chunks = 0;
  try {
    const written = await store.replaceBatch(embedded.map((e) => ({ doc: documentInfo(e), chunks: e.spans, vectors: e.vectors })));
    written.forEach((w, i) => {
      (w.replaced ? replaced : created).push(embedded[i]!.file);
      chunks += w.document.chunkIds.length;
    });
  } finally {
    await store.close();
  }
  return { created, replaced, chunks, indexDir: cfg.indexDir };
}
