/** Errors that become HTTP replies: status plus `{error: {code, message, ...details}}`. */
import type { ServerResponse } from 'node:http';

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

/** A JSON reply on Node's own response (no express needed): the front door's and a drain's last answers. */
export function sendJson(res: ServerResponse, status: number, body: unknown, headers: Readonly<Record<string, string>> = {}, head = false): void {
  const json = Buffer.from(JSON.stringify(body));
  res.writeHead(status, { ...headers, 'Content-Type': 'application/json; charset=utf-8', 'Content-Length': json.length });
  res.end(head ? undefined : json);
}
