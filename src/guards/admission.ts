/**
 * Admission: a bounded number of queries run at once; others wait in a bounded FIFO queue for a
 * bounded time. Past either bound the reply is 503 with Retry-After, before any work is done, so an
 * overloaded server sheds load instead of piling up memory.
 */
import PQueue from 'p-queue';
import { BusyError } from '../runtime/errors.js';
import { nextTurn } from '../runtime/turns.js';

class QueueTimeout extends Error {}

/** A place taken by a query on arrival (Admission.ticket): handed to run(), or given back if it ends before. */
export interface AdmissionTicket {
  release(): void;
}

export interface AdmissionOptions {
  concurrency: number;
  maxQueue: number;
  timeoutMs: number;
}

export class Admission {
  private readonly queue: PQueue;

  constructor(private readonly opts: AdmissionOptions) {
    this.queue = new PQueue({ concurrency: opts.concurrency });
  }

  get running(): number {
    return this.queue.pending;
  }

  get waiting(): number {
    return this.queue.size;
  }

  /**
   * Runs `work` when a slot is free. An abort of `signal` while waiting (the client went away) takes
   * the request out of the queue at once and rejects with the signal's reason; once running, the
   * work itself is given the signal (it stops at its next step), its slot held until it returns.
   */
  /** Whether a query arriving now would be shed (every slot running, the queue at its limit). */
  get full(): boolean {
    return this.queue.pending >= this.opts.concurrency && this.queue.size >= this.opts.maxQueue;
  }

  /** Queries let in by ticket() that have not reached run() yet (their bodies are read and checked). */
  private incoming = 0;

  /**
   * A place for a query that just arrived, taken before its body is read: null when running, waiting
   * and arriving queries already fill every slot and the queue (shed it now: a burst's later queries
   * get their 503 without waiting for the earlier ones' parsing and checks). run() takes the ticket
   * over; release() gives it back where the query ends before (an invalid body, a 413).
   */
  ticket(): AdmissionTicket | null {
    if (this.queue.pending + this.queue.size + this.incoming >= this.opts.concurrency + this.opts.maxQueue) return null;
    this.incoming++;
    let held = true;
    return {
      release: () => {
        if (held) this.incoming--;
        held = false;
      },
    };
  }

  /** The refusal a query gets when the server is full. */
  queueFull(): BusyError {
    return new BusyError('queue_full', `server busy: ${this.queue.size} queries waiting (limit ${this.opts.maxQueue})`, this.retryAfter);
  }

  /** Seconds after which a refused query may find a place: the queue's longest wait. */
  private get retryAfter(): number {
    return Math.max(1, Math.ceil(this.opts.timeoutMs / 1000));
  }

  async run<T>(work: () => Promise<T>, signal?: AbortSignal, ticket?: AdmissionTicket): Promise<T> {
    ticket?.release(); // counted as running or waiting from here
    signal?.throwIfAborted();
    const retryAfter = this.retryAfter;
    if (this.full) throw this.queueFull();
    // The wait deadline: a timer that aborts the queued task. p-queue would also reject a *running*
    // task on abort while its work went on (and its slot were reused), so the timer is cleared the
    // moment the task starts: once admitted, a query runs to completion.
    const waiting = new AbortController();
    const timer = setTimeout(() => waiting.abort(new QueueTimeout()), this.opts.timeoutMs);
    const gone = () => waiting.abort(signal!.reason);
    signal?.addEventListener('abort', gone, { once: true });
    try {
      return await this.queue.add(() => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', gone); // from here the work itself stops on the signal
        return work();
      }, { signal: waiting.signal });
    } catch (e) {
      if (e instanceof QueueTimeout) {
        // Queries that arrived together time out together: their timers expire in one pass of the
        // event loop's timers, and 64 replies written back to back held it for 50 ms (a probe waited
        // behind them). Each on a turn of its own (turns.ts), with the loop's I/O served between.
        await nextTurn();
        throw new BusyError('queue_timeout', `waited ${this.opts.timeoutMs} ms in the queue without a free slot`, retryAfter);
      }
      throw e;
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener('abort', gone);
    }
  }

  /** Resolves when nothing runs or waits. */
  async drain(): Promise<void> {
    await this.queue.onIdle();
  }
}
