/**
 * ONNX Runtime's accounted bytes on the host: a counting allocator (counting-allocator.c, built by
 * scripts/setup.sh) registered with ONNX Runtime's environment, through which every CPU session
 * allocates (session.use_env_allocators=1: session.ts and ort-direct.ts ask for it once it is
 * installed). It keeps the live total of what the models asked for and its peak since a reset: a
 * model run's memory as the runtime demanded it, without the allocator's and the kernel's scatter
 * (resident size moves with glibc's reuse, arenas and page faults; peak-meter.ts's resident meter).
 *
 * It must be installed before the first session is made: a session takes its allocators when it is
 * created. Where the library is not built, or the C API cannot be bound, nothing is installed and
 * `accountingUnavailable()` says why; sessions then allocate through ONNX Runtime's own CPU allocator,
 * which allocates the same way (64-byte aligned malloc) without counting.
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import koffi from 'koffi';
import { registerCpuAllocator, viewRegions } from './ort-direct.js';

/** Where scripts/setup.sh builds the library. */
export const COUNTING_ALLOCATOR_LIBRARY = path.resolve(import.meta.dirname, '..', '..', '..', 'build', 'native', 'libragguard-alloc.so');

export interface AllocatorCounters {
  /** Bytes allocated through the allocator and not yet freed. */
  live(): number;
  /** Highest live total since the last resetPeak() (or since start). */
  peak(): number;
  /** Starts a new peak window at the live total now. */
  resetPeak(): void;
  /** Allocations since start. */
  allocations(): number;
  /**
   * The part of live() in malloc's blocks (those under 2 MiB, and larger ones where the regions are
   * full): glibc's in-use figure holds them too. The rest of live() lies in the reserved regions.
   */
  heapLive(): number;
  /** Bytes of freed large blocks kept resident for reuse (the warm cache), and its limit. */
  warm(): number;
  /** The part of warm() whose pages are resident now (a block a run wrote only in part holds less than its length). */
  warmResident(): number;
  warmLimit(): number;
  /** Sets the warm cache's limit (0: every freed large block's pages go back at once). */
  setWarmLimit(bytes: number): void;
}

/**
 * Reserved address space for large blocks: REGIONS regions of REGION_BYTES (4 GiB, the largest one
 * ArrayBuffer over native memory that koffi makes here). Only address space: memory is committed as
 * blocks are written and returned when they are freed. Blocks beyond it fall back to malloc.
 */
const REGIONS = 4;
const REGION_BYTES = 2 ** 32;

let counters: AllocatorCounters | undefined;
let reason = 'not installed';

/**
 * Installs the counting allocator (once per process; later calls return the same counters), or
 * returns undefined where it cannot be, with accountingUnavailable() saying why.
 */
export function installCountingAllocator(library = COUNTING_ALLOCATOR_LIBRARY): AllocatorCounters | undefined {
  if (counters) return counters;
  try {
    if (!existsSync(library)) throw new Error(`${library} is not built (npm run setup builds it)`);
    const lib = koffi.load(library);
    const make = lib.func('void *ragguard_counting_allocator(void *info)') as (info: unknown) => unknown;
    const int64 = (name: string) => lib.func(`int64_t ${name}(void)`) as () => number | bigint;
    const [live, peak, allocations, heapLive] = ['ragguard_live_bytes', 'ragguard_peak_bytes', 'ragguard_allocations', 'ragguard_heap_live_bytes'].map(int64) as [
      () => number | bigint, () => number | bigint, () => number | bigint, () => number | bigint];
    const reset = lib.func('void ragguard_reset_peak(void)') as () => void;
    // Address space for large blocks (counting-allocator.c says why), before any session allocates.
    const reserve = lib.func('int ragguard_reserve_regions(int count, int64_t size)') as (count: number, size: number) => number;
    const base = lib.func('void *ragguard_region_base(int i)') as (i: number) => unknown;
    const size = lib.func('int64_t ragguard_region_size(int i)') as (i: number) => number | bigint;
    const [warm, warmResident, warmLimit] = ['ragguard_warm_bytes', 'ragguard_warm_resident_bytes', 'ragguard_warm_limit'].map(int64) as [
      () => number | bigint, () => number | bigint, () => number | bigint];
    const setWarm = lib.func('void ragguard_set_warm_limit(int64_t bytes)') as (bytes: number) => void;
    const made = reserve(REGIONS, REGION_BYTES);
    viewRegions(Array.from({ length: made }, (_, i) => ({ base: base(i), size: Number(size(i)) })));
    registerCpuAllocator(make);
    counters = {
      live: () => Number(live()), peak: () => Number(peak()), resetPeak: () => reset(), allocations: () => Number(allocations()), heapLive: () => Number(heapLive()),
      warm: () => Number(warm()), warmResident: () => Number(warmResident()), warmLimit: () => Number(warmLimit()), setWarmLimit: (bytes) => setWarm(bytes),
    };
    reason = '';
    return counters;
  } catch (e) {
    reason = (e as Error).message;
    return undefined;
  }
}

/**
 * ONNX Runtime's host allocations as the server makes them: through the counting allocator with the
 * configured warm cache when the host meter is 'accounted', untouched otherwise. Before any session.
 */
export function installHostAccounting(cfg: { hostMeter: string; allocatorWarmBytes: number }): AllocatorCounters | undefined {
  if (cfg.hostMeter !== 'accounted') return undefined;
  const c = installCountingAllocator();
  c?.setWarmLimit(cfg.allocatorWarmBytes);
  return c;
}

/** The installed counters, if any. */
export function countingAllocator(): AllocatorCounters | undefined {
  return counters;
}

/** Why ONNX Runtime's bytes are not accounted ('' when they are). */
export function accountingUnavailable(): string {
  return reason;
}
