/**
 * The cross-encoder as routes, in the shapes rerank clients already speak:
 *
 *   POST /v1/rerank  {model, query, documents: string[] | {text}[], top_n?, return_documents?}
 *                    -> {id, model, results: [{index, relevance_score, document?: {text}}], usage}
 *                    (Jina's and Cohere's reply, as vLLM and llama.cpp serve it), most relevant first
 *   POST /v1/score   {model, text_1, text_2}: str or list each (vLLM's pairing rules)
 *                    -> {id, object: 'list', model, data: [{index, object: 'score', score}], usage}
 *
 * Scores are relevance(logit) of the reranker (reranker.ts): the sigmoid of its one logit, as vLLM
 * scores such a model, in (0, 1). A pair longer than the reranker takes is cut as /query cuts it (the
 * query kept whole, the document's tail dropped, as Cohere's and Jina's APIs truncate by default) and
 * the reply names those in `ragguard.truncated`, rather than leaving it unsaid.
 *
 * Each request runs as every model run does: the memory guard predicts its rerank stage (its pairs,
 * the longest pair's tokens) and may lower the pairs per run, never drop a document (413 where even
 * that cannot fit), then the admission queue and a workspace reservation (service/guarded-run.ts).
 * The pairs' tokens (as in `usage`) are charged to the key's tokens per minute (rate-limits.ts); a key
 * that has used them up gets 429 token_limit before anything runs.
 */
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import express, { type Response } from 'express';
import type { Admission } from '../guards/admission.js';
import type { RequestShape } from '../guards/memory-model.js';
import type { RagService } from '../service/rag.js';
import { RERANK_BATCH, relevance } from '../retrieval/reranker.js';
import { HttpError } from './errors.js';
import { guardedRun } from '../service/guarded-run.js';
import { metricsFor } from './metrics.js';
import { chargeTokens, checkTokenBudget } from './rate-limits.js';
import { parseBody, type ScoreBody } from './schemas.js';
import { requestSignal } from './shutdown.js';
import { schemasFor } from './validate.js';

/** The pairs of a /v1/score body, by vLLM's rules: one text against each of a list, or two lists in order. */
export function scorePairs(b: Pick<ScoreBody, 'text_1' | 'text_2'>): [string, string][] {
  const t1 = typeof b.text_1 === 'string' ? [b.text_1] : b.text_1;
  const t2 = typeof b.text_2 === 'string' ? [b.text_2] : b.text_2;
  if (t1.length === 1) return t2.map((t) => [t1[0]!, t]);
  if (t1.length !== t2.length) {
    throw new HttpError(400, 'invalid_body', `text_1 has ${t1.length} texts and text_2 ${t2.length}: a list of text_1 pairs with text_2 one to one (or give one text_1)`,
      { param: 'text_2' });
  }
  return t1.map((t, i) => [t, t2[i]!]);
}

/** The memory guard's shape of scoring these pairs: the rerank stage alone, every pair kept. */
function rerankShape(pairs: number, pairTokens: number): RequestShape {
  return { queryTokens: 0, topK: pairs, rerankTopN: pairs, pairTokens, rerankBatch: Math.min(RERANK_BATCH, pairs), promptTokens: 0, maxNewTokens: 0 };
}

export function rerankRoutes(service: RagService, admission: Admission): express.Router {
  const router = express.Router();
  const { reranker } = service.models;
  const rerankerId = path.basename(service.cfg.rerankerPath);
  const metrics = metricsFor(service);

  /** The pairs' relevance scores, guarded; with the token count (usage) and the pairs that were cut. */
  const score = async (res: Response, route: '/v1/rerank' | '/v1/score', model: string | undefined, pairs: readonly (readonly [string, string])[]) => {
    if (model !== undefined && model !== rerankerId) {
      throw new HttpError(404, 'model_not_found', `the model '${model}' does not exist here; this route serves the reranker '${rerankerId}'`, { param: 'model' });
    }
    checkTokenBudget(res);
    // Tokenized once here for the guard's shape and the usage; the reranker cuts over-long pairs itself.
    const lengths = pairs.map(([q, p]) => reranker.tokenizer.encodePair(q, p).ids.length);
    const truncated = lengths.flatMap((n, i) => (n > reranker.maxTokens ? [i] : []));
    const pairTokens = Math.min(reranker.maxTokens, Math.max(...lengths));
    const signal = requestSignal(res);
    const { result: { scores } } = await guardedRun(service, admission, {
      shape: () => rerankShape(pairs.length, pairTokens),
      // A reshape may lower the pairs per run, never drop a document.
      floor: { topK: pairs.length, message: `${pairs.length} pairs can never be scored within the memory budget`, details: { param: 'documents' } },
      work: (shape) => reranker.scorePairs(pairs, shape?.rerankBatch ?? RERANK_BATCH, signal),
    }, { signal });
    metrics.reranked(route, pairs.length);
    const tokens = lengths.reduce((a, n) => a + Math.min(n, reranker.maxTokens), 0);
    // The key's tokens per minute count the pairs' tokens as scored (cut pairs at the reranker's limit).
    chargeTokens(res, tokens);
    return { scores: scores.map(relevance), usage: { prompt_tokens: tokens, total_tokens: tokens }, truncated };
  };

  router.post('/v1/rerank', async (req, res) => {
    const b = parseBody(schemasFor(service.cfg).rerank, req.body);
    const texts = b.documents.map((d) => (typeof d === 'string' ? d : d.text));
    const r = await score(res, '/v1/rerank', b.model, texts.map((t) => [b.query, t] as const));
    const order = r.scores.map((_, i) => i).sort((a, c) => r.scores[c]! - r.scores[a]! || a - c);
    const results = order.slice(0, b.top_n ?? order.length).map((index) => ({
      index, relevance_score: r.scores[index]!, ...(b.return_documents ?? true ? { document: { text: texts[index]! } } : {}),
    }));
    res.json({ id: `rerank-${randomBytes(12).toString('hex')}`, model: rerankerId, results, usage: r.usage, ragguard: { truncated: r.truncated } });
  });

  router.post('/v1/score', async (req, res) => {
    const b = parseBody(schemasFor(service.cfg).score, req.body);
    const r = await score(res, '/v1/score', b.model, scorePairs(b));
    res.json({
      id: `score-${randomBytes(12).toString('hex')}`, object: 'list', created: Math.floor(Date.now() / 1000), model: rerankerId,
      data: r.scores.map((score, index) => ({ index, object: 'score', score })), usage: r.usage, ragguard: { truncated: r.truncated },
    });
  });

  return router;
}
