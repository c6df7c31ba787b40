/**
 * Every model run of the process passes through one gate: one run at a time, first come first
 * served, and a turn of the event loop between two runs.
 *
 * Why one at a time: the guards account each run's workspace on its own (peak meter windows, the
 * reservations' headroom), and an earlier version that let a decoder run overlap the encoders' spread
 * memory over malloc arenas: bursts went 3-43 % over a budget their reservations fit. Why a turn
 * between runs: onnxruntime-node runs a session synchronously on the main thread (its `run` is a
 * setImmediate around the native call), so 32 queries in flight queued 32 runs into one check phase
 * of the loop and health probes, new requests and load-shedding 503s waited for all of them (30 s
 * for /healthz in a burst of 200). Through the gate at most one run sits between two polls for I/O.
 */

import { RunInterrupted } from './errors.js';

interface Waiter {
  resolve(): void;
}

const waiters: Waiter[] = [];
let busy = false;
let runs = 0;

/**
 * Runs `run` alone: after every run admitted before it has ended, on a later turn of the event loop.
 * An abort of `signal` while it waits takes it out of the line (RunInterrupted; `run` never starts):
 * an abandoned request's runs do not hold up the ones behind them.
 */
export async function gatedRun<T>(run: () => Promise<T>, signal?: AbortSignal): Promise<T> {
  if (signal?.aborted) throw new RunInterrupted(signal.reason);
  if (busy || waiters.length > 0) {
    await new Promise<void>((resolve, reject) => {
      const waiter: Waiter = {
        resolve: () => {
          signal?.removeEventListener('abort', leave);
          resolve();
        },
      };
      const leave = () => {
        const i = waiters.indexOf(waiter);
        if (i < 0) return; // already let through: it runs (and its run sees the signal)
        waiters.splice(i, 1);
        reject(new RunInterrupted(signal!.reason));
      };
      signal?.addEventListener('abort', leave, { once: true });
      waiters.push(waiter);
    });
  } else {
    busy = true;
  }
  try {
    runs++;
    return await run();
  } finally {
    const next = waiters.shift();
    // The gate passes to the next run on the next turn: I/O callbacks (a probe, a request to shed) run first.
    if (next) setImmediate(next.resolve);
    else busy = false;
  }
}

/** Runs waiting for the gate, and runs through it since start (for /debug and tests). */
export function gateStats(): { waiting: number; busy: boolean; runs: number } {
  return { waiting: waiters.length, busy, runs };
}
