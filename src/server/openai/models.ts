/** GET /v1/models: the decoder, embedder and reranker by their directory names, and the adapters this decoder can serve (those the key may use). */
import path from 'node:path';
import type { RequestHandler } from 'express';
import { openapiDocument } from '../openapi.js';
import { schemasFor } from '../validate.js';
import { tenantOf } from '../tenant.js';
import type { OpenAiContext } from './common.js';

export function modelsHandler(ctx: OpenAiContext): RequestHandler {
  const { service, decoderId, embedderId, rerankerId, started, adapterNames } = ctx;
  return async (_req, res) => {
    const adapters = await adapterNames(tenantOf(res));
    res.json({
      object: 'list',
      data: [
        ...[decoderId, embedderId, rerankerId].map((id) => ({ id, object: 'model', created: started, owned_by: 'ragguard', root: id, parent: null })),
        ...adapters.map((id) => ({ id, object: 'model', created: started, owned_by: 'ragguard', root: path.join(service.adapters.dir, id), parent: decoderId })),
      ],
    });
  };
}

/** GET /openapi.json: every route's body schema (openapi.ts). */
export function openapiHandler(ctx: OpenAiContext): RequestHandler {
  return (_req, res) => {
    res.json(openapiDocument(schemasFor(ctx.service.cfg)));
  };
}
