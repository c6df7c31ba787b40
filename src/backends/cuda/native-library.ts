/**
 * What the native CUDA libraries' koffi bindings share (the decoder's, binding.ts, and the encoder's,
 * encoder-binding.ts): loading once, lazily, with the reason it failed kept instead of thrown (so that the
 * CPU paths stay as they are where no library is built or no GPU is visible), and the calls' checks.
 */
import { existsSync } from 'node:fs';
import type { LibraryHandle } from 'koffi';

type NativeFunction = ReturnType<LibraryHandle['func']>;

/** A library bound at its first use; null, with `why()`, where it is not built, cannot load or sees no GPU. */
export class LazyLibrary<T extends { deviceCount(): number }> {
  private loaded: T | null | undefined;
  private reason = '';

  constructor(private readonly bind: (file: string) => T) {}

  get(file: string): T | null {
    if (this.loaded !== undefined) return this.loaded;
    if (!existsSync(file)) {
      this.reason = `${file} is not built: npm run setup builds it (scripts/build-cuda.sh) with nvcc where CUDA is present`;
      return (this.loaded = null);
    }
    try {
      const b = this.bind(file);
      if (b.deviceCount() < 1) {
        this.reason = 'no CUDA device is visible';
        return (this.loaded = null);
      }
      return (this.loaded = b);
    } catch (e) {
      this.reason = `cannot load ${file}: ${(e as Error).message}`;
      return (this.loaded = null);
    }
  }

  why(): string {
    return this.reason;
  }
}

/** A library's error checks: a negative return code throws, naming the call and the library's last error. */
export function nativeCalls(label: string, lastError: () => unknown) {
  return {
    check(rc: unknown, what: string): number {
      const n = Number(rc);
      if (n < 0) throw new Error(`${label}: ${what}: ${String(lastError())}`);
      return n;
    },
    /** `fn` on a worker thread (the event loop stays free); rejects on a negative return code. */
    async(fn: NativeFunction, args: unknown[], what: string): Promise<void> {
      return new Promise((resolve, reject) => {
        fn.async(...args, (err: unknown, rc: unknown) => {
          if (err) reject(err instanceof Error ? err : new Error(String(err)));
          else if (Number(rc) < 0) reject(new Error(`${label}: ${what}: ${String(lastError())}`));
          else resolve();
        });
      });
    },
  };
}

/** koffi hands 64-bit integers back as number or bigint: numbers. */
export function numbers<T extends object>(o: T): T {
  return Object.fromEntries(Object.entries(o).map(([k, v]) => [k, typeof v === 'bigint' ? Number(v) : v])) as T;
}
