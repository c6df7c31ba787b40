/**
 * Errors that become replies: a status plus `{error: {code, message, ...details}}`. Below the server so
 * that every layer (the guards' 413/503, a store's 404, a parser's 415/422) says what went wrong in the
 * shape the HTTP layer sends as it is (server/errors.ts turns everything else into one).
 */
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
