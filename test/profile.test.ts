/** The start-up profile run and what it measures with: the peak meter, the fit, the calibration. */
import assert from 'node:assert/strict';
import { before, describe, test } from 'node:test';
import { STAGES } from '../src/guards/memory-model.js';
import { measurePeak, peakMeter } from '../src/guards/peak-meter.js';
import { fitStage } from '../src/guards/profile.js';
import { RagService } from '../src/rag.js';
import { smallCorpus, tempDir, testConfig } from './helpers.js';

const MiB = 1 << 20;
const meter = peakMeter();

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

test('fitStage fits measured = scale x analytic + offset; never a negative offset', () => {
  const pts = (xs: [number, number][]) => xs.map(([a, m]) => ({ analytic_bytes: a, measured_bytes: m }));
  const line = fitStage(pts([[10, 17], [100, 125], [1000, 1205]]));
  assert.ok(Math.abs(line.scale - 1.2) < 1e-9 && line.offsetBytes === 5, JSON.stringify(line));
  // Points under a line through the origin: the offset would be negative, so the fit goes through 0.
  const origin = fitStage(pts([[10, 5], [100, 110], [1000, 1200]]));
  assert.equal(origin.offsetBytes, 0);
  assert.ok(origin.scale > 1.19 && origin.scale < 1.2);
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
      assert.ok(f.scale > 0.2 && f.scale < 5 && f.offsetBytes >= 0 && f.offsetBytes < 64 * MiB, `${st} fit ${JSON.stringify(f)}`);
    }
    assert.deepEqual(service.guard.model.calibration, p.calibration);
    // Predictions are the stage's line through the analytic figures.
    const m = service.guard.model;
    const shape = { queryTokens: 8, topK: 4, rerankTopN: 2, pairTokens: 64, promptTokens: 200, maxNewTokens: 8 };
    const f = p.calibration.prefill;
    assert.equal(m.predict(shape).stages.prefill, Math.ceil(f.scale * m.decoderWorkspace(1, 200, 0) + f.offsetBytes));
  });
});
