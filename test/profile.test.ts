/** The start-up profile run and what it measures with: the peak meter, the fit, the calibration. */
import assert from 'node:assert/strict';
import { before, describe, test } from 'node:test';
import { STAGES } from '../src/guards/memory-model.js';
import { measurePeak, peakMeter } from '../src/guards/peak-meter.js';
import { fitScale } from '../src/guards/profile.js';
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

test('fitScale is the least-squares ratio, exact for proportional points', () => {
  assert.equal(fitScale([{ analytic_bytes: 10, measured_bytes: 12 }, { analytic_bytes: 100, measured_bytes: 120 }]), 1.2);
  assert.equal(fitScale([]), 1);
  // Large shapes weigh most: the ratio follows the big point.
  const k = fitScale([{ analytic_bytes: 1, measured_bytes: 3 }, { analytic_bytes: 1000, measured_bytes: 1000 }]);
  assert.ok(k > 1 && k < 1.01);
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
    assert.deepEqual(prefill.shape, [1, 256, 0], 'prefill profiled at the prompt budget');
    const decode = p.points.find((pt) => pt.stage === 'decode')!;
    assert.equal(decode.shape[0], service.cfg.maxNumSeqs, 'decode profiled at max_num_seqs rows');
    for (const pt of p.points.filter((x) => x.stage !== 'embed')) assert.ok(pt.measured_bytes > 0, `${pt.stage} ${pt.shape} measured`);
    for (const st of STAGES) assert.ok(p.scales[st] > 0.2 && p.scales[st] < 5, `${st} scale ${p.scales[st]}`);
    assert.deepEqual(service.guard.model.scales, p.scales);
    // Predictions are the analytic figures times the stage's scale.
    const m = service.guard.model;
    const shape = { queryTokens: 8, topK: 4, rerankTopN: 2, pairTokens: 64, promptTokens: 200, maxNewTokens: 8 };
    assert.equal(m.predict(shape).stages.prefill, Math.ceil(p.scales.prefill * m.decoderWorkspace(1, 200, 0)));
  });
});
