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

/** glibc's allocator as mallinfo2 and malloc_info report it (every malloc in the process: ours, faiss's, V8's own C++ side, ONNX Runtime's outside the counting allocator). */
export interface MallocStats {
  /** Bytes of the heaps grown by brk/sbrk and of the arenas of other threads. */
  arenaBytes: number;
  /** Bytes in chunks mapped on their own (at or above the mmap threshold). */
  mmappedBytes: number;
  /** Bytes handed out and not yet freed (arenas and mapped chunks). */
  inUseBytes: number;
  /** Bytes free inside the arenas (kept for reuse; malloc_trim hands what it can back). */
  freeBytes: number;
  /** Arenas (the main one plus one per thread that contended, up to arena_max). */
  arenas: number;
}

let mallinfo: (() => MallocStats) | null | undefined;

/** The allocator's figures now; null where libc is not glibc (>= 2.33 for mallinfo2). */
export function mallocStats(): MallocStats | null {
  if (mallinfo === undefined) {
    try {
      const libc = koffi.load('libc.so.6');
      const Info = koffi.struct('ragguard_mallinfo2', {
        arena: 'size_t', ordblks: 'size_t', smblks: 'size_t', hblks: 'size_t', hblkhd: 'size_t',
        usmblks: 'size_t', fsmblks: 'size_t', uordblks: 'size_t', fordblks: 'size_t', keepcost: 'size_t',
      });
      const info = libc.func('ragguard_mallinfo2 mallinfo2()') as () => Record<string, number | bigint>;
      // malloc_info writes XML to a FILE*: into a memory stream, read back and freed.
      // The stream writes its buffer's address and size at fclose, so they live in memory of our own.
      const openMemstream = libc.func('void *open_memstream(void *buf, void *size)') as (b: unknown, s: unknown) => unknown;
      const mallocInfo = libc.func('int malloc_info(int options, void *fp)') as (o: number, fp: unknown) => number;
      const fclose = libc.func('int fclose(void *fp)') as (fp: unknown) => number;
      const free = libc.func('void free(void *p)') as (p: unknown) => void;
      const arenas = (): number => {
        const bufp = koffi.alloc('void *', 1);
        const sizep = koffi.alloc('size_t', 1);
        try {
          const fp = openMemstream(bufp, sizep);
          if (!fp) return 0;
          mallocInfo(0, fp);
          fclose(fp); // writes the buffer's address and size
          const buf = koffi.decode(bufp, 'void *') as unknown;
          const xml = koffi.decode(buf, 'char', Number(koffi.decode(sizep, 'size_t'))) as string;
          free(buf);
          return (xml.match(/<heap nr=/g) ?? []).length;
        } finally {
          koffi.free(bufp);
          koffi.free(sizep);
        }
      };
      mallinfo = () => {
        const m = info();
        const n = (k: string) => Number(m[k]);
        return { arenaBytes: n('arena'), mmappedBytes: n('hblkhd'), inUseBytes: n('uordblks') + n('hblkhd'), freeBytes: n('fordblks'), arenas: arenas() };
      };
    } catch {
      mallinfo = null;
    }
  }
  return mallinfo ? mallinfo() : null;
}
