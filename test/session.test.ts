/** Execution providers: what each asks ONNX Runtime for, and what happens where one is missing. */
import assert from 'node:assert/strict';
import path from 'node:path';
import { test } from 'node:test';
import { createSession, cudaProviderPresent, sessionOptions } from '../src/backends/ort/session.js';
import { ROOT } from './helpers.js';

const MODEL = path.join(ROOT, 'models', 'embedder', 'onnx', 'model.onnx');

test('cuda without its provider library is a clear error; auto falls back to the CPU and says why', { skip: cudaProviderPresent() && 'CUDA provider installed' }, async () => {
  await assert.rejects(createSession(MODEL, 'cuda'), /libonnxruntime_providers_cuda\.so is not installed/);
  const auto = await createSession(MODEL, 'auto');
  if (auto.provider === 'cpu') {
    assert.match(auto.fallbackReason ?? '', /cuda: libonnxruntime_providers_cuda\.so/);
    assert.match(auto.fallbackReason ?? '', /webgpu: /, 'WebGPU was tried before the CPU');
  } else {
    assert.equal(auto.provider, 'webgpu'); // a host with a WebGPU adapter
  }
  await auto.session.release();
});

test('session options: device-resident outputs and the buffer cache only on WebGPU; no CPU arena on the CPU', () => {
  const extras = { deviceOutputs: ['present.0.key'], webgpuBufferCache: 'disabled' as const };
  const gpu = sessionOptions('webgpu', extras);
  assert.deepEqual(gpu.preferredOutputLocation, { 'present.0.key': 'gpu-buffer' });
  assert.deepEqual(gpu.executionProviders, [{ name: 'webgpu', storageBufferCacheMode: 'disabled' }]);
  const cpu = sessionOptions('cpu', extras);
  assert.equal(cpu.preferredOutputLocation, undefined);
  assert.deepEqual(cpu.executionProviders, ['cpu']);
  assert.equal(cpu.enableCpuMemArena, false);
  assert.equal(sessionOptions('webgpu').intraOpNumThreads, undefined, 'a CPU-only option is not passed to WebGPU');
});
