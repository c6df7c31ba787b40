/**
 * The counting allocator (ONNX Runtime's accounted bytes): every CPU session and every direct tensor
 * allocates through it once it is installed, and a run's peak is the same run after run.
 */
import assert from 'node:assert/strict';
import path from 'node:path';
import { test } from 'node:test';
import { accountedPeakMeter, hostMeter, hostPeakMeter, measurePeak } from '../src/guards/peak-meter.js';
import { accountingUnavailable, installCountingAllocator } from '../src/backends/ort/ort-allocator.js';
import { DirectSession, type HostTensor } from '../src/backends/ort/ort-direct.js';
import { createSession, encoderFeeds } from '../src/backends/ort/session.js';

const ROOT = path.resolve(import.meta.dirname, '..');
const MiB = 1 << 20;
// Installed before the first session of this process, as loadModels does.
const counters = installCountingAllocator();

test('npm run setup builds the counting allocator and it installs', () => {
  assert.ok(counters, `not installed: ${accountingUnavailable()}`);
  assert.equal(accountingUnavailable(), '');
  assert.equal(installCountingAllocator(), counters, 'installed once per process');
});

test("an onnxruntime-node session's runs are accounted: same shape, same peak; all freed after the run", async () => {
  const c = counters!;
  const loadFrom = c.live();
  const { session } = await createSession(path.join(ROOT, 'models/reranker/onnx/model.onnx'), 'cpu');
  assert.ok(c.live() > loadFrom, 'the session allocated its initializers through the allocator');
  const meter = accountedPeakMeter();
  const run = (pairs: number, width: number) => measurePeak(meter, async () => {
    const rows = Array.from({ length: pairs }, (_, r) => Array.from({ length: width }, (_, i) => 5 + ((i + r) % 50)));
    const before = c.live();
    await session.run(encoderFeeds(session, rows, 0));
    return c.live() - before;
  });
  const a = await run(16, 128);
  const b = await run(16, 128);
  const big = await run(16, 256);
  assert.equal(a.value, 0, 'nothing of the run is live after it');
  assert.ok(a.bytes > 4 * MiB, `a 16 x 128 reranker run accounted ${a.bytes} bytes`);
  assert.ok(Math.abs(a.bytes - b.bytes) / a.bytes < 0.01, `run to run: ${a.bytes} then ${b.bytes}`);
  assert.ok(big.bytes > 2 * a.bytes, `twice the width, more than twice the bytes (attention scores): ${big.bytes} vs ${a.bytes}`);
  await session.release();
});

test("a direct session's tensors are accounted until disposed", () => {
  const c = counters!;
  const d = DirectSession.create(path.join(ROOT, 'models/decoder-gqa/model.onnx'));
  assert.ok(d, 'direct session');
  const before = c.live();
  const heapBefore = c.heapLive();
  const t = d.tensor('float32', [4, 1024]);
  assert.ok(c.live() - before >= 16384 && c.live() - before < 16384 + 4096, `${c.live() - before} bytes for 16 KiB`);
  // A small block is malloc's: the part of the live bytes that glibc's in-use figure also holds.
  assert.equal(c.heapLive() - heapBefore, c.live() - before);
  t.dispose();
  assert.equal(c.live(), before);
  assert.equal(c.heapLive(), heapBefore);
  d.dispose();
});

test('the host meter is the accounted one where asked for and installed, resident memory otherwise', () => {
  const accounted = hostMeter({ hostMeter: 'accounted' });
  assert.ok(accounted.available);
  assert.equal(accounted.resident(), counters!.live());
  assert.equal(hostMeter({ hostMeter: 'resident' }), hostPeakMeter());
});

test('large tensors lie in the reserved regions: accounted, apart from each other, and no new external memory for V8', () => {
  const c = counters!;
  const d = DirectSession.create(path.join(ROOT, 'models/decoder-gqa/model.onnx'));
  assert.ok(d, 'direct session');
  const before = c.live();
  const heapBefore = c.heapLive();
  const external = process.memoryUsage().external;
  // 64 tensors of 16 MiB made and freed, two alive at a time (as a batch's past buffers come and go):
  // a new ArrayBuffer for each would add 1 GiB of external memory until V8 collects them.
  let prev: HostTensor = d.tensor('float32', [4, MiB]);
  (prev.data as Float32Array).fill(1);
  for (let i = 0; i < 64; i++) {
    const t: HostTensor = d.tensor('float32', [4, MiB]);
    assert.ok(c.live() - before >= 2 * 16 * MiB && c.live() - before <= 2 * (16 * MiB + 8192), `${c.live() - before} bytes live for two 16 MiB tensors`);
    (t.data as Float32Array).fill(i + 2);
    assert.equal((prev.data as Float32Array)[4 * MiB - 1], i + 1, 'a live tensor keeps its contents while another is written');
    assert.equal(t.data.buffer, prev.data.buffer, 'both read through their region\'s one view');
    assert.equal(c.heapLive(), heapBefore, 'nothing of a region block is in malloc');
    prev.dispose();
    prev = t;
  }
  prev.dispose();
  assert.equal(c.live(), before, 'every block given back');
  const grown = process.memoryUsage().external - external;
  assert.ok(grown < 16 * MiB, `external memory grew by ${grown} bytes over 1 GiB of tensors`);
  d.dispose();
});

test('the warm cache keeps freed large blocks for the next run up to its limit, and gives back what is over it', () => {
  const c = counters!;
  const d = DirectSession.create(path.join(ROOT, 'models/decoder-gqa/model.onnx'));
  assert.ok(d, 'direct session');
  const block = (mib: number) => d.tensor('float32', [mib, MiB / 4]);
  // A block's length in the regions: its bytes and a 64-byte header, in whole pages.
  const len = (mib: number) => mib * MiB + 4096;
  try {
    c.setWarmLimit(40 * MiB);
    assert.equal(c.warmLimit(), 40 * MiB);
    const live = c.live();
    const a = block(16), b = block(16);
    const offsetA = a.data.byteOffset;
    a.dispose();
    b.dispose();
    assert.equal(c.live(), live, 'freed blocks are not live');
    assert.equal(c.warm(), 2 * len(16), 'both kept warm under a 40 MiB limit');
    // The same shape again: the first freed block itself, not new pages.
    const again = block(16);
    assert.equal(again.data.byteOffset, offsetA, 'the warm block is reused');
    assert.equal(c.warm(), len(16));
    // A smaller one is cut from a warm block; the rest of it stays warm.
    const small = block(4);
    assert.equal(c.warm(), len(16) - len(4));
    again.dispose();
    small.dispose();
    assert.equal(c.warm(), 2 * len(16));
    // More freed than the limit holds: the oldest go back, no more than the limit stays.
    const more = [block(16), block(16), block(16)];
    for (const t of more) t.dispose();
    assert.ok(c.warm() <= 40 * MiB && c.warm() >= len(16), `${c.warm()} bytes warm under a 40 MiB limit`);
    // A block larger than the limit is never kept.
    const before = c.warm();
    block(48).dispose();
    assert.equal(c.warm(), before);
    c.setWarmLimit(0);
    assert.equal(c.warm(), 0, 'a limit of 0 gives every warm block back');
    assert.equal(c.live(), live);
  } finally {
    c.setWarmLimit(0);
    d.dispose();
  }
});

test('the warm cache says how much of it is resident: a block written in part (or read) holds only the pages written until its next use fills it', () => {
  const c = counters!;
  const d = DirectSession.create(path.join(ROOT, 'models/decoder-gqa/model.onnx'));
  assert.ok(d, 'direct session');
  try {
    c.setWarmLimit(40 * MiB);
    const t = d.tensor('float32', [16, MiB / 4]);
    (t.data as Float32Array).fill(1, 0, MiB); // the first 4 MiB written,
    let sum = 0;
    for (let i = MiB; i < 2 * MiB; i += 1024) sum += (t.data as Float32Array)[i]!; // the next 4 MiB only read (the zero page), the rest never touched
    assert.equal(sum, 0);
    t.dispose();
    assert.equal(c.warm(), 16 * MiB + 4096);
    // Its header page and the 4 MiB written (the header shares the first data page).
    assert.ok(c.warmResident() >= 4 * MiB && c.warmResident() <= 4 * MiB + 8192, `${c.warmResident()} bytes of the warm block resident`);
    const again = d.tensor('float32', [16, MiB / 4]);
    (again.data as Float32Array).fill(2);
    again.dispose();
    assert.ok(c.warmResident() === c.warm(), `${c.warmResident()} of ${c.warm()} warm bytes resident once written whole`);
    c.setWarmLimit(0);
    assert.equal(c.warmResident(), 0);
  } finally {
    c.setWarmLimit(0);
    d.dispose();
  }
});
