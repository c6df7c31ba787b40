/**
 * The event loop first: every other thread of the process at a lower scheduling priority (a higher
 * nice value), so that on a machine with fewer cores than busy threads the main thread, which answers
 * probes and load-shedding 503s, gets a core as soon as it has work.
 *
 * Why: model runs happen off the main thread (koffi's async calls on libuv's pool, each with ONNX
 * Runtime's intra-op pool beside it: run-gate.ts, ort-direct.ts), but on 2 cores two busy model
 * threads and the event loop share the cores equally, so each turn of the loop took two to three
 * times its CPU time in wall time, and a burst's 503s, which Node reads one connection per turn
 * (libuv >= 1.45 accepts one connection per loop iteration), waited that much longer. With the other
 * threads at nice 10, the scheduler gives the loop ~90 % of a contended core (CFS weights 1024
 * against 110) and wakes it ahead of them; the model threads get all the rest, so a model run is
 * slower only by the main thread's own work.
 *
 * On Linux, nice is a property of each thread: setpriority(PRIO_PROCESS, tid) (os.setPriority with a
 * thread id) changes that thread alone, and threads inherit their creator's value. Lowering it needs no
 * privilege; raising it back would, which is why the main thread is never touched. Elsewhere the
 * call is a whole-process one, so nothing is done there.
 *
 * Which threads: every one but the main thread, as listed in /proc/self/task when this is called:
 * libuv's pool (where the runs are called), ONNX Runtime's intra-op pools (made with each session),
 * V8's platform workers (concurrent GC: the main thread finishes what they have not, so nothing waits
 * on them). Threads made later by the main thread get its priority (0); call this after the models
 * are loaded, when their pools exist.
 */
import { readdirSync } from 'node:fs';
import os from 'node:os';

export interface Lowered {
  /** Threads whose nice value is now `nice`. */
  threads: number;
  /** Threads that ended before they were reached, or refused. */
  failed: number;
  /** Why nothing was done (not Linux, nice 0), else undefined. */
  skipped?: string;
}

/** Sets every thread of this process but the main thread to `nice` (0-19); Linux only. */
export function lowerOtherThreads(nice: number): Lowered {
  if (!Number.isInteger(nice) || nice < 0 || nice > 19) throw new RangeError(`nice must be an integer in [0, 19], got ${nice}`);
  if (nice === 0) return { threads: 0, failed: 0, skipped: 'nice 0: threads left as they are' };
  if (process.platform !== 'linux') return { threads: 0, failed: 0, skipped: `${process.platform}: per-thread priorities are Linux's` };
  let threads = 0;
  let failed = 0;
  for (const name of readdirSync('/proc/self/task')) {
    const tid = Number(name);
    if (tid === process.pid) continue;
    try {
      // Never raises a thread's nice value back down (that would need a privilege): only lowers it.
      if (os.getPriority(tid) < nice) os.setPriority(tid, nice);
      threads++;
    } catch {
      failed++; // the thread ended between the listing and the call
    }
  }
  return { threads, failed };
}

/** The nice value of each thread of this process, by thread id (Linux; for tests and /debug). */
export function threadNiceValues(): Map<number, number> {
  const values = new Map<number, number>();
  if (process.platform !== 'linux') return values;
  for (const name of readdirSync('/proc/self/task')) {
    try {
      values.set(Number(name), os.getPriority(Number(name)));
    } catch {
      // ended meanwhile
    }
  }
  return values;
}
