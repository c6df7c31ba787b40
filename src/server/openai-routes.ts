/**
 * OpenAI-compatible routes, for the clients and SDKs that speak OpenAI's API:
 *
 *   GET  /v1/models             the decoder and the embedder, by their directory names, and the LoRA
 *                               adapters under RAGGUARD_ADAPTER_DIR (as vLLM lists its LoRA modules:
 *                               `model: <adapter>` generates with it, `parent` names the base)
 *   POST /v1/chat/completions   messages through the model's chat template (chat-template.ts); the
 *                               `rag` extension grounds the answer on the index and adds `citations`
 *   POST /v1/completions        a text prompt, continued
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
 */
import { chatContextPrompt } from '../generate/chat-prompt.js';
import { randomBytes } from 'node:crypto';
import { readdir } from 'node:fs/promises';
import path from 'node:path';
import express, { type NextFunction, type Request, type Response } from 'express';
import { ChatTemplate, type ChatMessage } from '../generate/chat-template.js';
import type { Generation } from '../generate/generation.js';
import type { AssembledPrompt, ContextChunk } from '../generate/prompt.js';
import type { Admission } from '../guards/admission.js';
import type { Citation, RagService } from '../service/rag.js';
import { HttpError, isRefusal, toHttpError } from './errors.js';
import { generationShape, guardedQuery, guardedRun } from '../service/guarded-run.js';
import { runOptions } from './guarded.js';
import { openapiDocument } from './openapi.js';
import { parseBody, type ChatCompletionBody, type CompletionBody, type EmbeddingBody } from './schemas.js';
import { samplingOptions, schemasFor, searchFilter } from './validate.js';
import { SseStream } from './sse.js';
import type { SamplingParams } from '../generate/sequence.js';
import { checkQueryShape } from '../service/request-shape.js';
import { AdapterInvalidError, AdapterNotFoundError } from '../generate/adapters.js';
import { planChat, replyMessage, StructuredOutputs, ToolDeltas } from './structured.js';
import type { TokenLogprobs } from '../generate/logprobs.js';
import { chatLogprobs, completionLogprobs } from './openai-logprobs.js';
import { rerankRoutes } from './rerank-routes.js';
import { chargeTokens, checkTokenBudget } from './rate-limits.js';
import { tenantOf } from './tenant.js';

/** OpenAI's error `type` for a status. */
function errorType(status: number): string {
  if (status === 401) return 'authentication_error';
  if (status === 403) return 'permission_error';
  if (status === 404) return 'not_found_error';
  if (status === 429 || status === 503) return 'server_overloaded';
  if (status >= 500) return 'server_error';
  return 'invalid_request_error';
}

/** Our error body with OpenAI's fields (message, type, code, param) present. */
export function openaiErrorBody(e: HttpError): { error: Record<string, unknown> } {
  const b = e.body().error;
  return { error: { ...b, type: errorType(e.status), param: b['param'] ?? null } };
}

const newId = (prefix: string) => `${prefix}-${randomBytes(12).toString('hex')}`;
const now = () => Math.floor(Date.now() / 1000);

type Usage = { prompt_tokens: number; completion_tokens: number; total_tokens: number };
/**
 * A choice's own ragguard field: `steered_to_close` where a structured output's max_tokens budget left
 * out a continuation the schema allowed, so that the JSON closed in time (it is whole, and may be
 * shorter than the model would have written): nothing about the reply differs silently.
 */
const steering = (g: Generation | undefined) => (g?.steered ? { ragguard: { steered_to_close: true } } : {});
const usage = (prompt: number, completion: number): Usage => ({ prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion });

export function openaiRoutes(service: RagService, admission: Admission, outputs = new StructuredOutputs(service.engine.runner)): express.Router {
  const { cfg } = service;
  const { decoder, embedder } = service.models;
  const router = express.Router();
  const chat = ChatTemplate.forModel(decoder.tokenizer, decoder.bosId);
  const decoderId = path.basename(cfg.decoderPath);
  const embedderId = path.basename(cfg.embedderPath);
  const rerankerId = path.basename(cfg.rerankerPath);
  const started = now();
  const maxPositions = decoder.shape.maxPositions;

  const checkModel = (model: string, want: string) => {
    if (model !== want) {
      throw new HttpError(404, 'model_not_found', `the model '${model}' does not exist here; this route serves '${want}' (GET /v1/models)`, { param: 'model' });
    }
  };

  /** The base decoder (undefined) or a LoRA adapter's name, checked against its files before anything runs. */
  const generationModel = async (model: string): Promise<string | undefined> => {
    if (model === decoderId) return undefined;
    try {
      await service.adapters.inspect(model);
      return model;
    } catch (e) {
      if (e instanceof AdapterNotFoundError) {
        throw new HttpError(404, 'model_not_found', `the model '${model}' does not exist here: neither the decoder '${decoderId}' nor an adapter (${e.message})`, { param: 'model' });
      }
      if (e instanceof AdapterInvalidError) throw new HttpError(422, 'adapter_invalid', e.message, { param: 'model' });
      throw e;
    }
  };

  /** Adapter directories (a PEFT adapter_config.json in each) under RAGGUARD_ADAPTER_DIR; none where adapters cannot run. */
  const adapterNames = async (): Promise<string[]> => {
    if (service.adapters.unavailable) return [];
    const names = await readdir(service.adapters.dir).catch(() => [] as string[]);
    // Only adapters this decoder can serve (the directory may hold adapters of other models, as setup's
    // does for the default and the small test decoder); inspect is cached by the files' size and time.
    const ok = await Promise.all(names.map((n) => service.adapters.inspect(n).then(() => true, () => false)));
    return names.filter((_, i) => ok[i]).sort();
  };

  /** The prompt and its answer's room must fit the decoder's positions. */
  const checkContext = (promptTokens: number, maxTokens: number) => {
    if (promptTokens + maxTokens > maxPositions) {
      throw new HttpError(413, 'context_too_long',
        `the prompt's ${promptTokens} tokens plus max_tokens ${maxTokens} exceed the decoder's ${maxPositions} positions`,
        { prompt_tokens: promptTokens, param: 'max_tokens' });
    }
  };

  const params = (b: ChatCompletionBody | CompletionBody, maxTokens: number, logprobs: number | undefined): SamplingParams => ({
    ...samplingOptions(b, b.top_k), maxNewTokens: maxTokens, temperature: b.temperature ?? 1, seed: b.seed,
    ...(logprobs !== undefined ? { logprobs } : {}), ...(b.ignore_eos ? { ignoreEos: true } : {}),
  });

  router.get('/openapi.json', (_req, res) => {
    res.json(openapiDocument(schemasFor(cfg)));
  });

  router.get('/v1/models', async (_req, res) => {
    const adapters = await adapterNames();
    res.json({
      object: 'list',
      data: [
        ...[decoderId, embedderId, rerankerId].map((id) => ({ id, object: 'model', created: started, owned_by: 'ragguard', root: id, parent: null })),
        ...adapters.map((id) => ({ id, object: 'model', created: started, owned_by: 'ragguard', root: path.join(service.adapters.dir, id), parent: decoderId })),
      ],
    });
  });

  router.post('/v1/embeddings', async (req, res) => {
    const b = parseBody(schemasFor(cfg).embedding, req.body);
    checkModel(b.model, embedderId);
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
    res.json({
      object: 'list',
      model: embedderId,
      data: rows.map((_, i) => {
        const v = vectors.subarray(i * d, (i + 1) * d);
        const embedding = b.encoding_format === 'base64' ? Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString('base64') : Array.from(v);
        return { object: 'embedding', index: i, embedding };
      }),
      usage: { prompt_tokens: counts.reduce((a, n) => a + n, 0), total_tokens: counts.reduce((a, n) => a + n, 0) },
    });
  });

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

  router.post('/v1/completions', async (req, res) => {
    const b = parseBody(schemasFor(cfg).completion, req.body);
    const adapter = await generationModel(b.model);
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
    await generateReply(res, ids, { ...params(b, maxTokens, b.logprobs), grammar }, b.n ?? 1, adapter, b.stream ?? false, b.stream_options?.include_usage ?? false, {
      chunk: (index, text, _first, entries) => ({ ...base, choices: [{ index, text, logprobs: lp(index, entries), finish_reason: null }] }),
      last: (index, reason, g) => ({ ...base, choices: [{ index, text: '', logprobs: null, finish_reason: reason, ...steering(g) }] }),
      usageChunk: (u) => ({ ...base, choices: [], usage: u }),
      reply: (gens, u, guard) => ({
        ...base,
        choices: gens.map((g, index) => ({ index, text: g.text, logprobs: lp(index, g.logprobs), finish_reason: g.finishReason, ...steering(g) })),
        usage: u, ragguard: { guard },
      }),
    });
  });

  router.post('/v1/chat/completions', async (req, res) => {
    const b = parseBody(schemasFor(cfg).chatCompletion, req.body);
    const adapter = await generationModel(b.model);
    const tenant = tenantOf(res);
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
      await generateReply(res, ids, { ...params(b, maxTokens, b.logprobs ? b.top_logprobs ?? 0 : undefined), grammar: plan.grammar }, b.n ?? 1, adapter, stream, includeUsage, shapes);
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
      sse.send(shapes.last(0, r.finish_reason, g));
      if (includeUsage) sse.send(shapes.usageChunk(u));
      sse.sendRaw('[DONE]');
    } catch (e) {
      if (!sse || !sse.started) throw e;
      streamError(sse, e);
    } finally {
      sse?.end();
    }
  });

  interface ReplyShapes {
    /** Choice `index`'s next text, and the logprobs of the tokens it completes (where asked). */
    chunk(index: number, text: string, first: boolean, logprobs?: readonly TokenLogprobs[]): object;
    /** Choice `index`'s closing chunk; `g`, its generation, where one was made here. */
    last(index: number, reason: string, g?: Generation): object;
    usageChunk(u: Usage): object;
    reply(gens: readonly Generation[], u: Usage, guard: Record<string, unknown>): object;
    /** Choice `index`'s chunks for generated text (null: its end) where they are not one content chunk each (tool calls). */
    chunks?(index: number, text: string | null, first: boolean): object[];
  }

  /**
   * A generation without retrieval, guarded, as one reply or as a stream of chunks: `n` samples of the
   * prompt (engine.generateMany), the prompt counted once in the usage (as OpenAI counts it). The guard
   * predicts n decode rows and the KV of n samples' new tokens besides the one prompt (RequestShape.samples).
   */
  async function generateReply(res: Response, ids: number[], p: SamplingParams, n: number, adapter: string | undefined, stream: boolean,
    includeUsage: boolean, shapes: ReplyShapes): Promise<void> {
    const salt = tenantOf(res).cacheSalt;
    const sse = stream ? new SseStream(res) : undefined;
    const opts = runOptions(res, sse);
    const signal = opts.signal;
    const first = new Array<boolean>(n).fill(true);
    // A token's logprobs go out with the chunk that carries its text (some tokens make no text yet).
    const held: TokenLogprobs[][] = Array.from({ length: n }, () => []);
    const send = (index: number, text: string | null) => {
      if (shapes.chunks) {
        for (const c of shapes.chunks(index, text, first[index]!)) {
          sse!.send(c);
          first[index] = false;
        }
        return;
      }
      if (text === null) return;
      const lps = held[index]!.splice(0);
      sse!.send(shapes.chunk(index, text, first[index]!, p.logprobs === undefined ? undefined : lps));
      first[index] = false;
    };
    try {
      const asked = generationShape(ids.length, p.maxNewTokens, n);
      const { result: gens, guard } = await guardedRun(service, admission, {
        shape: () => asked,
        // The prompt is the client's own: a reshape cannot shorten it.
        floor: { promptTokens: ids.length, message: `a prompt of ${ids.length} tokens with ${p.maxNewTokens} new tokens can never fit the memory budget` },
        work: async (shape) => {
          // The adapter loads for this generation (or shares a running one's slot) and is released after.
          const lease = adapter === undefined ? undefined : await service.adapters.acquire(adapter, signal);
          try {
            return await service.engine.generateMany(ids, { ...p, maxNewTokens: shape?.maxNewTokens ?? p.maxNewTokens, adapter: lease?.adapter, ...(salt === undefined ? {} : { cacheSalt: salt }) }, n, {
              signal,
              onToken: sse && ((index, t) => {
                if (t.logprobs) held[index]!.push(t.logprobs);
                if (t.text) send(index, t.text);
              }),
            });
          } finally {
            lease?.release();
          }
        },
        asRun: (g, decided) => ({ ...decided, cachedTokens: g[0]!.cachedTokens ?? 0 }),
      }, opts);
      const u = usage(ids.length, gens.reduce((a, g) => a + g.ids.length, 0));
      chargeTokens(res, u.total_tokens);
      if (!sse) {
        res.json(shapes.reply(gens, u, guard));
        return;
      }
      // An empty answer still announces the role; logprobs of tokens that made no text go out here.
      for (let i = 0; i < n; i++) send(i, null);
      for (let i = 0; i < n; i++) {
        if (!first[i] && held[i]!.length === 0) continue;
        sse.send(shapes.chunk(i, '', first[i]!, p.logprobs === undefined ? undefined : held[i]!.splice(0)));
        first[i] = false;
      }
      gens.forEach((g, i) => sse.send(shapes.last(i, g.finishReason, g)));
      if (includeUsage) sse.send(shapes.usageChunk(u));
      sse.sendRaw('[DONE]');
    } catch (e) {
      if (!sse || !sse.started) throw e;
      streamError(sse, e);
    } finally {
      sse?.end();
    }
  }

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

/** A failure after the stream started: one `data: {"error": ...}` event (as OpenAI sends it), unless the client left. */
function streamError(sse: SseStream, e: unknown): void {
  if (sse.closed) return;
  const err = toHttpError(e);
  if (err.status >= 500) console.error('stream failed:', e);
  sse.send(openaiErrorBody(err));
}
