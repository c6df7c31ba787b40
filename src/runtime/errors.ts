/**
 * The errors ragguard refuses a request with, in its own terms: a stable `code`, a message, and details
 * (snake_case fields, as a reply carries them). Below every layer that refuses (the admission queue and
 * the memory guard, the service, the library); what each means in HTTP (a status, a Retry-After
 * header) is decided in server/ alone (server/errors.ts). Besides them, the error every backend's run
 * ends with when its signal is aborted (RunInterrupted).
 */
export class RagguardError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly details: Readonly<Record<string, unknown>> = {},
  ) {
    super(message);
    this.name = new.target.name;
  }
}

/** The request can never be served as asked: its query, its context or its memory exceed a limit that will not change. */
export class TooLargeError extends RagguardError {}

/**
 * No room for the request now: every admission place is taken, or no slot or workspace came free within
 * the wait. Asking again later may succeed: `retryAfterSeconds` says when.
 */
export class BusyError extends RagguardError {
  constructor(code: string, message: string, readonly retryAfterSeconds: number, details: Readonly<Record<string, unknown>> = {}) {
    super(code, message, details);
  }
}

/** The request itself is malformed (the library's arguments). */
export class InvalidRequestError extends RagguardError {}

/** The instance the request was made to is closed. */
export class ClosedError extends RagguardError {}

/**
 * A model run stopped because its signal was aborted (every request it served was abandoned), by any
 * backend, or taken out of the run gate's line before it started (run-gate.ts): its outputs, in-place KV
 * buffers included, are not to be trusted. `reason` is the signal's: the request's answer where it is a
 * refusal (a drain's), else the request was abandoned by its client.
 */
export class RunInterrupted extends Error {
  override readonly name = 'RunInterrupted';
  constructor(readonly reason: unknown) {
    super(`run interrupted: ${reason instanceof Error ? reason.message : String(reason)}`);
  }
}
