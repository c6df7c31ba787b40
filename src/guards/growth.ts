/**
 * Leak check: memory after each of the last N requests, and whether it keeps growing.
 *
 * The garbage collector makes the heap a sawtooth, so growth is the floor of the window's last
 * quarter minus the floor of its first quarter: a steady climb of the floors is a leak, a single peak
 * is not. Flagged once the window is full and the growth passes the threshold.
 */
import type { ProcessMemory } from './process-memory.js';

export interface GrowthReport {
  window: number;
  samples: number;
  rssGrowthBytes: number;
  heapGrowthBytes: number;
  externalGrowthBytes: number;
  thresholdBytes: number;
  flagged: boolean;
}

export class GrowthTracker {
  private readonly samples: ProcessMemory[] = [];

  constructor(
    readonly window: number,
    readonly thresholdBytes: number,
  ) {
    if (window < 4) throw new Error('the growth window needs at least 4 samples');
  }

  record(m: ProcessMemory): void {
    this.samples.push(m);
    if (this.samples.length > this.window) this.samples.shift();
  }

  report(): GrowthReport {
    const n = this.samples.length;
    const q = Math.max(1, Math.floor(n / 4));
    const floor = (from: number, to: number, key: keyof ProcessMemory) =>
      Math.min(...this.samples.slice(from, to).map((s) => s[key]));
    const growth = (key: keyof ProcessMemory) => (n < 2 ? 0 : floor(n - q, n, key) - floor(0, q, key));
    const rssGrowthBytes = growth('rss');
    const heapGrowthBytes = growth('heapUsed');
    const externalGrowthBytes = growth('external');
    return {
      window: this.window,
      samples: n,
      rssGrowthBytes,
      heapGrowthBytes,
      externalGrowthBytes,
      thresholdBytes: this.thresholdBytes,
      flagged: n === this.window && Math.max(rssGrowthBytes, heapGrowthBytes + externalGrowthBytes) > this.thresholdBytes,
    };
  }
}

/**
 * The slow-leak check: memory over time, not per request. The window check above catches a fast leak
 * (tens of MB within 50 requests) but not one of a MiB or two a minute, which never passes its
 * threshold inside one window, yet fills a machine within a day (faiss-node leaked whole index copies
 * per ingest: 25 MiB a minute under a soak, unflagged).
 *
 * Samples come on a timer (RAGGUARD_LEAK_SAMPLE_MS). Each carries the bytes the process is expected to
 * have grown by: what the store holds for its documents (vectors, texts, lexical postings), predicted
 * from their sizes. A growing index is growth, not a leak: the check sees resident memory less that.
 *
 * Over the horizon (RAGGUARD_LEAK_HORIZON_MS), after the warm-up (RAGGUARD_LEAK_WARMUP_MS: first runs,
 * lazily made buffers, V8 sizing its heap), the samples fall into BUCKETS equal spans of time; each
 * span's floor (its lowest sample: the allocator's and the collector's sawtooth rides above it) is one
 * point, and the slope through the points is the Theil-Sen estimate (the median of the slopes of all
 * pairs: one odd span cannot tilt it). A slope above RAGGUARD_LEAK_SLOPE_BYTES_PER_MIN held over at
 * least RAGGUARD_LEAK_MIN_SPAN_MS, adding up to at least MIN_GROWTH_BYTES, is flagged 'growing'.
 */
export interface TrendSample {
  /** ms (Date.now() or any monotonic clock; only differences matter). */
  at: number;
  rss: number;
  heapUsed: number;
  external: number;
  /** Bytes of expected growth (stored documents' predicted bytes), subtracted from rss. */
  expectedBytes: number;
}

export interface TrendOptions {
  horizonMs: number;
  warmupMs: number;
  minSpanMs: number;
  /** Flag at or above this slope (bytes a minute). */
  slopeBytesPerMin: number;
  /** And at or above this much growth across the span (so that noise over a short span is not a trend). */
  minGrowthBytes?: number;
}

export type TrendVerdict = 'warming_up' | 'collecting' | 'steady' | 'growing';

export interface TrendReport {
  verdict: TrendVerdict;
  flagged: boolean;
  samples: number;
  /** Of the samples, those after the warm-up and inside the horizon (the ones the slopes are fitted to). */
  fitted: number;
  span_ms: number;
  /** Resident memory less the expected growth: bytes a minute (Theil-Sen over the spans' floors). */
  rss_slope_bytes_per_min: number;
  /** Resident memory as it is, and the expected growth alone: bytes a minute, same fit. */
  rss_raw_slope_bytes_per_min: number;
  expected_slope_bytes_per_min: number;
  /** V8's heap and external memory (JS objects and the buffers they hold): bytes a minute. */
  heap_slope_bytes_per_min: number;
  /** The fitted rise across the span (slope x span), rss less expected growth. */
  rss_growth_bytes: number;
  threshold_bytes_per_min: number;
  min_span_ms: number;
  warmup_ms: number;
  horizon_ms: number;
}

const BUCKETS = 12;
const MINUTE = 60_000;
export const MIN_GROWTH_BYTES = 8 * 2 ** 20;

/** Theil-Sen slope of (x, y) points: the median of the slopes of every pair with distinct x. */
export function theilSen(points: readonly (readonly [number, number])[]): number {
  const slopes: number[] = [];
  for (let i = 0; i < points.length; i++) {
    for (let j = i + 1; j < points.length; j++) {
      const dx = points[j]![0] - points[i]![0];
      if (dx !== 0) slopes.push((points[j]![1] - points[i]![1]) / dx);
    }
  }
  if (slopes.length === 0) return 0;
  slopes.sort((a, b) => a - b);
  const m = slopes.length >> 1;
  return slopes.length % 2 ? slopes[m]! : (slopes[m - 1]! + slopes[m]!) / 2;
}

export class MemoryTrend {
  private readonly samples: TrendSample[] = [];
  private first: number | undefined;

  constructor(readonly opts: TrendOptions) {
    if (opts.minSpanMs > opts.horizonMs) throw new Error('the trend\'s minimum span exceeds its horizon');
  }

  record(s: TrendSample): void {
    this.first ??= s.at;
    this.samples.push(s);
    // Keep the horizon (and the warm-up's end, which the fit starts after).
    const keepFrom = Math.min(s.at - this.opts.horizonMs, this.first + this.opts.warmupMs);
    while (this.samples.length > 2 && this.samples[0]!.at < keepFrom && this.samples[1]!.at <= keepFrom) this.samples.shift();
  }

  report(): TrendReport {
    const { horizonMs, warmupMs, minSpanMs, slopeBytesPerMin } = this.opts;
    const minGrowth = this.opts.minGrowthBytes ?? MIN_GROWTH_BYTES;
    const last = this.samples.at(-1);
    const from = last === undefined || this.first === undefined ? 0 : Math.max(this.first + warmupMs, last.at - horizonMs);
    const fit = this.samples.filter((s) => s.at >= from);
    const span = fit.length > 1 ? fit.at(-1)!.at - fit[0]!.at : 0;
    const slope = (value: (s: TrendSample) => number) => {
      if (fit.length < 2 || span <= 0) return 0;
      const width = span / BUCKETS;
      const floors = new Map<number, [number, number]>();
      for (const s of fit) {
        const b = Math.min(BUCKETS - 1, Math.floor((s.at - fit[0]!.at) / width));
        const v = value(s);
        const cur = floors.get(b);
        if (!cur || v < cur[1]) floors.set(b, [s.at, v]);
      }
      return theilSen([...floors.values()]) * MINUTE;
    };
    const adjusted = slope((s) => s.rss - s.expectedBytes);
    const growth = adjusted * (span / MINUTE);
    const warming = last === undefined || this.first === undefined || last.at < this.first + warmupMs;
    const enough = span >= minSpanMs;
    const growing = enough && adjusted >= slopeBytesPerMin && growth >= minGrowth;
    return {
      verdict: warming ? 'warming_up' : !enough ? 'collecting' : growing ? 'growing' : 'steady',
      flagged: growing,
      samples: this.samples.length,
      fitted: fit.length,
      span_ms: span,
      rss_slope_bytes_per_min: Math.round(adjusted),
      rss_raw_slope_bytes_per_min: Math.round(slope((s) => s.rss)),
      expected_slope_bytes_per_min: Math.round(slope((s) => s.expectedBytes)),
      heap_slope_bytes_per_min: Math.round(slope((s) => s.heapUsed + s.external)),
      rss_growth_bytes: Math.round(growth),
      threshold_bytes_per_min: slopeBytesPerMin,
      min_span_ms: minSpanMs,
      warmup_ms: warmupMs,
      horizon_ms: horizonMs,
    };
  }
}
