/**
 * Server-sent events on an express response. Headers go out with the first event, so that anything
 * failing before it (validation, the guard, a full queue) is still an ordinary JSON error reply.
 * `signal` fires when the client goes away before the stream ended: the generation it feeds is
 * cancelled (Engine.generate's AbortSignal).
 */
import type { Response } from 'express';

export class SseStream {
  private readonly controller = new AbortController();
  private ended = false;

  constructor(private readonly res: Response) {
    res.on('close', () => {
      if (!this.ended) this.controller.abort(new ClientGoneError());
    });
  }

  /** Aborted when the client closed the connection before the end of the stream. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  get started(): boolean {
    return this.res.headersSent;
  }

  get closed(): boolean {
    return this.controller.signal.aborted;
  }

  /** One event: `data: <json>` (with `event: <name>` when named). */
  send(data: unknown, event?: string): void {
    this.write(`${event ? `event: ${event}\n` : ''}data: ${JSON.stringify(data)}\n\n`);
  }

  /** A raw data line, as OpenAI's final `data: [DONE]`. */
  sendRaw(data: string): void {
    this.write(`data: ${data}\n\n`);
  }

  end(): void {
    if (this.ended) return;
    this.ended = true;
    if (!this.closed) this.res.end();
  }

  private write(text: string): void {
    if (this.closed || this.ended) return;
    if (!this.res.headersSent) {
      this.res.status(200).set({
        'Content-Type': 'text/event-stream; charset=utf-8',
        'Cache-Control': 'no-cache',
        Connection: 'keep-alive',
        // Proxies (nginx) must not buffer a stream.
        'X-Accel-Buffering': 'no',
      });
      this.res.flushHeaders();
    }
    try {
      this.res.write(text);
    } catch {
      // A socket that failed under us: the same as the client leaving (this runs inside the engine's step loop, which must not see it).
      this.controller.abort(new ClientGoneError());
    }
  }
}

/** The reason a stream's generation was cancelled. */
export class ClientGoneError extends Error {
  constructor() {
    super('the client closed the stream');
    this.name = 'AbortError';
  }
}
