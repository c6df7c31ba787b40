/**
 * GET /openapi.json: an OpenAPI 3.1 document generated from the zod schemas that validate the bodies
 * (schemas.ts), so that the document cannot drift from what the server accepts. Replies are described
 * in words (README's API table has their fields).
 */
import { z } from 'zod';
import type { bodySchemas } from './schemas.js';

type Schemas = ReturnType<typeof bodySchemas>;

const errorSchema = {
  type: 'object',
  properties: {
    error: {
      type: 'object',
      required: ['code', 'message'],
      properties: {
        code: { type: 'string' },
        message: { type: 'string' },
        type: { type: 'string', description: 'OpenAI\'s error type (on /v1 routes)' },
        param: { type: ['string', 'null'] },
        errors: {
          type: 'array', description: 'invalid_body: every problem of the body',
          items: { type: 'object', properties: { field: { type: 'string' }, code: { type: 'string' }, message: { type: 'string' } } },
        },
      },
    },
  },
} as const;

const json = (s: z.ZodType) => z.toJSONSchema(s, { io: 'input', unrepresentable: 'any', target: 'draft-2020-12' });

export function openapiDocument(s: Schemas): Record<string, unknown> {
  const body = (name: keyof Schemas) => ({ required: true, content: { 'application/json': { schema: { $ref: `#/components/schemas/${name}` } } } });
  const ok = (description: string, stream = false) => ({
    description,
    content: {
      'application/json': { schema: { type: 'object' } },
      ...(stream ? { 'text/event-stream': { schema: { type: 'string', description: 'with stream: true' } } } : {}),
    },
  });
  const errors = { '4XX': { description: 'a client error', content: { 'application/json': { schema: { $ref: '#/components/schemas/Error' } } } },
    '5XX': { description: 'busy (503, Retry-After) or a bug (500)', content: { 'application/json': { schema: { $ref: '#/components/schemas/Error' } } } } };
  const post = (summary: string, name: keyof Schemas, reply: string, stream = false) =>
    ({ post: { summary, requestBody: body(name), responses: { 200: ok(reply, stream), ...errors } } });
  const get = (summary: string) => ({ get: { summary, responses: { 200: ok(summary), ...errors } } });
  const components: Record<string, unknown> = { Error: errorSchema };
  for (const [name, schema] of Object.entries(s)) {
    const { $schema: _drop, ...rest } = json(schema as z.ZodType) as Record<string, unknown>;
    components[name] = rest;
  }
  return {
    openapi: '3.1.0',
    info: { title: 'ragguard', version: '0.1.0', description: 'Retrieval-augmented generation server with memory guards; OpenAI-compatible routes under /v1.' },
    paths: {
      '/query': post('Answer a question from the index, with citations', 'query', '{answer, citations, finish_reason, usage, retrieval, timings_ms, guard, adapter?, steered_to_close?}', true),
      '/documents': {
        post: {
          summary: 'Ingest documents: texts, or files (PDF, DOCX, HTML, Markdown, text) as base64 JSON or a multipart upload',
          requestBody: {
            required: true,
            content: {
              ...body('documents').content,
              'multipart/form-data': { schema: { type: 'object', description: 'One or more file parts (any field name); doc_id and title fields with one file.', properties: { doc_id: { type: 'string' }, title: { type: 'string' } }, additionalProperties: { type: 'string', format: 'binary' } } },
            },
          },
          responses: {
            201: ok('{documents: [{doc_id, title, chunks}]}'),
            207: ok('some files could not be read: {documents, results: [{index, filename?, status, doc_id?, title?, chunks?, error?}]}'),
            ...errors,
          },
        },
      },
      '/v1/chat/completions': post('OpenAI chat completion (rag: grounded on the index)', 'chatCompletion', 'chat.completion', true),
      '/v1/completions': post('OpenAI text completion', 'completion', 'text_completion', true),
      '/v1/embeddings': post('OpenAI embeddings (the embedder)', 'embedding', '{object: list, data: [{embedding, index}], usage}'),
      '/v1/rerank': post('Rerank documents against a query with the cross-encoder (Jina/Cohere shape)', 'rerank',
        '{id, model, results: [{index, relevance_score, document?: {text}}], usage}'),
      '/v1/score': post('Score text pairs with the cross-encoder (vLLM\'s shape)', 'score', '{id, object: list, model, data: [{index, object: score, score}], usage}'),
      '/v1/route-key': {
        post: {
          summary: "The router's prefix key for a chat or completion body (nothing runs on the model): send it as x-ragguard-prefix-key with the conversation's requests",
          parameters: [{ name: 'max_blocks', in: 'query', required: false, schema: { type: 'integer', minimum: 0 }, description: 'cap the key at the first N KV blocks (default RAGGUARD_ROUTE_KEY_BLOCKS; 0 = up to the end of the first user message)' }],
          requestBody: { required: true, content: { 'application/json': { schema: { type: 'object', description: 'a /v1/chat/completions body (messages) or a /v1/completions body (prompt)' } } } },
          responses: { 200: ok('{key, header, blocks, tokens, prompt_tokens, block_size}'), ...errors },
        },
      },
      '/v1/models': get('The served models'),
      '/healthz': get('Liveness and index counts'),
      '/debug/memory': get('Memory by component'),
      '/openapi.json': get('This document'),
    },
    components: { schemas: components },
  };
}
