/** POST /v1/embeddings: the embedder's vectors (float or base64) of texts or of the embedder's own token ids. */
import type { RequestHandler } from 'express';
import { HttpError } from '../errors.js';
import { guardedRun } from '../../service/guarded-run.js';
import { runOptions } from '../guarded.js';
import { chargeTokens, checkTokenBudget } from '../rate-limits.js';
import { parseBody, type EmbeddingBody } from '../schemas.js';
import { schemasFor } from '../validate.js';
import type { OpenAiContext } from './common.js';

export function embeddingsHandler(ctx: OpenAiContext): RequestHandler {
  const { service, admission, checkModel, embedderId } = ctx;
  const { cfg } = service;
  const { embedder } = service.models;
  /**
   * The model's input ids of each input: texts tokenized with special tokens (not yet cut at the limit,
   * so that an over-long one is refused), token ids taken as they are once checked against the vocabulary.
   */
  const embeddingRows = (input: EmbeddingBody['input']): number[][] => {
    if (typeof input === 'string') return [embedder.tokenizer.encode(input, true)];
    if (input.length > 0 && typeof input[0] === 'number') input = [input as number[]];
    return (input as (string | number[])[]).map((x, i) => {
      if (typeof x === 'string') return embedder.tokenizer.encode(x, true);
      const bad = x.findIndex((id) => id >= embedder.vocabSize);
      if (bad >= 0) {
        throw new HttpError(400, 'invalid_token_id',
          `input[${i}][${bad}] is token id ${x[bad]}, outside the embedder's vocabulary of ${embedder.vocabSize} (token ids are the embedder's own, not cl100k's)`,
          { param: 'input' });
      }
      return x;
    });
  };

  return async (req, res) => {
    const b = parseBody(schemasFor(cfg).embedding, req.body);
    checkModel(b.model, embedderId);
    checkTokenBudget(res);
    if (b.dimensions !== undefined && b.dimensions !== embedder.dimension) {
      throw new HttpError(400, 'unsupported_dimensions',
        `the embedder '${embedderId}' gives ${embedder.dimension} dimensions and cannot give ${b.dimensions}`, { param: 'dimensions' });
    }
    const rows = embeddingRows(b.input);
    const counts = rows.map((r) => r.length);
    // The embedder would cut a longer input at its limit: say so instead of embedding part of it.
    const over = rows.findIndex((r) => r.length > embedder.maxTokens);
    if (over >= 0) {
      throw new HttpError(413, 'input_too_long', `input[${over}] has more than the embedder's ${embedder.maxTokens} tokens`, { param: 'input' });
    }
    const opts = runOptions(res);
    // Under the admission queue alone: the memory model has no shape for a batch of embeddings.
    const { result: vectors } = await guardedRun(service, admission, { work: () => embedder.embedIds(rows, undefined, opts.signal) }, opts);
    const d = embedder.dimension;
    const tokens = counts.reduce((a, n) => a + n, 0);
    // The key's tokens per minute count the inputs embedded, as a generation's count its prompt.
    chargeTokens(res, tokens);
    res.json({
      object: 'list',
      model: embedderId,
      data: rows.map((_, i) => {
        const v = vectors.subarray(i * d, (i + 1) * d);
        const embedding = b.encoding_format === 'base64' ? Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString('base64') : Array.from(v);
        return { object: 'embedding', index: i, embedding };
      }),
      usage: { prompt_tokens: tokens, total_tokens: tokens },
    });
  };
}
