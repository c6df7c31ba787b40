/**
 * Exact top-k by inner product over rows of floats: ragguard's AVX512 loop in the ops library
 * (src/backends/ort/dense-scan.c, through koffi), or the same in JavaScript where the library is not
 * built. The faiss store's per-collection searches run on it (faiss-collections.ts): the faiss linked
 * here is a generic build, 4-7 ms a query over 10,000 x 384 floats against about 0.5 ms.
 */
import { existsSync } from 'node:fs';
import koffi from 'koffi';
import { RAGGUARD_OPS_LIBRARY } from '../backends/ort/ort-c-api.js';

type Native = {
  topk: (rows: Float32Array, n: number, d: number, q: Float32Array, allow: Uint8Array | null, k: number, slots: Int32Array, scores: Float32Array) => number;
  avx512: () => number;
  setPortable: (on: number) => void;
};
let native: Native | null | undefined;

function bound(): Native | null {
  if (native === undefined) {
    native = null;
    if (existsSync(RAGGUARD_OPS_LIBRARY)) {
      const lib = koffi.load(RAGGUARD_OPS_LIBRARY);
      native = {
        topk: lib.func('int32_t ragguard_scan_ip_topk(const float* rows, int64_t n, int64_t d, const float* q, const uint8_t* allow, int32_t k, _Out_ int32_t* slots, _Out_ float* scores)') as Native['topk'],
        avx512: lib.func('int ragguard_scan_avx512()') as Native['avx512'],
        setPortable: lib.func('void ragguard_scan_set_portable(int on)') as Native['setPortable'],
      };
    }
  }
  return native;
}

/** Which loop runs the scans here: 'avx512', 'c' (the library's portable loop) or 'js' (no library). */
export function denseScanPath(): 'avx512' | 'c' | 'js' {
  const n = bound();
  return !n ? 'js' : n.avx512() === 1 ? 'avx512' : 'c';
}

/** The library's portable loop whatever the CPU (true), or its best (false): tests of the path a CPU without AVX512 runs. */
export function setDenseScanPortable(on: boolean): void {
  bound()?.setPortable(on ? 1 : 0);
}

/**
 * The k best of the first n rows of `rows` (d floats each) by inner product with q, among the rows `allow`
 * lets through (bit r & 7 of byte r >> 3; none: all), best first; ties: the lower row first.
 */
export function scanTopK(rows: Float32Array, n: number, d: number, q: Float32Array, k: number, allow?: Uint8Array): { slots: number[]; scores: number[] } {
  const want = Math.max(0, Math.min(k, n));
  if (want === 0) return { slots: [], scores: [] };
  if (rows.length < n * d || q.length !== d) throw new Error(`scanTopK: ${rows.length} floats for ${n} rows of ${d}, a query of ${q.length}`);
  if (allow && allow.length < Math.ceil(n / 8)) throw new Error(`scanTopK: a bitmap of ${allow.length} bytes for ${n} rows`);
  const lib = bound();
  if (lib) {
    const slots = new Int32Array(want);
    const scores = new Float32Array(want);
    const found = lib.topk(rows, n, d, q, allow ?? null, want, slots, scores);
    return { slots: Array.from(slots.subarray(0, found)), scores: Array.from(scores.subarray(0, found)) };
  }
  return scanTopKScript(rows, n, d, q, want, allow);
}

/** scanTopK in JavaScript: where the ops library is not built (and the tests' reference). */
export function scanTopKScript(rows: Float32Array, n: number, d: number, q: Float32Array, k: number, allow?: Uint8Array): { slots: number[]; scores: number[] } {
  const want = Math.max(0, Math.min(k, n));
  const hits: { slot: number; score: number }[] = [];
  for (let r = 0; r < n; r++) {
    if (allow && (allow[r >> 3]! & (1 << (r & 7))) === 0) continue;
    let s = 0;
    for (let j = 0, o = r * d; j < d; j++) s += rows[o + j]! * q[j]!;
    hits.push({ slot: r, score: Math.fround(s) });
  }
  hits.sort((a, b) => b.score - a.score || a.slot - b.slot);
  const top = hits.slice(0, want);
  return { slots: top.map((h) => h.slot), scores: top.map((h) => h.score) };
}
