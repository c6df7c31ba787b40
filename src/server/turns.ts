/**
 * Request preparation one request per turn of the event loop, and none while a burst is still
 * arriving.
 *
 * A burst's requests arrive in one poll of the event loop; each one's preparation (parsing, tokenizing
 * the query, the guard's prediction) is a millisecond or two of JavaScript, and run back to back inside
 * that poll they held a probe, or a shed request's 503, behind all of them (a burst of 200: up to a
 * second on 2 busy cores). Waiting for its turn here, each request prepares on a later turn, one per
 * turn, with the loop's I/O (probes, new connections, load shedding) served in between.
 *
 * One per turn was not enough. The server accepts one connection per turn of the event loop (libuv
 * since 1.45 accepts once per poll, not until the backlog is empty), so a burst of 200 connections
 * takes 200 turns to come in, and every turn also carried the admitted queries' work: a preparation,
 * then their embedding, retrieval, prompt and decoding, whose JavaScript (tokenizing, BM25, the KV
 * gather) runs on this thread. The burst's later connections, the ones to be shed, were accepted
 * 200-600 ms after they were sent (2 cores shared with other work), although each was decided from
 * the counts alone as soon as it was read. So intake goes first: while requests keep arriving (more
 * than one since the last preparation, the last under `quietMs` ago), preparation waits, up to
 * `windowMs`; then it goes on one per turn, and it waits again only after arrivals have paused (a
 * stream that never pauses gets one wait, not one per request). A request arriving alone is prepared
 * on the next turn, as before.
 */

export interface TurnOptions {
  /** Arrivals closer together than this are one burst. */
  quietMs: number;
  /** Longest wait for a burst's intake before preparation goes on regardless. */
  windowMs: number;
  now?: () => number;
  /** Calls `fn` after `ms` (setTimeout; a test drives its own clock). */
  after?: (fn: () => void, ms: number) => void;
}

export class Turns {
  private readonly waiting: (() => void)[] = [];
  private scheduled = false;
  /** Requests arrived since the last preparation, and when the last one did. */
  private arrivals = 0;
  private lastArrival = -Infinity;
  /** When the current wait for intake began. */
  private waitingSince: number | undefined;
  /** False once a wait has used its window, until arrivals pause. */
  private armed = true;
  private readonly now: () => number;
  private readonly after: (fn: () => void, ms: number) => void;

  constructor(private readonly opts: TurnOptions) {
    this.now = opts.now ?? (() => performance.now());
    this.after = opts.after ?? ((fn, ms) => void setTimeout(fn, ms));
  }

  /** A request has arrived (called before anything else is done with it). */
  arrived(): void {
    this.arrivals++;
    this.lastArrival = this.now();
  }

  /** Resolves on a later turn of the event loop, after the requests that asked before it, one per turn. */
  next(): Promise<void> {
    return new Promise((resolve) => {
      this.waiting.push(resolve);
      if (!this.scheduled) {
        this.scheduled = true;
        setImmediate(this.step);
      }
    });
  }

  private readonly step = (): void => {
    const now = this.now();
    const sinceArrival = now - this.lastArrival;
    if (sinceArrival >= this.opts.quietMs) this.armed = true;
    if (this.armed && this.arrivals > 1 && sinceArrival < this.opts.quietMs) {
      this.waitingSince ??= now;
      const left = this.waitingSince + this.opts.windowMs - now;
      if (left > 0) {
        // Until the arrivals pause (checked again then), or the window ends.
        this.after(this.step, Math.min(left, this.opts.quietMs - sinceArrival));
        return;
      }
      this.armed = false;
    }
    this.waitingSince = undefined;
    this.arrivals = 0;
    this.waiting.shift()?.();
    // Scheduled from inside the check phase: the next one runs on the next turn, after its poll for I/O.
    if (this.waiting.length > 0) setImmediate(this.step);
    else this.scheduled = false;
  };
}

/**
 * The server's: arrivals under 50 ms apart are one burst (a loaded machine can leave the server off
 * its core that long), whose intake gets at most 500 ms before preparation goes on.
 */
const turns = new Turns({ quietMs: 50, windowMs: 500 });

/** Resolves on a later turn of the event loop, after the requests that asked before it, one per turn. */
export function nextTurn(): Promise<void> {
  return turns.next();
}

/** Notes a request's arrival: while a burst arrives, preparation waits (above). */
export function requestArrived(): void {
  turns.arrived();
}
