/** Request body validation through the zod schemas (schemas.ts): typed inputs out, every problem at once in a 400. */
import type { Config } from '../config/config.js';
import type { DocumentInput, QueryInput } from '../service/rag.js';
import type { Metadata, SearchFilter } from '../retrieval/retrieval-store.js';
import type { FileInput } from '../retrieval/files/registry.js';
import { HttpError } from './errors.js';
import { collectionFor, OPEN_TENANT, type Tenant } from './tenant.js';
import { bodySchemas, documentsSchema, parseBody, type filterSchema, type QueryBody } from './schemas.js';
import type { z } from 'zod';
import type { SamplingOptions } from '../service/rag.js';

type Schemas = ReturnType<typeof bodySchemas>;
const built = new WeakMap<Config, Schemas>();

/** The schemas for this configuration (its limits), built once. */
export function schemasFor(cfg: Config): Schemas {
  let s = built.get(cfg);
  if (!s) built.set(cfg, (s = bodySchemas(cfg)));
  return s;
}

/** Stop sequences as a list (a single string is one). */
export const stopList = (stop: string | string[] | undefined): string[] | undefined =>
  stop === undefined ? undefined : typeof stop === 'string' ? [stop] : stop;

/** The sampler's fields of a body (shared by /query and the /v1 routes), absent ones left out. */
export function samplingOptions(b: {
  top_p?: number | undefined; stop?: string | string[] | undefined; repetition_penalty?: number | undefined;
  presence_penalty?: number | undefined; frequency_penalty?: number | undefined;
}, topK: number | undefined): SamplingOptions {
  const o: SamplingOptions = {};
  if (b.top_p !== undefined) o.topP = b.top_p;
  if (topK !== undefined && topK > 0) o.topK = topK;
  const stop = stopList(b.stop);
  if (stop && stop.length > 0) o.stop = stop;
  if (b.repetition_penalty !== undefined) o.repetitionPenalty = b.repetition_penalty;
  if (b.presence_penalty !== undefined) o.presencePenalty = b.presence_penalty;
  if (b.frequency_penalty !== undefined) o.frequencyPenalty = b.frequency_penalty;
  return o;
}

/**
 * A /query body as the service takes it; `tenant` decides the collection searched (tenant.ts). `adapter` is
 * the one the body names; `baseModel` that it asked for none (`adapter: null`), where one that says nothing
 * gets the service's query adapter (RagService.queryAdapterFor).
 */
export function parseQuery(body: unknown, cfg: Config, tenant: Tenant = OPEN_TENANT): QueryInput & { stream: boolean; baseModel: boolean; responseFormat?: QueryBody['response_format'] } {
  const b = parseBody(schemasFor(cfg).query, body);
  return {
    query: b.query,
    topK: b.top_k,
    rerankTopN: b.rerank_top_n,
    maxNewTokens: b.max_new_tokens,
    temperature: b.temperature ?? 0,
    seed: b.seed,
    adapter: b.adapter ?? undefined,
    baseModel: b.adapter === null,
    filter: searchFilter(b.collection, b.filter, tenant),
    ...(tenant.cacheSalt === undefined ? {} : { cacheSalt: tenant.cacheSalt }),
    sampling: samplingOptions(b, b.sample_top_k),
    stream: b.stream ?? false,
    responseFormat: b.response_format,
  };
}

/**
 * `collection` and `filter` of a body as one search filter (a collection named twice must agree), in a
 * collection the tenant may use (403 otherwise; its default when none is named).
 */
export function searchFilter(collection: string | undefined, filter: z.output<typeof filterSchema> | undefined, tenant: Tenant = OPEN_TENANT): SearchFilter {
  if (collection !== undefined && filter?.collection !== undefined && collection !== filter.collection) {
    throw new HttpError(400, 'invalid_body', `collection '${collection}' differs from filter.collection '${filter.collection}'`, { param: 'filter.collection' });
  }
  const metadata = filter?.metadata;
  return {
    collection: collectionFor(tenant, collection ?? filter?.collection, collection === undefined && filter?.collection !== undefined ? 'filter.collection' : 'collection'),
    ...(metadata && Object.keys(metadata).length > 0 ? { metadata } : {}),
  };
}

/** One document of a POST /documents body: a text, or a file to read (retrieval/files/), in a collection. */
export type DocumentItem =
  | { text: DocumentInput }
  | { file: FileInput; docId?: string | undefined; title?: string | undefined; collection?: string | undefined; metadata?: Metadata | undefined };

/** `{doc_id?, title?, text}` or `{doc_id?, title?, content, filename, content_type?}`, or `{documents: [...]}` of them. */
export function parseDocuments(body: unknown): DocumentItem[] {
  // The branch is chosen by the `documents` key, so that its errors are reported rather than a union's.
  const batch = typeof body === 'object' && body !== null && !Array.isArray(body) && 'documents' in body;
  const schema = batch ? documentsSchema.options[1] : documentsSchema.options[0];
  const b = parseBody(schema, body);
  const docs = 'documents' in b ? b.documents : [b];
  return docs.map((d) => {
    const title = d.title?.trim() || undefined;
    if (d.content !== undefined) {
      return { file: { filename: d.filename!, contentType: d.content_type, bytes: Buffer.from(d.content, 'base64') }, docId: d.doc_id, title, collection: d.collection, metadata: d.metadata };
    }
    return { text: { text: d.text!, docId: d.doc_id, title, collection: d.collection, metadata: d.metadata } };
  });
}
