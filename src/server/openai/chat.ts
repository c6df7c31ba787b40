/** POST /v1/chat/completions: messages through the chat template; `rag` grounds the answer on the index and adds `citations`. */
import { chatContextPrompt } from '../../generate/chat-prompt.js';
import type { RequestHandler } from 'express';
import type { ChatMessage } from '../../generate/chat-template.js';
import type { Generation } from '../../generate/generation.js';
import type { AssembledPrompt, ContextChunk } from '../../generate/prompt.js';
import type { Citation } from '../../service/rag.js';
import { HttpError } from '../errors.js';
import { guardedQuery } from '../../service/guarded-run.js';
import { runOptions } from '../guarded.js';
import { parseBody } from '../schemas.js';
import { samplingOptions, schemasFor, searchFilter } from '../validate.js';
import { SseStream } from '../sse.js';
import { checkQueryShape } from '../../service/request-shape.js';
import { planChat, replyMessage, ToolDeltas } from '../structured.js';
import type { TokenLogprobs } from '../../generate/logprobs.js';
import { chatLogprobs } from '../openai-logprobs.js';
import { chargeTokens, checkTokenBudget } from '../rate-limits.js';
import { tenantOf } from '../tenant.js';
import { generateReply } from './generate.js';
import { failStream, finishStream, newId, now, steering, usage, type OpenAiContext, type Usage } from './common.js';

export function chatHandler(ctx: OpenAiContext): RequestHandler {
  const { service, admission, chat, outputs, generationModel, checkContext, params, maxPositions } = ctx;
  const { cfg } = service;
  const { decoder } = service.models;
  return async (req, res) => {
    const b = parseBody(schemasFor(cfg).chatCompletion, req.body);
    const tenant = tenantOf(res);
    const adapter = await generationModel(b.model, tenant);
    // Where a rag collection is named, the key's right to it is decided first (403 before 429).
    const filter = b.rag ? searchFilter(b.rag.collection, b.rag.filter, tenant) : undefined;
    checkTokenBudget(res);
    const maxTokens = b.max_completion_tokens ?? b.max_tokens ?? cfg.defaultMaxNewTokens;
    const plan = await planChat(b, chat, outputs);
    const messages: ChatMessage[] = plan.messages;
    const id = newId('chatcmpl');
    const created = now();
    const base = { id, object: 'chat.completion.chunk', created, model: b.model };
    const lp = (entries: readonly TokenLogprobs[] | undefined) => (b.logprobs ? chatLogprobs(entries ?? [], decoder.tokenizer) : null);
    // Tools asked for: each choice's text is read for calls, given as OpenAI's tool_calls deltas.
    const toolDeltas = plan.tools ? Array.from({ length: b.n ?? 1 }, () => new ToolDeltas(plan.tools!)) : undefined;
    const delta = (index: number, d: Record<string, unknown>, first: boolean) => ({
      ...base, choices: [{ index, delta: first ? { role: 'assistant', ...d } : d, logprobs: null, finish_reason: null }],
    });
    const shapes = {
      chunk: (index: number, content: string, first: boolean, entries?: readonly TokenLogprobs[]) => ({
        ...base, choices: [{ index, delta: first ? { role: 'assistant', content } : { content }, logprobs: lp(entries), finish_reason: null }],
      }),
      ...(toolDeltas ? { chunks: (index: number, text: string | null, first: boolean) => toolDeltas[index]!.deltas(text).map((d, i) => delta(index, d, first && i === 0)) } : {}),
      last: (index: number, reason: string, g?: Generation) => ({
        ...base, choices: [{ index, delta: {}, logprobs: null, finish_reason: toolDeltas?.[index]!.finishReason(reason) ?? reason, ...steering(g) }],
      }),
      usageChunk: (u: Usage) => ({ ...base, choices: [], usage: u }),
      reply: (gens: readonly Generation[], u: Usage, guard: Record<string, unknown>, citations?: Citation[]) => ({
        ...base, object: 'chat.completion',
        choices: gens.map((g, index) => {
          const { message, finishReason } = replyMessage(g.text, g.finishReason, plan.tools);
          return { index, message, logprobs: lp(g.logprobs), finish_reason: finishReason, ...steering(g) };
        }),
        usage: u,
        ...(citations ? { citations } : {}),
        ragguard: { guard },
      }),
    };
    const stream = b.stream ?? false;
    const includeUsage = b.stream_options?.include_usage ?? false;
    if (!b.rag) {
      const ids = chat.encode(messages, true, plan.extras);
      checkContext(ids.length, maxTokens);
      await generateReply(ctx, res, ids, { ...params(b, maxTokens, b.logprobs ? b.top_logprobs ?? 0 : undefined), grammar: plan.grammar }, b.n ?? 1, adapter, stream, includeUsage, shapes);
      return;
    }
    // The grounded path answers once, without logprobs: asked for, they are refused rather than left out.
    if ((b.n ?? 1) > 1) throw new HttpError(400, 'invalid_body', 'n > 1 is not supported with rag (one grounded answer per request)', { param: 'n' });
    if (b.logprobs) throw new HttpError(400, 'invalid_body', 'logprobs are not supported with rag', { param: 'logprobs' });
    // Grounded: retrieve on the last user message; the ranked chunks go into a system message ahead
    // of the conversation, as many as the context budget holds (rank order, a chunk that does not fit
    // giving way to a smaller one).
    const question = [...messages].reverse().find((m) => m.role === 'user')?.content.trim();
    if (!question) throw new HttpError(400, 'invalid_body', 'rag needs a user message with text to retrieve on', { param: 'messages' });
    const baseTokens = chat.encode(messages).length;
    checkContext(baseTokens, maxTokens);
    const promptFor = (chunks: readonly ContextChunk[], budget: number, between: () => Promise<void>): Promise<AssembledPrompt> =>
      chatContextPrompt(chat, service.template, messages, chunks, budget, between);
    const q = {
      query: question, topK: b.rag.top_k, rerankTopN: b.rag.rerank_top_n, maxNewTokens: maxTokens,
      temperature: b.temperature ?? 1, seed: b.seed, sampling: { ...samplingOptions(b, b.top_k), grammar: plan.grammar }, promptFor, adapter,
      filter, ...(tenant.cacheSalt === undefined ? {} : { cacheSalt: tenant.cacheSalt }),
      // The conversation, plus up to RAGGUARD_PROMPT_BUDGET tokens of context.
      promptBudget: Math.min(maxPositions - maxTokens, baseTokens + cfg.promptBudgetTokens),
    };
    checkQueryShape(q, service);
    const sse = stream ? new SseStream(res) : undefined;
    const opts = runOptions(res, sse);
    try {
      const { result: r, guard } = await guardedQuery(service, admission, {
        ...q,
        hooks: {
          signal: opts.signal,
          // The citations ride on the first chunk (a field OpenAI's clients ignore).
          onCitations: (citations) => sse?.send({ ...shapes.chunk(0, '', true), citations }),
          onToken: (t) => {
            if (sse && t.text) sse.send(shapes.chunk(0, t.text, false));
          },
        },
      }, {
        ...opts,
        // A reshape may drop context, not the conversation itself.
        floor: { promptTokens: baseTokens, message: `a conversation of ${baseTokens} tokens with ${maxTokens} new tokens can never fit the memory budget` },
      });
      const u = usage(r.usage.prompt_tokens, r.usage.completion_tokens);
      chargeTokens(res, u.total_tokens);
      const g: Generation = { ids: [], text: r.answer, finishReason: r.finish_reason, ...(r.steered_to_close ? { steered: true } : {}) };
      if (!sse) {
        res.json(shapes.reply([g], u, guard, r.citations));
        return;
      }
      finishStream(sse, shapes, [g], u, includeUsage);
    } catch (e) {
      failStream(sse, e);
    } finally {
      sse?.end();
    }
  };
}
