/**
 * OpenAI-compatible routes, for the clients and SDKs that speak OpenAI's API:
 *
 *   GET  /v1/models             the decoder and the embedder, by their directory names, and the LoRA
 *                               adapters under RAGGUARD_ADAPTER_DIR (as vLLM lists its LoRA modules:
 *                               `model: <adapter>` generates with it, `parent` names the base)
 *   POST /v1/chat/completions   messages through the model's chat template (chat-template.ts); the
 *                               `rag` extension grounds the answer on the index and adds `citations`
 *   POST /v1/completions        a text prompt, continued
 *   POST /v1/route-key          the router's prefix key for such a body (openai/route-key.ts)
 *   POST /v1/embeddings         the embedder's vectors (float or base64, as the official client asks), of
 *                               texts or of token ids of the embedder's own vocabulary (as vLLM takes them)
 *   POST /v1/rerank, /v1/score  the reranker (rerank-routes.ts)
 *   GET  /openapi.json          every route's body schema (openapi.ts)
 *
 * Every generation runs as /query's does: admission queue, memory guard (service/guarded-run.ts), the engine's
 * continuous batching. `stream: true` gives OpenAI's chunks as server-sent events, ending with
 * `data: [DONE]`; a client that closes the stream cancels its sequence. Errors are our
 * `{error: {code, message}}` with OpenAI's `type` (and `param` where a field is at fault) added, the
 * fields its clients read.
 *
 * Each route is its own module under openai/, built over one context (openai/common.ts: the service,
 * the admission queue, the model ids and the checks every route makes); a generation without retrieval
 * is openai/generate.ts's, a grounded chat the query pipeline's, both through the guarded run.
 */
import express, { type NextFunction, type Request, type Response } from 'express';
import type { Admission } from '../guards/admission.js';
import type { RagService } from '../service/rag.js';
import { isRefusal, toHttpError } from './errors.js';
import { StructuredOutputs } from './structured.js';
import { rerankRoutes } from './rerank-routes.js';
import { chatHandler } from './openai/chat.js';
import { openaiContext, openaiErrorBody } from './openai/common.js';
import { completionsHandler } from './openai/completions.js';
import { embeddingsHandler } from './openai/embeddings.js';
import { modelsHandler, openapiHandler } from './openai/models.js';
import { routeKeyHandler } from './openai/route-key.js';

export { openaiErrorBody };

export function openaiRoutes(service: RagService, admission: Admission, outputs = new StructuredOutputs(service.engine.runner)): express.Router {
  const ctx = openaiContext(service, admission, outputs);
  const router = express.Router();
  router.get('/openapi.json', openapiHandler(ctx));
  router.get('/v1/models', modelsHandler(ctx));
  router.post('/v1/embeddings', embeddingsHandler(ctx));
  router.post('/v1/completions', completionsHandler(ctx));
  router.post('/v1/chat/completions', chatHandler(ctx));
  router.post('/v1/route-key', routeKeyHandler(ctx));
  router.use(rerankRoutes(service, admission));

  // OpenAI's clients read error.type (and param): added to our {code, message}.
  router.use((err: unknown, req: Request, res: Response, next: NextFunction) => {
    if (!req.path.startsWith('/v1/')) return next(err);
    const e = toHttpError(err);
    if (!isRefusal(err) && e.status >= 500) console.error('request failed:', err);
    res.status(e.status).set(e.headers).json(openaiErrorBody(e));
  });
  return router;
}
