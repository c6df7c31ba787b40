/**
 * The machine's int8 multiply-add peak, measured by the ops library (int8-peak.c, through koffi): every
 * core running AVX512-VNNI's VPDPBUSD on independent accumulators at once, and where the products run on
 * AMX (qmatmul.c's qm_amx: prefills of 16 rows or more) its TDPBSUD the same way. The physical limit of a
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
  /** AMX's (full-depth TDPBSUD), every thread together and one alone; null where the products do not run on AMX. */
  amx: { multiplyAddsPerS: number; perCoreMultiplyAddsPerS: number; how: string } | null;
}

type Measure = (threads: number, iters: number) => number;
let measure: { vnni: Measure; amx: Measure } | null | undefined;

function bound(): { vnni: Measure; amx: Measure } | null {
  if (measure === undefined) {
    const lib = existsSync(RAGGUARD_OPS_LIBRARY) ? koffi.load(RAGGUARD_OPS_LIBRARY) : null;
    measure = lib
      ? {
        vnni: lib.func('double ragguard_int8_peak(int32_t threads, int64_t iters)') as Measure,
        amx: lib.func('double ragguard_amx_int8_peak(int32_t threads, int64_t iters)') as Measure,
      }
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
  const AMX_ITERS = 2_000_000; // x 4 TDPBSUD x 16 x 16 x 64: about 0.1 s a run at one TDPBSUD in 16 cycles
  const best = (f: Measure, t: number, iters: number) => Math.max(...Array.from({ length: repeats }, () => f(t, iters)));
  const all = best(run.vnni, threads, ITERS);
  if (!(all > 0)) return undefined;
  const amx = best(run.amx, threads, AMX_ITERS);
  return {
    multiplyAddsPerS: all, perCoreMultiplyAddsPerS: best(run.vnni, 1, ITERS), threads,
    how: `AVX512-VNNI VPDPBUSD on 16 independent accumulators, ${threads} threads at once, best of ${repeats} (src/backends/ort/int8-peak.c)`,
    amx: amx > 0
      ? {
        multiplyAddsPerS: amx, perCoreMultiplyAddsPerS: best(run.amx, 1, AMX_ITERS),
        how: `AMX TDPBSUD (16 x 16 x 64) on 4 independent tiles, ${threads} threads at once, best of ${repeats} (src/backends/ort/int8-peak.c)`,
      }
      : null,
  };
}
