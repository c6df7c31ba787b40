/**
 * Errors as HTTP replies: a status plus `{error: {code, message, ...details}}`. The one place that says
 * what each of ragguard's own refusals (runtime/errors.ts) and the layers' error types mean in HTTP:
 * too large 413, busy 503 with Retry-After, an invalid request 400, a closed instance 503.
 */
import type { ServerResponse } from 'node:http';
import { AdapterBusyError, AdapterInvalidError } from '../generate/adapters.js';
import { PromptNeverFitsError, UnsupportedSamplingError } from '../generate/engine.js';
import { BusyError, ClosedError, InvalidRequestError, RagguardError, RunInterrupted, TooLargeError } from '../runtime/errors.js';
import { InvalidUtf8Error } from './json-body.js';

/** An error with the reply it becomes: what the routes throw, and what toHttpError makes of anything else. */
export class HttpError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly details: Readonly<Record<string, unknown>> = {},
    readonly headers: Readonly<Record<string, string>> = {},
  ) {
    super(message);
    this.name = 'HttpError';
  }

  body(): { error: Record<string, unknown> } {
    return { error: { code: this.code, message: this.message, ...this.details } };
  }
}

export const badRequest = (code: string, message: string) => new HttpError(400, code, message);

/** Whether `err` is a deliberate refusal (an HttpError or one of ragguard's own), not a failure nothing anticipated. */
export const isRefusal = (err: unknown): boolean => err instanceof HttpError || err instanceof RagguardError;

/** A JSON reply on Node's own response (no express needed): the front door's and a drain's last answers. */
export function sendJson(res: ServerResponse, status: number, body: unknown, headers: Readonly<Record<string, string>> = {}, head = false): void {
  const json = Buffer.from(JSON.stringify(body));
  res.writeHead(status, { ...headers, 'Content-Type': 'application/json; charset=utf-8', 'Content-Length': json.length });
  res.end(head ? undefined : json);
}

/** body-parser's errors carry a status and a type; anything else unknown is a 500. */
export function toHttpError(err: unknown): HttpError {
  if (err instanceof HttpError) return err;
  if (err instanceof RagguardError) return fromRefusal(err);
  // A run stopped because its request was abandoned or drained: the abort's own reason is the reply.
  if (err instanceof RunInterrupted) return isRefusal(err.reason) ? toHttpError(err.reason) : new HttpError(499, 'client_closed_request', err.message);
  if (err instanceof PromptNeverFitsError) return new HttpError(413, 'context_too_long', err.message);
  if (err instanceof UnsupportedSamplingError) return new HttpError(422, 'unsupported_sampling', err.message);
  if (err instanceof AdapterBusyError) return new HttpError(503, 'adapters_busy', err.message, {}, { 'Retry-After': '1' });
  if (err instanceof AdapterInvalidError) return new HttpError(422, 'adapter_invalid', err.message);
  const e = err as { status?: number; type?: string; message?: string };
  if (err instanceof InvalidUtf8Error) return new HttpError(400, 'invalid_json', err.message, { byte_offset: err.offset });
  if (e?.type === 'entity.parse.failed') return new HttpError(400, 'invalid_json', 'request body is not valid JSON');
  if (e?.type === 'entity.too.large') return new HttpError(413, 'payload_too_large', 'request body exceeds RAGGUARD_MAX_DOCUMENT_BYTES');
  if (typeof e?.status === 'number' && e.status >= 400 && e.status < 500) {
    return new HttpError(e.status, e.type?.replace(/\W+/g, '_') ?? 'bad_request', e.message ?? 'bad request');
  }
  return new HttpError(500, 'internal', 'internal error');
}

/** ragguard's own refusals in HTTP. */
function fromRefusal(err: RagguardError): HttpError {
  if (err instanceof TooLargeError) return new HttpError(413, err.code, err.message, err.details);
  if (err instanceof BusyError) return new HttpError(503, err.code, err.message, err.details, { 'Retry-After': String(err.retryAfterSeconds) });
  if (err instanceof InvalidRequestError) return new HttpError(400, err.code, err.message, err.details);
  if (err instanceof ClosedError) return new HttpError(503, err.code, err.message, err.details);
  return new HttpError(500, err.code, err.message, err.details);
}
