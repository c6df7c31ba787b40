/**
 * The profile run's calibration cache (guards/calibration-cache.ts): a second start restores what the
 * first measured; a change to what it depends on (a configuration field, a model file's bytes) makes
 * the start profile again and says why; a damaged file is ignored and rewritten. Real profile runs on
 * the test models, at small limits.
 */
import assert from 'node:assert/strict';
import { appendFile, cp, readFile, utimes, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { before, describe, test } from 'node:test';
import { CALIBRATION_FILE, keyDifferences, readCalibration, type CalibrationKey } from '../src/guards/calibration-cache.js';
import { hostMeter } from '../src/guards/peak-meter.js';
import type { CacheNote } from '../src/guards/profile.js';
import { loadModels, RagService, type Models } from '../src/service/rag.js';
import { ROOT, tempDir, testConfig } from './helpers.js';

const meter = hostMeter({ hostMeter: 'accounted' });

describe('the calibration cache across starts', { skip: !meter.available && meter.reason }, () => {
  let models: Models;
  let indexDir: string;
  let reranker: string;
  const env = () => ({
    RAGGUARD_INDEX_DIR: indexDir, RAGGUARD_CORPUS_DIR: '', RAGGUARD_RERANKER: reranker,
    RAGGUARD_PROMPT_BUDGET: '64', RAGGUARD_MAX_NEW_TOKENS_LIMIT: '16', RAGGUARD_MAX_NUM_SEQS: '4', RAGGUARD_MAX_NEW_TOKENS: '8',
  });
  /** A start on the loaded models; what the cache did. */
  const start = async (extra: Record<string, string> = {}) => {
    const s = await RagService.start(testConfig({ ...env(), ...extra }), models);
    assert.equal(s.profile.source, 'profile');
    const cache = s.profile.source === 'profile' ? s.profile.cache : undefined;
    assert.ok(cache, 'the report says what the cache did');
    return { s, cache: cache as CacheNote };
  };

  before(async () => {
    indexDir = await tempDir();
    // A copy of the reranker whose files this test may change.
    reranker = path.join(await tempDir(), 'reranker');
    await cp(path.join(ROOT, 'models', 'reranker'), reranker, { recursive: true });
    models = await loadModels(testConfig(env()));
  });

  test('stored by the first start, restored by the next, kept across a touch, measured again when a model file or a setting changes', async () => {
    const first = await start();
    assert.equal(first.cache.restored, false);
    assert.equal(first.cache.why, 'no cached calibration');
    assert.equal(first.cache.file, path.join(indexDir, CALIBRATION_FILE));

    const second = await start();
    assert.equal(second.cache.restored, true, JSON.stringify(second.cache));
    assert.equal(typeof second.cache.written_at, 'string');
    assert.deepEqual(second.s.guard.model.calibration, first.s.guard.model.calibration, 'the same calibration, restored');
    assert.equal(second.s.guard.model.headroom, first.s.guard.model.headroom);
    assert.equal(second.s.profileProgress, undefined, 'no model run measured');

    // The key is the files' content: a new modification time alone (a copy, a fresh pull) keeps it.
    const tokenizerConfig = path.join(reranker, 'tokenizer_config.json');
    await utimes(tokenizerConfig, new Date(), new Date(Date.now() + 60_000));
    assert.equal((await start()).cache.restored, true);

    await appendFile(tokenizerConfig, '\n');
    const changed = await start();
    assert.equal(changed.cache.restored, false);
    assert.equal(changed.cache.why, 'changed since it was measured: models.reranker');
    assert.equal((await start()).cache.restored, true, 'stored again under the new key');

    const seqs = await start({ RAGGUARD_MAX_NUM_SEQS: '3' });
    assert.equal(seqs.cache.restored, false);
    assert.match(seqs.cache.why ?? '', /config\.maxNumSeqs/);
    const spin = await start({ RAGGUARD_MAX_NUM_SEQS: '3', RAGGUARD_INTRA_OP_SPIN: 'off' });
    assert.equal(spin.cache.why, 'changed since it was measured: config.intraOpSpin');
  });

  test('a damaged file is ignored (said so) and replaced by a good one', async () => {
    const file = path.join(indexDir, CALIBRATION_FILE);
    await writeFile(file, '{"format": 1, "key": ');
    const damaged = await start();
    assert.equal(damaged.cache.restored, false);
    assert.equal(damaged.cache.damaged, true);
    assert.match(damaged.cache.why ?? '', /not valid JSON/);
    assert.equal(JSON.parse(await readFile(file, 'utf8')).format, 1, 'rewritten whole');
    assert.equal((await start()).cache.restored, true);
  });

  test('RAGGUARD_CALIBRATION_CACHE=false: every start profiles, nothing is read', async () => {
    const s = await RagService.start(testConfig({ ...env(), RAGGUARD_CALIBRATION_CACHE: 'false' }), models);
    assert.equal(s.profile.source === 'profile' && s.profile.cache, undefined);
    assert.ok((s.profileProgress?.done ?? 0) > 0, 'model runs measured');
  });
});

test('a file that is JSON but not a calibration is damaged; one under another key names what changed', async () => {
  const dir = await tempDir();
  const file = path.join(dir, CALIBRATION_FILE);
  const key = { format: 1, models: { decoder: { 'model.onnx': '1:a' } }, config: { maxNumSeqs: 4 }, cpu: { model: 'x', flags: 'avx', threads: 2 } } as unknown as CalibrationKey;
  await writeFile(file, JSON.stringify({ format: 1, written_at: 'now', key, report: { source: 'profile', calibration: {}, headroom: 0, points: [] } }));
  const bad = await readCalibration(file, key);
  assert.equal(bad.hit, false);
  assert.equal(!bad.hit && bad.damaged, true);
  assert.equal((await readCalibration(path.join(dir, 'none.json'), key)).hit, false);

  const other = { ...key, models: { decoder: { 'model.onnx': '1:b' } }, cpu: { model: 'y', flags: 'avx', threads: 2 } } as unknown as CalibrationKey;
  assert.deepEqual(keyDifferences(key, other), ['models.decoder', 'cpu']);
  assert.deepEqual(keyDifferences(key, key), []);
});
