import assert from 'node:assert/strict';
import { test } from 'node:test';
import { GpuSampler, nvmlReader, type GpuMemoryReader, type GpuReading } from '../src/guards/nvml.js';
import { gpuPeakMeter, measurePeak } from '../src/guards/peak-meter.js';

function nvml(used: number[]): GpuReading {
  return {
    source: 'nvml', at: Date.now(),
    gpus: used.map((u, index) => ({ index, name: `fake ${index}`, totalBytes: 100, usedBytes: u, freeBytes: 100 - u })),
  };
}

/** Returns the scripted readings in order, then repeats the last; counts calls. */
function scripted(readings: GpuReading[]): GpuMemoryReader & { calls: number } {
  const r = {
    calls: 0,
    read(): GpuReading {
      const x = readings[Math.min(r.calls, readings.length - 1)];
      r.calls++;
      assert.ok(x);
      return x;
    },
  };
  return r;
}

const sleep = (ms: number) => new Promise<void>((res) => setTimeout(res, ms));

test('on this host (no NVIDIA driver) the default reader reports none, naming libnvidia-ml', () => {
  const r = nvmlReader().read();
  assert.equal(r.source, 'none');
  assert.ok(r.source === 'none' && /libnvidia-ml\.so\.1 not loadable/.test(r.reason), JSON.stringify(r));
  assert.match(r.source === 'none' ? r.reason : '', /no NVIDIA GPU or driver/);
  assert.equal(typeof r.at, 'number');
});

test('a reader for a nonexistent library reports none on every read and never throws', () => {
  const reader = nvmlReader('/nonexistent/libnvidia-ml-missing.so');
  const a = reader.read();
  const b = reader.read();
  for (const r of [a, b]) {
    assert.equal(r.source, 'none');
    assert.ok(r.source === 'none' && r.reason.includes('/nonexistent/libnvidia-ml-missing.so not loadable'), JSON.stringify(r));
  }
});

test('GpuSampler keeps the latest reading and the per-GPU peak used bytes; resetPeak restarts from latest', () => {
  const fake = scripted([nvml([10, 5]), nvml([40, 3]), nvml([20, 7]), nvml([15, 1]), nvml([30, 2])]);
  const s = new GpuSampler(fake, 60_000);
  try {
    // The constructor samples once.
    assert.equal(fake.calls, 1);
    const first = s.latest();
    assert.deepEqual(first.source === 'nvml' ? first.gpus.map((g) => g.usedBytes) : [], [10, 5]);
    assert.equal(s.peakUsedBytes(0), 10);
    s.sample(); s.sample();
    const latest = s.latest();
    assert.equal(latest.source, 'nvml');
    assert.deepEqual(latest.source === 'nvml' ? latest.gpus.map((g) => g.usedBytes) : [], [20, 7]);
    assert.equal(s.peakUsedBytes(0), 40);
    assert.equal(s.peakUsedBytes(1), 7);
    assert.equal(s.peakUsedBytes(2), undefined);

    s.resetPeak();
    assert.equal(s.peakUsedBytes(0), 20);
    assert.equal(s.peakUsedBytes(1), 7);
    s.sample(); // [15, 1]
    assert.equal(s.peakUsedBytes(0), 20);
    assert.equal(s.peakUsedBytes(1), 7);
    s.sample(); // [30, 2]
    assert.equal(s.peakUsedBytes(0), 30);
    assert.equal(s.peakUsedBytes(1), 7);
  } finally {
    s.stop();
  }
});

test('GpuSampler: none readings become latest without touching peaks; a throwing reader is contained', () => {
  let n = 0;
  const reader: GpuMemoryReader = {
    read(): GpuReading {
      n++;
      if (n === 1) return nvml([50]);
      if (n === 2) return { source: 'none', reason: 'gone', at: 1 };
      throw new Error('boom');
    },
  };
  const s = new GpuSampler(reader, 60_000);
  try {
    s.sample();
    assert.deepEqual(s.latest(), { source: 'none', reason: 'gone', at: 1 });
    assert.equal(s.peakUsedBytes(0), 50);
    const r = s.sample();
    assert.ok(r.source === 'none' && r.reason.includes('boom'));
    assert.equal(s.peakUsedBytes(0), 50);
  } finally {
    s.stop();
  }
});

test('GpuSampler timer samples repeatedly and stop() halts it', async () => {
  const fake = scripted([nvml([1]), nvml([2]), nvml([3])]);
  const s = new GpuSampler(fake, 2);
  assert.equal(s.running, true);
  // However long a loaded machine takes, the timer alone brings the samples (no deadline to miss).
  while (fake.calls < 3) await sleep(5);
  assert.equal(s.peakUsedBytes(0), 3);
  s.stop();
  assert.equal(s.running, false);
  const after = fake.calls;
  await sleep(30);
  assert.equal(fake.calls, after);
});

test('the GPU peak meter catches a peak between its window\'s ends, and says when there is no GPU', async () => {
  let used = 100;
  const reader: GpuMemoryReader = {
    read: (): GpuReading => ({ source: 'nvml', at: Date.now(), gpus: [{ index: 0, name: 'fake', totalBytes: 1000, usedBytes: used, freeBytes: 1000 - used }] }),
  };
  const meter = gpuPeakMeter(reader);
  assert.equal(meter.available, true);
  const { bytes } = await measurePeak(meter, async () => {
    used = 400; // a run's buffers exist for a few samples, then are freed
    await new Promise((r) => setTimeout(r, 20));
    used = 120;
    await new Promise((r) => setTimeout(r, 5));
  });
  assert.equal(bytes, 300, 'peak 400 over the 100 the window started at');
  const none = gpuPeakMeter({ read: () => ({ source: 'none', reason: 'no driver here', at: Date.now() }) });
  assert.equal(none.available, false);
  assert.equal(none.reason, 'no driver here');
});

test("a load's device bytes are NVML's delta across it (weights a GPU provider uploads), its host bytes the resident delta", async () => {
  const { measureLoad } = await import('../src/guards/process-memory.js');
  const GiB = 2 ** 30;
  const device = scripted([nvml([10 * GiB, 1 * GiB]), nvml([12 * GiB, 1 * GiB])]);
  const r = await measureLoad(async () => 'model', device);
  assert.equal(r.value, 'model');
  assert.equal(device.calls, 2, 'read before and after the load');
  assert.equal(r.deviceBytes, 2 * GiB);
  assert.equal(r.bytes, r.hostBytes + r.deviceBytes);
  // Without a GPU: no device bytes, the host's alone.
  const none = await measureLoad(async () => 1, nvmlReader('/nonexistent/libnvidia-ml-missing.so'));
  assert.equal(none.deviceBytes, 0);
  assert.equal(none.bytes, none.hostBytes);
});
