/** POST /v1/completions: a text prompt, continued (one or n choices, logprobs, a response_format). */
import type { RequestHandler } from 'express';
import { HttpError } from '../errors.js';
import { parseBody } from '../schemas.js';
import { schemasFor } from '../validate.js';
import type { TokenLogprobs } from '../../generate/logprobs.js';
import { completionLogprobs } from '../openai-logprobs.js';
import { checkTokenBudget } from '../rate-limits.js';
import { tenantOf } from '../tenant.js';
import { generateReply } from './generate.js';
import { newId, now, steering, type OpenAiContext } from './common.js';

export function completionsHandler(ctx: OpenAiContext): RequestHandler {
  const { service, chat, outputs, generationModel, checkContext, params } = ctx;
  const { cfg } = service;
  const { decoder } = service.models;
  return async (req, res) => {
    const b = parseBody(schemasFor(cfg).completion, req.body);
    const adapter = await generationModel(b.model, tenantOf(res));
    checkTokenBudget(res);
    const maxTokens = b.max_tokens ?? 16; // OpenAI's default for completions
    const text = typeof b.prompt === 'string' ? b.prompt : b.prompt[0]!;
    const ids = chat.encodeText(text);
    if (ids.length === 0) throw new HttpError(400, 'invalid_body', 'prompt is empty (and this tokenizer adds no BOS)', { param: 'prompt' });
    checkContext(ids.length, maxTokens);
    const grammar = await outputs.forFormat(b.response_format);
    const id = newId('cmpl');
    const created = now();
    const base = { id, object: 'text_completion', created, model: b.model };
    const tok = decoder.tokenizer;
    // Streamed, each choice's text_offset goes on from where its last chunk's ended.
    const offsets: number[] = [];
    const lp = (index: number, entries: readonly TokenLogprobs[] | undefined) => {
      if (b.logprobs === undefined) return null;
      const { logprobs, end } = completionLogprobs(entries ?? [], tok, offsets[index] ?? 0);
      offsets[index] = end;
      return logprobs;
    };
    await generateReply(ctx, res, ids, { ...params(b, maxTokens, b.logprobs), grammar }, b.n ?? 1, adapter, b.stream ?? false, b.stream_options?.include_usage ?? false, {
      chunk: (index, text, _first, entries) => ({ ...base, choices: [{ index, text, logprobs: lp(index, entries), finish_reason: null }] }),
      last: (index, reason, g) => ({ ...base, choices: [{ index, text: '', logprobs: null, finish_reason: reason, ...steering(g) }] }),
      usageChunk: (u) => ({ ...base, choices: [], usage: u }),
      reply: (gens, u, guard) => ({
        ...base,
        choices: gens.map((g, index) => ({ index, text: g.text, logprobs: lp(index, g.logprobs), finish_reason: g.finishReason, ...steering(g) })),
        usage: u, ragguard: { guard },
      }),
    });
  };
}
