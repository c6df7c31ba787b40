/**
 * What the OpenAI-compatible routes share: OpenAI's error fields, ids and timestamps, usage, and the
 * context each route is built over (the service, its queue, the model ids, the checks every route makes).
 */
import { randomBytes } from 'node:crypto';
import { readdir } from 'node:fs/promises';
import path from 'node:path';
import { ChatTemplate } from '../../generate/chat-template.js';
import type { Generation } from '../../generate/generation.js';
import type { Admission } from '../../guards/admission.js';
import type { RagService } from '../../service/rag.js';
import { HttpError, toHttpError } from '../errors.js';
import { type ChatCompletionBody, type CompletionBody } from '../schemas.js';
import { samplingOptions } from '../validate.js';
import { SseStream } from '../sse.js';
import type { SamplingParams } from '../../generate/sequence.js';
import { AdapterInvalidError, AdapterNotFoundError } from '../../generate/adapters.js';
import { type StructuredOutputs } from '../structured.js';
import { checkAdapter, mayUseAdapter, OPEN_TENANT, type Tenant } from '../tenant.js';

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

export const newId = (prefix: string) => `${prefix}-${randomBytes(12).toString('hex')}`;
export const now = () => Math.floor(Date.now() / 1000);

export type Usage = { prompt_tokens: number; completion_tokens: number; total_tokens: number };
/**
 * A choice's own ragguard field: `steered_to_close` where a structured output's max_tokens budget left
 * out a continuation the schema allowed, so that the JSON closed in time (it is whole, and may be
 * shorter than the model would have written): nothing about the reply differs silently.
 */
export const steering = (g: Generation | undefined) => (g?.steered ? { ragguard: { steered_to_close: true } } : {});
export const usage = (prompt: number, completion: number): Usage => ({ prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion });

/** What every OpenAI route is built over. */
export interface OpenAiContext {
  service: RagService;
  admission: Admission;
  outputs: StructuredOutputs;
  /** The decoder's chat template (its own, or the fallback). */
  chat: ChatTemplate;
  decoderId: string;
  embedderId: string;
  rerankerId: string;
  /** When the routes were built: the models' `created`. */
  started: number;
  maxPositions: number;
  /** 404 model_not_found unless `model` is `want`. */
  checkModel(model: string, want: string): void;
  /**
   * The base decoder (undefined) or a LoRA adapter's name, checked against its files before anything runs;
   * 403 adapter_forbidden first where `tenant`'s key may not use it (tenant.ts).
   */
  generationModel(model: string, tenant?: Tenant): Promise<string | undefined>;
  /** Adapter directories under RAGGUARD_ADAPTER_DIR that this decoder can serve (those `tenant`'s key may use). */
  adapterNames(tenant?: Tenant): Promise<string[]>;
  /** The prompt and its answer's room must fit the decoder's positions. */
  checkContext(promptTokens: number, maxTokens: number): void;
  /** A body's sampling parameters. */
  params(b: ChatCompletionBody | CompletionBody, maxTokens: number, logprobs: number | undefined): SamplingParams;
}

export function openaiContext(service: RagService, admission: Admission, outputs: StructuredOutputs): OpenAiContext {
  const { cfg } = service;
  const { decoder } = service.models;
  const decoderId = path.basename(cfg.decoderPath);
  const maxPositions = decoder.shape.maxPositions;

  const checkModel = (model: string, want: string) => {
    if (model !== want) {
      throw new HttpError(404, 'model_not_found', `the model '${model}' does not exist here; this route serves '${want}' (GET /v1/models)`, { param: 'model' });
    }
  };

  /** The base decoder (undefined) or a LoRA adapter's name, checked against its files before anything runs. */
  const generationModel = async (model: string, tenant: Tenant = OPEN_TENANT): Promise<string | undefined> => {
    if (model === decoderId) return undefined;
    // Before the files: a key learns nothing of adapters outside its list (any other name is 403 to it).
    checkAdapter(tenant, model, 'model');
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
  const adapterNames = async (tenant: Tenant = OPEN_TENANT): Promise<string[]> => {
    if (service.adapters.unavailable) return [];
    const names = (await readdir(service.adapters.dir).catch(() => [] as string[])).filter((n) => mayUseAdapter(tenant, n));
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

  return {
    service, admission, outputs, chat: ChatTemplate.forModel(decoder.tokenizer, decoder.bosId), decoderId,
    embedderId: path.basename(cfg.embedderPath), rerankerId: path.basename(cfg.rerankerPath), started: now(), maxPositions,
    checkModel, generationModel, adapterNames, checkContext, params,
  };
}

/** A failure after the stream started: one `data: {"error": ...}` event (as OpenAI sends it), unless the client left. */
export function streamError(sse: SseStream, e: unknown): void {
  if (sse.closed) return;
  const err = toHttpError(e);
  if (err.status >= 500) console.error('stream failed:', e);
  sse.send(openaiErrorBody(err));
}

/** The closing chunks a streamed reply ends with (ReplyShapes, generate.ts; the chat's own). */
export interface ClosingShapes {
  /** Choice `index`'s closing chunk. */
  last(index: number, reason: string, g?: Generation): object;
  usageChunk(u: Usage): object;
}

/**
 * A stream's epilogue, as OpenAI ends one: each choice's closing chunk (choice i is `gens[i]`, with its
 * finish reason), the usage chunk where stream_options.include_usage asked, then `data: [DONE]`.
 */
export function finishStream(sse: SseStream, shapes: ClosingShapes, gens: readonly Generation[], u: Usage, includeUsage: boolean): void {
  gens.forEach((g, i) => sse.send(shapes.last(i, g.finishReason, g)));
  if (includeUsage) sse.send(shapes.usageChunk(u));
  sse.sendRaw('[DONE]');
}

/** A reply's failure: thrown on (to the route's error handler) until its stream started, one error event after. */
export function failStream(sse: SseStream | undefined, e: unknown): void {
  if (!sse || !sse.started) throw e;
  streamError(sse, e);
}
