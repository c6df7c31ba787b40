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
