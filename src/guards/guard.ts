/**
 * The memory guard in front of generation: decides each request from its predicted bytes (policy.ts),
 * then holds its workspace reservation while it runs. Reservations wait in FIFO order for room, up to
 * a deadline; a request that can never fit was already turned away by the decision (413), so a wait
 * ends either with room or with 503.
 */
import { BusyError } from '../runtime/errors.js';
import type { MemoryModel, RequestShape } from './memory-model.js';
import { decide, type Decision, type Floors } from './policy.js';
import { type ReshapeStep } from '../config/config.js';

export interface GuardCapacity {
  /** Bytes the budget gives run workspace now (budget - weights - KV pool - index). */
  workspaceTotal: number;
  kvFreeBlocks: number;
  kvTotalBlocks: number;
}

interface Waiter {
  bytes: number;
  resolve(): void;
  reject(e: Error): void;
  timer: NodeJS.Timeout;
}

export class MemoryGuard {
  private reservedBytes = 0;
  private readonly waiters: Waiter[] = [];
  /** Told of every decision (metrics: admissions by decision, reshapes); none by default. */
  onDecision: ((d: Decision) => void) | undefined;

  constructor(
    readonly model: MemoryModel,
    private readonly capacity: () => GuardCapacity,
    readonly order: readonly ReshapeStep[],
    readonly floors: Floors,
  ) {}

  get reserved(): number {
    return this.reservedBytes;
  }

  get waiting(): number {
    return this.waiters.length;
  }

  decide(shape: RequestShape): Decision {
    const c = this.capacity();
    const d = decide(this.model, shape, {
      workspaceTotal: c.workspaceTotal,
      workspaceFree: c.workspaceTotal - this.reservedBytes,
      kvFreeBlocks: c.kvFreeBlocks,
      kvTotalBlocks: c.kvTotalBlocks,
    }, this.order, this.floors);
    this.onDecision?.(d);
    return d;
  }

  /**
   * Waits (FIFO) until `bytes` of workspace are free, reserves them, and returns their release. An
   * abort of `signal` while waiting leaves the line at once (rejecting with its reason).
   */
  async reserve(bytes: number, timeoutMs: number, signal?: AbortSignal): Promise<() => void> {
    signal?.throwIfAborted();
    await new Promise<void>((resolve, reject) => {
      const leave = () => {
        const i = this.waiters.indexOf(waiter);
        if (i < 0) return; // already holds its bytes: the caller releases them
        this.waiters.splice(i, 1);
        clearTimeout(timer);
        reject(signal!.reason as Error);
        this.pump();
      };
      signal?.addEventListener('abort', leave, { once: true });
      const timer = setTimeout(() => {
        const i = this.waiters.indexOf(waiter);
        if (i >= 0) this.waiters.splice(i, 1);
        reject(new BusyError('memory_busy', `waited ${timeoutMs} ms for ${bytes} bytes of workspace`, Math.max(1, Math.ceil(timeoutMs / 1000)),
          { predicted_bytes: bytes, budget_bytes: this.capacity().workspaceTotal }));
        this.pump();
      }, timeoutMs);
      const waiter: Waiter = {
        bytes, timer, reject,
        resolve: () => {
          signal?.removeEventListener('abort', leave);
          resolve();
        },
      };
      this.waiters.push(waiter);
      this.pump();
    });
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.reservedBytes -= bytes;
      this.pump();
    };
  }

  private pump(): void {
    const total = this.capacity().workspaceTotal;
    while (this.waiters.length > 0) {
      const head = this.waiters[0]!;
      // The head waits for room; nobody overtakes it (no starvation of large requests).
      if (this.reservedBytes > 0 && this.reservedBytes + head.bytes > total) return;
      this.waiters.shift();
      clearTimeout(head.timer);
      this.reservedBytes += head.bytes;
      head.resolve();
    }
  }
}
