/**
 * The faiss store's snapshot contents (faiss-store.ts): a state as named sections for snapshot.ts to write
 * (crash-safe, checksummed), and a state read back from any version of them.
 */
import { setImmediate as turn } from 'node:timers/promises';
import { DEFAULT_COLLECTION, type Metadata, type StoredChunk, type StoredDocument } from './retrieval-store.js';
import { chunkObjectBytes, countIn, documentObjectBytes, emptyState, key, liveChunks, type State } from './faiss-state.js';
import { PositionTable } from './positions.js';
import { CorruptSnapshotError, decodeSnapshot, type readSnapshot } from './snapshot.js';
import { VectorIndex } from './vector-index.js';

/** Items per JSON section of a snapshot (documents, chunks, texts): no one string near V8's limit. */
const PART_ITEMS = 50_000;

export const SNAPSHOT = 'index.snapshot';

/** As stored: what older snapshots lack (collection, metadata, title on chunks) is optional. */
type DocumentRecord = Omit<StoredDocument, 'collection' | 'metadata'> & { collection?: string; metadata?: Metadata };
type ChunkRecord = Omit<StoredChunk, 'text' | 'collection' | 'title'> & { collection?: string; title?: string };

/** The metadata section: the chunks without their texts (those are the text sections), in position order. */
interface SectionMeta {
  version: 2 | 3;
  dimension: number;
  documents: DocumentRecord[];
  chunks: ChunkRecord[];
  /** The next chunk id (absent in older snapshots, whose ids are positions). */
  nextId?: number;
  /** Version 3: the last log record this snapshot holds. */
  seq?: number;
  /** Version 3: removed positions still in the index, with their chunk ids. */
  dead?: [number, number][];
  /** Version 3: numbered sections beyond the first part ('documents.1', 'chunks.1', 'text.1', ...). */
  parts?: { documents: number; chunks: number; text: number };
}

/** What a snapshot holds of a state, taken at once (the objects are never changed afterwards, only replaced). */
interface View {
  docs: StoredDocument[];
  chunks: StoredChunk[];
  dead: [number, number][];
  nextId: number;
}

export function captureView(s: State): View {
  const labels = s.table.snapshot();
  const dead: [number, number][] = [];
  labels.forEach((l, p) => {
    if (l < 0) dead.push([p, -l - 1]);
  });
  return { docs: [...s.docs.values()], chunks: liveChunks(s), dead, nextId: s.nextId };
}

export function encodeState(s: State, vectors: Buffer, seq: number): Promise<[string, Uint8Array][]> {
  return encodeView({ ...captureView(s), vectors }, s.index.dimension, seq);
}

/**
 * Sections: metadata (documents, chunks without texts, tombstones), text (the chunks' texts), vectors
 * (faiss's bytes); a large store's documents, chunks and texts continue in numbered sections
 * ('chunks.1', ...), each part encoded in its own turn of the event loop.
 */
export async function encodeView(v: View & { vectors: Buffer }, dimension: number, seq: number): Promise<[string, Uint8Array][]> {
  const parts = <T>(items: T[]) => Array.from({ length: Math.max(1, Math.ceil(items.length / PART_ITEMS)) }, (_, i) => items.slice(i * PART_ITEMS, (i + 1) * PART_ITEMS));
  const docParts = parts(v.docs);
  const chunkParts = parts(v.chunks.map(({ text: _text, ...c }) => c));
  const textParts = parts(v.chunks.map((c) => c.text));
  const meta: SectionMeta = {
    version: 3, dimension, nextId: v.nextId, seq, dead: v.dead,
    parts: { documents: docParts.length, chunks: chunkParts.length, text: textParts.length },
    documents: docParts[0]!, chunks: chunkParts[0]!,
  };
  const out: [string, Uint8Array][] = [['metadata', Buffer.from(JSON.stringify(meta))]];
  for (const [name, list] of [['documents', docParts], ['chunks', chunkParts]] as const) {
    for (let i = 1; i < list.length; i++) {
      await turn();
      out.push([`${name}.${i}`, Buffer.from(JSON.stringify(list[i]))]);
    }
  }
  for (let i = 0; i < textParts.length; i++) {
    if (i > 0) await turn();
    out.push([i === 0 ? 'text' : `text.${i}`, Buffer.from(JSON.stringify(textParts[i]))]);
  }
  out.push(['vectors', v.vectors]);
  return out;
}

/** The state a snapshot holds (any version), and the last log record it holds. */
export function loadState(contents: NonNullable<Awaited<ReturnType<typeof readSnapshot>>>, file: string, dimension: number): { state: State; seq: number } {
  const { meta, texts, vectors } = readSections(contents, file);
  if (meta.dimension !== dimension) {
    throw new Error(`${file} holds ${meta.dimension}-dimensional vectors but the embedder makes ${dimension}: ` +
      'point RAGGUARD_INDEX_DIR elsewhere or remove the snapshot to re-ingest');
  }
  let index: VectorIndex;
  try {
    index = VectorIndex.fromBuffer(vectors);
  } catch (e) {
    throw new CorruptSnapshotError(`${file}: section 'vectors' is not a faiss index (${(e as Error).message})`, file, 'vectors');
  }
  const dead = meta.dead ?? [];
  const positions = meta.chunks.length + dead.length;
  if (index.dimension !== dimension || index.size !== positions) {
    throw new CorruptSnapshotError(`${file}: section 'vectors' holds ${index.size} vectors of ${index.dimension} for ${positions} positions of ${dimension}`, file, 'vectors');
  }
  const s = emptyState(dimension);
  s.index = index;
  for (const d of meta.documents) {
    const collection = d.collection ?? DEFAULT_COLLECTION;
    const doc: StoredDocument = { ...d, collection, metadata: d.metadata ?? {} };
    s.docs.set(key(collection, d.docId), doc);
    s.objectBytes += documentObjectBytes(doc);
    countIn(s, collection, 1, doc.chunkIds.length);
  }
  const labels = new Int32Array(positions);
  const deadAt = new Map(dead);
  let next = 0;
  for (let p = 0; p < positions; p++) {
    const gone = deadAt.get(p);
    if (gone !== undefined) {
      labels[p] = -gone - 1;
      continue;
    }
    const c = meta.chunks[next]!;
    const text = texts[next++]!;
    const collection = c.collection ?? DEFAULT_COLLECTION;
    const title = c.title ?? s.docs.get(key(collection, c.docId))?.title ?? c.docId;
    const chunk: StoredChunk = { ...c, collection, title, text };
    s.chunks.set(c.id, chunk);
    s.objectBytes += chunkObjectBytes(chunk);
    labels[p] = c.id;
  }
  try {
    s.table = PositionTable.of(labels);
  } catch (e) {
    throw new CorruptSnapshotError(`${file}: section 'metadata' lists ${(e as Error).message}`, file, 'metadata');
  }
  s.nextId = meta.nextId ?? meta.chunks.reduce((m, c) => Math.max(m, c.id + 1), 0);
  return { state: s, seq: meta.seq ?? 0 };
}

function readSections(contents: NonNullable<Awaited<ReturnType<typeof readSnapshot>>>, file: string): { meta: SectionMeta; texts: string[]; vectors: Buffer } {
  if ('v1' in contents) {
    // Version 1: no checksums to verify (written before they existed); the texts are in the metadata.
    const { meta, payload } = decodeSnapshot<{ version: 1; dimension: number; documents: DocumentRecord[]; chunks: (ChunkRecord & { text: string })[] }>(contents.v1, file);
    if (meta.version !== 1) throw new CorruptSnapshotError(`${file}: unknown snapshot version ${String(meta.version)}`, file, 'metadata');
    return {
      meta: { version: 2, dimension: meta.dimension, documents: meta.documents, chunks: meta.chunks.map(({ text: _t, ...c }) => c) },
      texts: meta.chunks.map((c) => c.text), vectors: payload,
    };
  }
  const { sections } = contents;
  const need = (name: string) => {
    const b = sections.get(name);
    if (!b) throw new CorruptSnapshotError(`${file} has no '${name}' section`, file, name);
    return b;
  };
  const json = <T>(name: string): T => {
    try {
      return JSON.parse(need(name).toString('utf8')) as T;
    } catch (e) {
      if (e instanceof CorruptSnapshotError) throw e;
      throw new CorruptSnapshotError(`${file}: section '${name}' is not readable JSON`, file, name);
    }
  };
  const meta = json<SectionMeta>('metadata');
  if (meta.version !== 2 && meta.version !== 3) throw new CorruptSnapshotError(`${file}: unknown snapshot version ${String(meta.version)}`, file, 'metadata');
  const rest = <T>(name: string, first: T[], count = 1): T[] => {
    const out = first;
    for (let i = 1; i < count; i++) for (const x of json<T[]>(`${name}.${i}`)) out.push(x);
    return out;
  };
  meta.documents = rest('documents', meta.documents, meta.parts?.documents);
  meta.chunks = rest('chunks', meta.chunks, meta.parts?.chunks);
  const texts = rest('text', json<string[]>('text'), meta.parts?.text);
  if (!Array.isArray(texts) || texts.length !== meta.chunks.length) {
    throw new CorruptSnapshotError(`${file}: section 'text' holds ${texts?.length} texts for ${meta.chunks.length} chunks`, file, 'text');
  }
  return { meta, texts, vectors: need('vectors') };
}
