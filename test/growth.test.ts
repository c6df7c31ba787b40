import assert from 'node:assert/strict';
import { test } from 'node:test';
import { GrowthTracker } from '../src/guards/growth.js';
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
