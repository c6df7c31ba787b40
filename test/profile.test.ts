/** The start-up profile run and what it measures with: the peak meter, the fit, the calibration. */
import assert from 'node:assert/strict';
import { before, describe, test } from 'node:test';
import { STAGES } from '../src/guards/memory-model.js';
import { hostPeakMeter, measurePeak } from '../src/guards/peak-meter.js';
import { fitStage, headroom } from '../src/guards/profile.js';
import { RagService } from '../src/service/rag.js';
import { smallCorpus, tempDir, testConfig } from './helpers.js';

const MiB = 1 << 20;
const meter = hostPeakMeter();

test('the peak meter sees a buffer that lived only inside the measured work', { skip: !meter.available && meter.reason }, async () => {
  const { bytes } = await measurePeak(meter, async () => {
    const b = new Uint8Array(64 * MiB);
    for (let i = 0; i < b.length; i += 4096) b[i] = 1; // touch every page
    return b.length;
  });
  assert.ok(bytes >= 63 * MiB && bytes < 80 * MiB, `measured ${bytes / MiB} MiB`);
  const idle = await measurePeak(meter, async () => 0);
  assert.ok(idle.bytes < 8 * MiB, `nothing allocated, measured ${idle.bytes / MiB} MiB`);
});

test('the resident meter is not fooled by dead buffers that the measured work reuses', { skip: !meter.available && meter.reason }, async () => {
  // Garbage just before the window: V8 frees dead buffers' memory turns after the collection that
  // found them, so a window opened on one collection alone began on that memory and the work reused
  // it unseen (64 KiB buffers: 14-57 MiB measured of 256, in most of five runs, before settling).
  for (let round = 0; round < 5; round++) {
    let junk: Buffer[] | undefined = Array.from({ length: 4096 }, () => Buffer.alloc(64 * 1024, 1));
    assert.equal(junk.length, 4096);
    junk = undefined;
    const { bytes } = await measurePeak(meter, async () => {
      const kept = Array.from({ length: 4096 }, () => Buffer.alloc(64 * 1024, 2));
      await new Promise((r) => setImmediate(r));
      return kept.length;
    });
    assert.ok(bytes >= 230 * MiB, `round ${round}: measured ${(bytes / MiB).toFixed(0)} MiB of 256 written`);
  }
});

test('fitStage recovers measured = scale x analytic + offset; never a negative offset', () => {
  const pt = (a: number, m: number) => ({ analytic_bytes: a, measured_bytes: m });
  const line = fitStage([15, 140, 1600].map((a) => pt(a * MiB, 1.5 * a * MiB + 7000)));
  assert.ok(Math.abs(line.scale - 1.5) < 1e-6, JSON.stringify(line));
  assert.ok(Math.abs(line.offsetBytes - 7000) <= 2, JSON.stringify(line));
  // Points under a line through the origin: a negative offset is refused, the fit goes through 0.
  const origin = fitStage([pt(10 * MiB, 5 * MiB), pt(100 * MiB, 110 * MiB), pt(1000 * MiB, 1200 * MiB)]);
  assert.equal(origin.offsetBytes, 0);
  assert.ok(origin.scale > 0.5 && origin.scale < 1.2, `between the points' ratios: ${JSON.stringify(origin)}`);
  assert.deepEqual(fitStage([]), { scale: 1, offsetBytes: 0 });
});

describe('the profile run on the shipped models', () => {
  let service: RagService;
  before(async () => {
    const cfg = testConfig({ RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(2), RAGGUARD_PROMPT_BUDGET: '256' });
    service = await RagService.start(cfg);
  });

  test('measures every stage at the configured shapes and calibrates the memory model by it', { skip: !meter.available && meter.reason }, () => {
    const p = service.profile;
    assert.equal(p.source, 'profile');
    if (p.source !== 'profile') return;
    for (const st of STAGES) assert.ok(p.points.some((pt) => pt.stage === st), `a point for ${st}`);
    const prefill = p.points.find((pt) => pt.stage === 'prefill')!;
    assert.deepEqual(prefill.shape, [1, 256, 0], 'prefill profiled at the prompt budget first');
    const decode = p.points.find((pt) => pt.stage === 'decode')!;
    assert.equal(decode.shape[0], service.cfg.maxNumSeqs, 'decode profiled at max_num_seqs rows');
    for (const pt of p.points.filter((x) => x.stage !== 'embed')) assert.ok(pt.measured_bytes > 0, `${pt.stage} ${pt.shape} measured`);
    for (const st of STAGES) {
      const f = p.calibration[st];
      assert.ok(f.scale >= 0.5 && f.scale < 5 && f.offsetBytes >= 0 && f.offsetBytes < 64 * MiB, `${st} fit ${JSON.stringify(f)}`);
    }
    assert.deepEqual(service.guard.model.calibration, p.calibration);
    assert.ok(p.headroom >= 0 && p.headroom <= 1, `headroom ${p.headroom}`);
    assert.equal(service.guard.model.headroom, Math.max(service.cfg.minHeadroom, p.headroom), 'RAGGUARD_MIN_HEADROOM is the floor');
    // Predictions are the stage's line through the analytic figures.
    const m = service.guard.model;
    const shape = { queryTokens: 8, topK: 4, rerankTopN: 2, pairTokens: 64, promptTokens: 200, maxNewTokens: 8 };
    const f = p.calibration.prefill;
    // (plus the exact bytes outside the fit: the rows of gathered adapter slots, where adapters can run)
    assert.equal(m.predict(shape).stages.prefill, Math.ceil(f.scale * m.decoderWorkspace(1, 200, 0) + f.offsetBytes) + m.loraRows(1, 200));
  });
});

test('headroom is the worst under-prediction among runs of a few MiB or more, capped at 1', () => {
  const one = { scale: 1, offsetBytes: 0 };
  const fits = { embed: one, rerank: one, prefill: one, decode: one };
  const pt = (measured: number, analytic: number) => ({ stage: 'prefill' as const, shape: [1, 1, 0] as [number, number, number], analytic_bytes: analytic, measured_bytes: measured });
  assert.equal(headroom([pt(110 * MiB, 100 * MiB), pt(90 * MiB, 100 * MiB), pt(3 * MiB, 1 * MiB)], fits), 0.1);
  assert.equal(headroom([pt(90 * MiB, 100 * MiB)], fits), 0);
  assert.equal(headroom([pt(400 * MiB, 100 * MiB)], fits), 1);
});

test('a meter that sees nothing of megabyte-sized runs leaves the analytic figures, saying why', async () => {
  const { MemoryModel } = await import('../src/guards/memory-model.js');
  const { profileMemory } = await import('../src/guards/profile.js');
  const model = new MemoryModel({ numLayers: 2, hiddenSize: 128, numHeads: 4, intermediateSize: 512 },
    { numLayers: 4, hiddenSize: 256, numHeads: 8, numKvHeads: 2, headDim: 32, intermediateSize: 768, vocabSize: 4096 }, 16);
  const blind = { available: true, resident: () => 1e9, reset: () => undefined, peak: () => 1e9 };
  const idle = async () => undefined;
  const report = await profileMemory(model, { embed: idle, rerank: idle, decoder: idle },
    { queryTokens: 16, rerankPairs: 16, pairTokens: 256, promptTokens: 768, contextTokens: 1024, decodeRows: 8 }, blind);
  assert.equal(report.source, 'analytic');
  assert.match(report.source === 'analytic' ? report.reason : '', /does not see these runs/);
});

test('a fit never scales the analytic figure below one half', async () => {
  const { floorFit } = await import('../src/guards/profile.js');
  assert.deepEqual(floorFit({ scale: 0.1, offsetBytes: 7 }), { scale: 0.5, offsetBytes: 7 });
  assert.deepEqual(floorFit({ scale: 0.9, offsetBytes: 7 }), { scale: 0.9, offsetBytes: 7 });
});

test('a meter blind to one stage leaves that stage analytic and calibrates the stages it sees', async () => {
  const { MemoryModel } = await import('../src/guards/memory-model.js');
  const { profileMemory } = await import('../src/guards/profile.js');
  const model = new MemoryModel({ numLayers: 2, hiddenSize: 128, numHeads: 4, intermediateSize: 512 },
    { numLayers: 4, hiddenSize: 256, numHeads: 8, numKvHeads: 2, headDim: 32, intermediateSize: 768, vocabSize: 4096 }, 16);
  // As NVML under WebGPU: the encoders' small buffers come from pooled device memory (unseen), the
  // decoder's runs show, at twice their analytic bytes.
  let last = 0;
  const meter = { available: true, resident: () => 0, reset: () => undefined, peak: () => last };
  const report = await profileMemory(model, {
    embed: async () => void (last = 0),
    rerank: async () => void (last = 0),
    decoder: async (r, s, c) => void (last = 2 * model.decoderWorkspace(r, s, c)),
  }, { queryTokens: 16, rerankPairs: 16, pairTokens: 256, promptTokens: 768, contextTokens: 1024, decodeRows: 8 }, meter);
  assert.equal(report.source, 'profile');
  if (report.source !== 'profile') return;
  assert.deepEqual(Object.keys(report.analytic_stages ?? {}), ['rerank']);
  assert.match(report.analytic_stages!.rerank!, /does not see these runs/);
  assert.deepEqual(report.calibration.rerank, { scale: 1, offsetBytes: 0 }, 'the blind stage keeps its analytic figures');
  for (const st of ['prefill', 'decode'] as const) {
    assert.ok(Math.abs(report.calibration[st].scale - 2) < 0.01, `${st}: ${JSON.stringify(report.calibration[st])}`);
  }
  assert.ok(report.headroom < 0.01, 'the blind stage sets no headroom');
});
