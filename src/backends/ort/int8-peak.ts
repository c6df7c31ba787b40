/**
 * The machine's int8 multiply-add peak, measured by the ops library (int8-peak.c, through koffi): every
 * core running AVX512-VNNI's VPDPBUSD on independent accumulators at once. The physical limit of a
 * quantized decoder's prefill on this CPU (benchmarks put prompt tokens/s beside it); a figure from the
 * nominal clock and an assumed instruction rate can be off by half (2026-12-06 on a 2-core EPYC: 461-469
 * measured against 333 nominal: the cores ran above /proc/cpuinfo's 2.6 GHz).
 */
import { existsSync } from 'node:fs';
import os from 'node:os';
import koffi from 'koffi';
import { RAGGUARD_OPS_LIBRARY } from './ort-c-api.js';

export interface Int8Peak {
  /** Int8 multiply-adds a second, every thread together (the best of the repeats). */
  multiplyAddsPerS: number;
  /** The same with one thread alone. */
  perCoreMultiplyAddsPerS: number;
  threads: number;
  how: string;
}

type Measure = (threads: number, iters: number) => number;
let measure: Measure | null | undefined;

function bound(): Measure | null {
  if (measure === undefined) {
    measure = existsSync(RAGGUARD_OPS_LIBRARY)
      ? (koffi.load(RAGGUARD_OPS_LIBRARY).func('double ragguard_int8_peak(int32_t threads, int64_t iters)') as Measure)
      : null;
  }
  return measure;
}

/**
 * Measures the peak on `threads` threads (default: every core Node sees), best of `repeats` runs of about
 * 0.1 s each; undefined, with nothing run, where the ops library is not built or the CPU has no
 * AVX512-VNNI. Blocks the caller for its runs: meant for benchmarks, on a quiet machine.
 */
export function measureInt8Peak(threads = os.availableParallelism(), repeats = 3): Int8Peak | undefined {
  const run = bound();
  if (!run) return undefined;
  const ITERS = 20_000_000; // x 16 instructions x 64 multiply-adds: about 0.1 s a run at one instruction a cycle
  const best = (t: number) => Math.max(...Array.from({ length: repeats }, () => run(t, ITERS)));
  const all = best(threads);
  if (!(all > 0)) return undefined;
  return {
    multiplyAddsPerS: all, perCoreMultiplyAddsPerS: best(1), threads,
    how: `AVX512-VNNI VPDPBUSD on 16 independent accumulators, ${threads} threads at once, best of ${repeats} (src/backends/ort/int8-peak.c)`,
  };
}
