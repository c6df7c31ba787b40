/**
 * Peak memory meters. On the host, two: ONNX Runtime's accounted bytes (the counting allocator of
 * ort-allocator.ts: what the models asked for, exactly, run after run) and the process's peak resident
 * memory, as the kernel tracks it (VmHWM in /proc/self/status), reset on demand by writing 5 to
 * /proc/self/clear_refs; it catches a peak that lasts microseconds inside a native model run, which
 * no sampling from JavaScript would see. Linux only; elsewhere `available` is false and says why. On
 * the GPU: NVML's used bytes, sampled every millisecond while a window is open (NVML keeps no peak of
 * its own, so a shorter peak can be missed).
 */
import { readFileSync, writeFileSync } from 'node:fs';
import v8 from 'node:v8';
import vm from 'node:vm';
import { trimMalloc } from '../runtime/malloc.js';
import { accountingUnavailable, countingAllocator, type AllocatorCounters } from '../backends/ort/ort-allocator.js';
import { GpuSampler, usedBytes, type GpuMemoryReader } from './nvml.js';

export interface PeakMeter {
  readonly available: boolean;
  readonly reason?: string;
  /** Resident bytes now. */
  resident(): number;
  /** Starts a new peak window: the peak becomes the resident size now. */
  reset(): void;
  /** Highest resident bytes since the last reset. */
  peak(): number;
  /** Waits until memory freed by earlier work is actually given back (where that happens late). */
  settle?(): Promise<void>;
}

/**
 * Fields of a process's /proc/<pid>/status that the kernel gives in kB (VmRSS, VmHWM, RssAnon...), in
 * bytes, from one read. Linux only: throws where the file or a field is missing.
 */
export function procStatusBytes<F extends string>(fields: readonly F[], pid: number | 'self' = 'self'): Record<F, number> {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const out = {} as Record<F, number>;
  for (const field of fields) {
    const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status);
    if (!m) throw new Error(`/proc/${pid}/status has no ${field}`);
    out[field] = Number(m[1]) * 1024;
  }
  return out;
}

/**
 * Resident memory counts buffers that are dead but not yet freed (V8 frees them turns after the
 * collection that found them), which a run would reuse unseen: both resident meters settle fully first.
 */
const settleResident = async (): Promise<void> => { await settledResident(); };

class ProcPeakMeter implements PeakMeter {
  readonly available = true;
  readonly settle = settleResident;
  resident(): number {
    return procStatusBytes(['VmRSS']).VmRSS;
  }
  reset(): void {
    writeFileSync('/proc/self/clear_refs', '5');
  }
  peak(): number {
    return procStatusBytes(['VmHWM']).VmHWM;
  }
}

class NoPeakMeter implements PeakMeter {
  readonly available = false;
  readonly settle = settleResident;
  constructor(readonly reason: string) {}
  resident(): number {
    return process.memoryUsage.rss();
  }
  reset(): void {}
  peak(): number {
    return process.memoryUsage.rss();
  }
}

/** ONNX Runtime's live bytes through the counting allocator; its peak is kept by the allocator itself. */
class AccountedPeakMeter implements PeakMeter {
  readonly available = true;
  constructor(private readonly counters: AllocatorCounters) {}
  resident(): number {
    return this.counters.live();
  }
  reset(): void {
    this.counters.resetPeak();
  }
  peak(): number {
    return this.counters.peak();
  }
}

/**
 * The host meter of ONNX Runtime's accounted bytes; `available` false, with the reason, where the
 * counting allocator is not installed (ort-allocator.ts).
 */
export function accountedPeakMeter(): PeakMeter {
  const c = countingAllocator();
  return c ? new AccountedPeakMeter(c) : new NoPeakMeter(`ONNX Runtime's bytes are not accounted: ${accountingUnavailable()}`);
}

/** Device memory used on every GPU together, as NVML reports it (the whole device, all processes). */
class NvmlPeakMeter implements PeakMeter {
  readonly available: boolean;
  readonly reason?: string;
  private readonly sampler: GpuSampler;

  constructor(reader: GpuMemoryReader) {
    // Sampled only inside a window: reset() starts the timer, peak() stops it.
    this.sampler = new GpuSampler(reader, 1);
    this.sampler.stop();
    const r = this.sampler.latest();
    this.available = r.source === 'nvml';
    if (r.source === 'none') this.reason = r.reason;
  }

  private used(pick: (index: number, used: number) => number): number {
    const r = this.sampler.latest();
    return r.source === 'nvml' ? r.gpus.reduce((s, g) => s + pick(g.index, g.usedBytes), 0) : 0;
  }

  resident(): number {
    this.sampler.sample();
    return usedBytes(this.sampler.latest());
  }

  reset(): void {
    this.sampler.stop();
    this.sampler.sample();
    this.sampler.resetPeak();
    this.sampler.start(1);
  }

  peak(): number {
    this.sampler.sample();
    this.sampler.stop();
    return this.used((i, u) => this.sampler.peakUsedBytes(i) ?? u);
  }

  /**
   * The device frees a finished run's buffers some time after the run (once the GPU is done with
   * them): wait until used memory has stopped falling, so that the next window does not start on
   * memory about to be freed and reused.
   */
  async settle(): Promise<void> {
    let last = this.resident();
    for (let i = 0; i < 50; i++) {
      await new Promise((r) => setTimeout(r, 20));
      const now = this.resident();
      if (now >= last && i >= 4) return; // at least 100 ms, then until it stops falling
      last = Math.min(last, now);
    }
  }
}

/** The GPU's meter (NVML through `reader`); `available` false, with the reason, without a GPU. */
export function gpuPeakMeter(reader: GpuMemoryReader): PeakMeter {
  return new NvmlPeakMeter(reader);
}

let meter: PeakMeter | undefined;

/** The host meter (the kernel's VmHWM), made once per process. */
export function hostPeakMeter(): PeakMeter {
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

/** The host meter that `cfg` asks for: accounted bytes where the counting allocator is installed, else resident memory. */
export function hostMeter(cfg: { hostMeter: 'accounted' | 'resident' }): PeakMeter {
  const accounted = cfg.hostMeter === 'accounted' ? accountedPeakMeter() : undefined;
  return accounted?.available ? accounted : hostPeakMeter();
}

let collect: (() => void) | undefined;

/** A full garbage collection: JS buffers that are already garbage must not count as a run's memory. */
export function collectGarbage(): void {
  if (!collect) {
    v8.setFlagsFromString('--expose-gc');
    collect = vm.runInNewContext('gc') as () => void;
  }
  collect();
}

/**
 * Resident bytes once garbage is collected and glibc's free heap given back, waiting until they stop
 * falling: V8 frees an ArrayBuffer's memory after the collection that found it dead, on a later turn
 * (measured after a GGUF conversion: 435 MiB of buffers dead, resident 562 MiB right after a collection
 * and a trim, 135 MiB two turns later).
 */
export async function settledResident(): Promise<number> {
  let last = Number.POSITIVE_INFINITY;
  for (let i = 0; i < 20; i++) {
    collectGarbage();
    await new Promise((r) => setTimeout(r, 10));
    trimMalloc();
    const now = process.memoryUsage.rss();
    if (now > last - (1 << 20)) return Math.min(now, last);
    last = now;
  }
  return last;
}

/**
 * Runs `work` and returns its peak bytes on `m` above its live bytes when it started: the meter settles
 * first (a resident meter waits until freed buffers are given back, settledResident), then garbage is
 * collected and free heap returned to the OS, so memory kept for reuse does not hide the peak.
 * Meant for one run at a time (start-up profiling, benchmarks): concurrent work would share the peak.
 */
export async function measurePeak<T>(m: PeakMeter, work: () => Promise<T>): Promise<{ value: T; bytes: number }> {
  await m.settle?.();
  collectGarbage();
  trimMalloc();
  m.reset();
  const before = m.resident();
  const value = await work();
  return { value, bytes: Math.max(0, m.peak() - before) };
}
