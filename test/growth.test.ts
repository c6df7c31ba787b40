import assert from 'node:assert/strict';
import { test } from 'node:test';
import { GrowthTracker, MemoryTrend, theilSen } from '../src/guards/growth.js';
import type { ProcessMemory } from '../src/guards/process-memory.js';

const MB = 1 << 20;
const mem = (rss: number, heapUsed = 10 * MB, external = 0): ProcessMemory => ({ rss, heapTotal: 0, heapUsed, external, arrayBuffers: 0 });

test('a steady climb across the window is flagged', () => {
  const g = new GrowthTracker(8, 16 * MB);
  for (let i = 0; i < 8; i++) g.record(mem(100 * MB + i * 4 * MB));
  const r = g.report();
  assert.equal(r.samples, 8);
  assert.equal(r.rssGrowthBytes, 24 * MB); // floor of the last quarter (i=6) minus floor of the first (i=0)
  assert.equal(r.flagged, true);
});

test('a garbage-collector sawtooth with flat floors is not a leak', () => {
  const g = new GrowthTracker(8, 16 * MB);
  for (let i = 0; i < 40; i++) g.record(mem(100 * MB + (i % 2) * 50 * MB, 10 * MB + (i % 2) * 40 * MB));
  const r = g.report();
  assert.equal(r.rssGrowthBytes, 0);
  assert.equal(r.heapGrowthBytes, 0);
  assert.equal(r.flagged, false);
});

test('nothing is flagged before the window is full; only the last N requests count', () => {
  const g = new GrowthTracker(4, 1 * MB);
  g.record(mem(100 * MB));
  g.record(mem(200 * MB));
  assert.equal(g.report().flagged, false);
  for (let i = 0; i < 4; i++) g.record(mem(300 * MB));
  assert.equal(g.report().samples, 4);
  assert.equal(g.report().rssGrowthBytes, 0, 'the early climb fell out of the window');
  assert.throws(() => new GrowthTracker(2, MB), /at least 4/);
});

test('heap plus external growth counts (native tensors held from JS)', () => {
  const g = new GrowthTracker(4, 8 * MB);
  for (let i = 0; i < 4; i++) g.record(mem(100 * MB, 10 * MB + i * 2 * MB, i * 3 * MB));
  const r = g.report();
  assert.equal(r.heapGrowthBytes + r.externalGrowthBytes, 15 * MB);
  assert.equal(r.flagged, true);
});

// --- the slow-leak check (MemoryTrend) ---

const MIN = 60_000;
const opts = { horizonMs: 60 * MIN, warmupMs: 5 * MIN, minSpanMs: 10 * MIN, slopeBytesPerMin: 1 * MB };
/** A sample a minute for `minutes`, resident memory from `rss(t)`, a GC-like sawtooth of 40 MB on top. */
function feed(t: MemoryTrend, minutes: number, rss: (m: number) => number, expected: (m: number) => number = () => 0): void {
  for (let m = 0; m < minutes; m++) {
    t.record({ at: m * MIN, rss: rss(m) + (m % 3) * 40 * MB, heapUsed: 50 * MB, external: 0, expectedBytes: expected(m) });
  }
}

test('a slow native leak (2 MiB a minute) is flagged once the span is long enough, where the window check never would be', () => {
  const t = new MemoryTrend(opts);
  feed(t, 14, (m) => 2000 * MB + m * 2 * MB);
  assert.equal(t.report().verdict, 'collecting', '9 minutes after the warm-up: no verdict yet');
  const t2 = new MemoryTrend(opts);
  feed(t2, 30, (m) => 2000 * MB + m * 2 * MB);
  const r = t2.report();
  assert.equal(r.verdict, 'growing');
  assert.equal(r.flagged, true);
  assert.ok(Math.abs(r.rss_slope_bytes_per_min - 2 * MB) < 0.05 * MB, `slope ${r.rss_slope_bytes_per_min}`);
});

test('flat floors under a sawtooth are steady', () => {
  const t = new MemoryTrend(opts);
  feed(t, 40, () => 2000 * MB);
  const r = t.report();
  assert.equal(r.verdict, 'steady');
  assert.ok(Math.abs(r.rss_slope_bytes_per_min) < 0.01 * MB);
});

test('growth the store predicts (documents ingested) is subtracted; the rest is still seen', () => {
  const ingest = (m: number) => Math.floor(m / 2) * 6 * MB; // a document every 2 minutes, 6 MB of index each
  const t = new MemoryTrend(opts);
  feed(t, 40, (m) => 2000 * MB + ingest(m), ingest);
  const r = t.report();
  assert.equal(r.flagged, false, 'the index growing is not a leak');
  assert.ok(r.rss_raw_slope_bytes_per_min > 2 * MB && r.expected_slope_bytes_per_min > 2 * MB);
  const leaking = new MemoryTrend(opts);
  feed(leaking, 40, (m) => 2000 * MB + ingest(m) + m * 1.5 * MB, ingest);
  assert.equal(leaking.report().flagged, true, 'a leak beside the growing index');
});

test('the warm-up is left out, and an old climb leaves the horizon', () => {
  const t = new MemoryTrend(opts);
  feed(t, 30, (m) => 1000 * MB + Math.min(m, 4) * 200 * MB); // 800 MB in the first 4 minutes, then flat
  assert.equal(t.report().flagged, false);
  const short = new MemoryTrend({ ...opts, horizonMs: 20 * MIN });
  feed(short, 80, (m) => 1000 * MB + Math.min(m, 40) * 3 * MB); // climbed until minute 40, flat for the last 40
  assert.equal(short.report().flagged, false);
  assert.throws(() => new MemoryTrend({ ...opts, minSpanMs: 2 * opts.horizonMs }), /span/);
});

test('theilSen ignores an outlier that least squares would follow', () => {
  const pts: [number, number][] = [[0, 0], [1, 1], [2, 2], [3, 3], [4, 100], [5, 5], [6, 6]];
  assert.equal(theilSen(pts), 1);
});
