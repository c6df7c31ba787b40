/**
 * The process's peak resident memory, as the kernel tracks it (VmHWM in /proc/self/status), reset on
 * demand by writing 5 to /proc/self/clear_refs. It catches a peak that lasts microseconds inside a
 * native model run, which no sampling from JavaScript would see. Linux only; elsewhere `available` is
 * false and says why.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import v8 from 'node:v8';
import vm from 'node:vm';
import { trimMalloc } from '../runtime/malloc.js';

export interface PeakMeter {
  readonly available: boolean;
  readonly reason?: string;
  /** Resident bytes now. */
  resident(): number;
  /** Starts a new peak window: the peak becomes the resident size now. */
  reset(): void;
  /** Highest resident bytes since the last reset. */
  peak(): number;
}

function statusField(status: string, field: string): number {
  const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status);
  if (!m) throw new Error(`/proc/self/status has no ${field}`);
  return Number(m[1]) * 1024;
}

class ProcPeakMeter implements PeakMeter {
  readonly available = true;
  resident(): number {
    return statusField(readFileSync('/proc/self/status', 'utf8'), 'VmRSS');
  }
  reset(): void {
    writeFileSync('/proc/self/clear_refs', '5');
  }
  peak(): number {
    return statusField(readFileSync('/proc/self/status', 'utf8'), 'VmHWM');
  }
}

class NoPeakMeter implements PeakMeter {
  readonly available = false;
  constructor(readonly reason: string) {}
  resident(): number {
    return process.memoryUsage.rss();
  }
  reset(): void {}
  peak(): number {
    return process.memoryUsage.rss();
  }
}

let meter: PeakMeter | undefined;

export function peakMeter(): PeakMeter {
  if (meter) return meter;
  try {
    const m = new ProcPeakMeter();
    m.reset();
    m.peak();
    return (meter = m);
  } catch (e) {
    return (meter = new NoPeakMeter(`no resettable peak (/proc/self/clear_refs): ${e instanceof Error ? e.message : String(e)}`));
  }
}

let collect: (() => void) | undefined;

/** A full garbage collection: JS buffers that are already garbage must not count as a run's memory. */
function collectGarbage(): void {
  if (!collect) {
    v8.setFlagsFromString('--expose-gc');
    collect = vm.runInNewContext('gc') as () => void;
  }
  collect();
}

/**
 * Runs `work` and returns its peak resident bytes above the live memory when it started: garbage is
 * collected and free heap returned to the OS first, so memory kept for reuse does not hide the peak.
 * Meant for one run at a time (start-up profiling, benchmarks): concurrent work would share the peak.
 */
export async function measurePeak<T>(m: PeakMeter, work: () => Promise<T>): Promise<{ value: T; bytes: number }> {
  collectGarbage();
  trimMalloc();
  m.reset();
  const before = m.resident();
  const value = await work();
  return { value, bytes: Math.max(0, m.peak() - before) };
}
