/**
 * Hands glibc's free heap memory back to the OS (malloc_trim), so that a measurement of resident
 * memory starts from the live buffers only.
 *
 * glibc keeps freed blocks resident for reuse (its mmap threshold rises as large blocks are freed), so
 * after a large model run the process stays as big as that run's peak. That is the right trade while
 * serving (re-faulting pages on every run made prefill several times slower when measured), but it
 * hides the next run's peak from a measurement: malloc_trim(0) first, then measure.
 */
import koffi from 'koffi';

let trim: (() => boolean) | null | undefined;

/** Returns free heap pages to the OS; false where there is no glibc (then nothing happened). */
export function trimMalloc(): boolean {
  if (trim === undefined) {
    try {
      const fn = koffi.load('libc.so.6').func('int malloc_trim(size_t pad)') as (pad: number) => number;
      trim = () => (fn(0), true);
    } catch {
      trim = null; // not glibc (musl, macOS): nothing to trim with
    }
  }
  return trim ? trim() : false;
}

/** Whether the process started with scripts/tuned.sh's allocator settings (they only apply at start). */
export function allocatorTuned(env: Readonly<Record<string, string | undefined>> = process.env): boolean {
  return /(^|:)glibc\.malloc\.mmap_threshold=/.test(env['GLIBC_TUNABLES'] ?? '');
}
