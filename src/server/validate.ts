/** Request body validation: typed inputs out, 400s with the offending field named. */
import type { Config } from '../config/config.js';
import type { DocumentInput, QueryInput } from '../rag.js';
import { badRequest } from './errors.js';

type Json = Record<string, unknown>;

function object(body: unknown): Json {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw badRequest('invalid_body', 'body must be a JSON object');
  return body as Json;
}

function intField(b: Json, name: string, dflt: number, min: number, max: number): number {
  const v = b[name];
  if (v === undefined || v === null) return dflt;
  if (typeof v !== 'number' || !Number.isInteger(v)) throw badRequest('invalid_field', `${name} must be an integer`);
  if (v < min || v > max) throw badRequest('invalid_field', `${name} must be between ${min} and ${max}`);
  return v;
}

const KNOWN_QUERY_FIELDS = new Set(['query', 'top_k', 'rerank_top_n', 'max_new_tokens', 'temperature', 'seed', 'adapter']);

export function parseQuery(body: unknown, cfg: Config): QueryInput {
  const b = object(body);
  for (const k of Object.keys(b)) if (!KNOWN_QUERY_FIELDS.has(k)) throw badRequest('unknown_field', `unknown field '${k}'`);
  const query = b['query'];
  if (typeof query !== 'string' || query.trim() === '') throw badRequest('invalid_field', 'query must be a non-empty string');
  const temperature = b['temperature'] ?? 0;
  if (typeof temperature !== 'number' || !Number.isFinite(temperature) || temperature < 0 || temperature > 5) {
    throw badRequest('invalid_field', 'temperature must be a number between 0 and 5');
  }
  const adapter = b['adapter'];
  if (adapter !== undefined && typeof adapter !== 'string') throw badRequest('invalid_field', 'adapter must be a string');
  const seed = b['seed'];
  if (seed !== undefined && (typeof seed !== 'number' || !Number.isInteger(seed))) throw badRequest('invalid_field', 'seed must be an integer');
  return {
    query: query.trim(),
    topK: intField(b, 'top_k', cfg.defaultTopK, 1, cfg.maxTopK),
    rerankTopN: intField(b, 'rerank_top_n', cfg.defaultRerankTopN, 1, cfg.maxRerankTopN),
    maxNewTokens: intField(b, 'max_new_tokens', cfg.defaultMaxNewTokens, 1, cfg.maxNewTokensLimit),
    temperature,
    seed,
    adapter,
  };
}

const DOC_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

function parseDocument(v: unknown, where: string): DocumentInput {
  const d = object(v);
  const text = d['text'];
  if (typeof text !== 'string' || text.trim() === '') throw badRequest('invalid_field', `${where}text must be a non-empty string`);
  const docId = d['doc_id'];
  if (docId !== undefined && (typeof docId !== 'string' || !DOC_ID.test(docId))) {
    throw badRequest('invalid_field', `${where}doc_id must match ${DOC_ID.source}`);
  }
  const title = d['title'];
  if (title !== undefined && (typeof title !== 'string' || title.length > 512)) {
    throw badRequest('invalid_field', `${where}title must be a string of at most 512 characters`);
  }
  return { text, docId, title: title?.trim() || undefined };
}

/** `{doc_id?, title?, text}` or `{documents: [...]}`. */
export function parseDocuments(body: unknown): DocumentInput[] {
  const b = object(body);
  if (!('documents' in b)) return [parseDocument(b, '')];
  const docs = b['documents'];
  if (!Array.isArray(docs) || docs.length === 0 || docs.length > 1000) {
    throw badRequest('invalid_field', 'documents must be an array of 1 to 1000 documents');
  }
  return docs.map((d, i) => parseDocument(d, `documents[${i}].`));
}
