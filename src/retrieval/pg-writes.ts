/**
 * The Postgres store's writes (postgres-store.ts), inside a write's transaction: a document's rows (its
 * chunks with their vectors, its postings), and each collection's figures changed by the same transaction.
 */
import type pg from 'pg';
import pgvector from 'pgvector';
import { termsOf } from './pg-schema.js';
import { UNIQUE_VIOLATION } from './pg-errors.js';
import { toDocument, type DocumentRow } from './pg-rows.js';
import { DEFAULT_COLLECTION, DocumentExistsError, type NewDocument, type StoredDocument } from './retrieval-store.js';

/** What a write changes of a collection's figures (documents; chunks and summed lengths, which BM25 reads). */
export interface Figures {
  documents: number;
  chunks: number;
  terms: number;
}

/** A write's changes to the figures, by collection. */
export type Delta = Map<string, Figures>;

function change(delta: Delta, collection: string, documents: number, chunks: number, terms: number): void {
  const f = delta.get(collection) ?? { documents: 0, chunks: 0, terms: 0 };
  f.documents += documents;
  f.chunks += chunks;
  f.terms += terms;
  delta.set(collection, f);
}

/**
 * The collections' rows of figures, updated last in a write's transaction and in collection order:
 * concurrent writes (other replicas) to one collection queue on its row only for their commit, never hold
 * it while waiting on a document's row, and never take two rows in opposite orders.
 */
export async function applyDelta(client: pg.PoolClient, delta: Delta): Promise<Map<string, number>> {
  // Each changed collection's chunks after the write: the store builds a collection's own index once past a threshold.
  const chunks = new Map<string, number>();
  for (const collection of [...delta.keys()].sort()) {
    const f = delta.get(collection)!;
    if (f.documents === 0 && f.chunks === 0 && f.terms === 0) continue;
    const { rows } = await client.query<{ chunks: string }>(
      `INSERT INTO ragguard_collection_stats AS s (collection, documents, chunks, total_terms) VALUES ($1, $2, $3, $4)
       ON CONFLICT (collection) DO UPDATE SET documents = s.documents + $2, chunks = s.chunks + $3, total_terms = s.total_terms + $4
       RETURNING s.chunks`,
      [collection, f.documents, f.chunks, f.terms]);
    chunks.set(collection, Number(rows[0]!.chunks));
  }
  return chunks;
}

/** Places in the documents' listing order for a batch, in batch order (the rows are written in another order). */
export async function listPlaces(client: pg.PoolClient, n: number): Promise<string[]> {
  const { rows } = await client.query<{ seq: string }>(
    "SELECT nextval(pg_get_serial_sequence('ragguard_documents', 'seq')) AS seq FROM generate_series(1, $1::int) ORDER BY 1", [n]);
  return rows.map((r) => r.seq);
}

/**
 * The batch's positions in (collection, doc id) order: every write takes its documents' row locks in
 * one global order, so two overlapping batches (from two replicas) wait for each other, never deadlock.
 */
export function keyOrder(batch: readonly NewDocument[]): number[] {
  const key = (d: NewDocument) => [d.doc.collection ?? DEFAULT_COLLECTION, d.doc.docId] as const;
  return batch.map((_, i) => i).sort((x, y) => {
    const [cx, ix] = key(batch[x]!);
    const [cy, iy] = key(batch[y]!);
    return cx < cy ? -1 : cx > cy ? 1 : ix < iy ? -1 : ix > iy ? 1 : x - y;
  });
}

/** Inserts a document, its chunks and their postings (DocumentExistsError where it is there). */
export async function insertDocument(client: pg.PoolClient, dimension: number, { doc, chunks, vectors }: NewDocument, seq: string, delta: Delta): Promise<StoredDocument> {
  const collection = doc.collection ?? DEFAULT_COLLECTION;
  const metadata = doc.metadata ?? {};
  if (vectors.length !== chunks.length * dimension) throw new Error('one embedding per chunk expected');
  try {
    await client.query('INSERT INTO ragguard_documents (collection, doc_id, seq, title, bytes, metadata) VALUES ($1, $2, $3, $4, $5, $6)',
      [collection, doc.docId, seq, doc.title, doc.bytes, JSON.stringify(metadata)]);
  } catch (e) {
    // The transaction is aborted now: the caller's rollback drops the whole batch.
    if ((e as { code?: string }).code === UNIQUE_VIOLATION) throw new DocumentExistsError(doc.docId, collection);
    throw e;
  }
  const lexical = chunks.map((c) => termsOf(doc.title, c.text));
  const rows = chunks.length === 0 ? [] : (await client.query<{ id: string; ord: number }>(
    `INSERT INTO ragguard_chunks (collection, doc_id, ord, text, tokens, locator, metadata, nterms, embedding)
     SELECT $1, $2, u.ord, u.text, u.tokens, u.locator, $3::jsonb, u.nterms, u.embedding::vector
     FROM unnest($4::int[], $5::text[], $6::int[], $7::text[], $8::int[], $9::text[]) AS u(ord, text, tokens, locator, nterms, embedding)
     RETURNING id, ord`,
    [collection, doc.docId, JSON.stringify(metadata), chunks.map((_, i) => i), chunks.map((c) => c.text), chunks.map((c) => c.tokens),
      chunks.map((c) => c.locator ?? null), lexical.map((l) => l.distinct),
      chunks.map((_, i) => pgvector.toSql(Array.from(vectors.subarray(i * dimension, (i + 1) * dimension))))])).rows;
  const ids: number[] = [];
  for (const r of rows) ids[r.ord] = Number(r.id);
  const terms: string[] = [];
  const chunkIds: number[] = [];
  const tfs: number[] = [];
  lexical.forEach((l, ord) => {
    for (const [term, tf] of l.terms) {
      terms.push(term);
      chunkIds.push(ids[ord]!);
      tfs.push(tf);
    }
  });
  if (terms.length > 0) {
    await client.query('INSERT INTO ragguard_terms (collection, term, chunk_id, tf) SELECT $1, u.term, u.chunk_id, u.tf FROM unnest($2::text[], $3::bigint[], $4::int[]) AS u(term, chunk_id, tf)',
      [collection, terms, chunkIds, tfs]);
  }
  change(delta, collection, 1, chunks.length, lexical.reduce((s, l) => s + l.distinct, 0));
  return { collection, docId: doc.docId, title: doc.title, bytes: doc.bytes, metadata: { ...metadata }, chunkIds: ids };
}

/** Deletes a document (its chunks and postings by cascade), returning it as it was. */
export async function deleteDocument(client: pg.PoolClient, collection: string, docId: string, delta: Delta): Promise<StoredDocument | undefined> {
  const { rows } = await client.query<DocumentRow & { chunks: string; total_terms: string | null }>(
    `SELECT d.collection, d.doc_id, d.title, d.bytes, d.metadata,
            ARRAY(SELECT c.id FROM ragguard_chunks c WHERE c.collection = d.collection AND c.doc_id = d.doc_id ORDER BY c.ord) AS chunk_ids,
            (SELECT count(*) FROM ragguard_chunks c WHERE c.collection = d.collection AND c.doc_id = d.doc_id) AS chunks,
            (SELECT sum(nterms) FROM ragguard_chunks c WHERE c.collection = d.collection AND c.doc_id = d.doc_id) AS total_terms
     FROM ragguard_documents d WHERE d.collection = $1 AND d.doc_id = $2 FOR UPDATE`, [collection, docId]);
  const row = rows[0];
  if (!row) return undefined;
  await client.query('DELETE FROM ragguard_documents WHERE collection = $1 AND doc_id = $2', [collection, docId]);
  change(delta, collection, -1, -Number(row.chunks), -Number(row.total_terms ?? 0));
  return toDocument(row);
}
