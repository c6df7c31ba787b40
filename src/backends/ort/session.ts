/**
 * ONNX Runtime sessions on a chosen execution provider.
 *
 * onnxruntime-node 1.30 bundles the CPU and WebGPU providers; CUDA's provider library is only present
 * when it was installed next to libonnxruntime (setup skips that download). 'auto' takes the first
 * provider that creates a session, so a machine without a GPU falls back to the CPU and says so.
 */
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import * as ort from 'onnxruntime-node';
import type { ExecutionProvider, WebGpuBufferCache } from '../../config/config.js';
import { padRows } from '../../runtime/model-dir.js';
import { gatedRun } from '../../runtime/run-gate.js';
import type { ConcreteProvider } from '../backend.js';
import { countingAllocator } from './ort-allocator.js';

export interface LoadedSession {
  session: ort.InferenceSession;
  provider: ConcreteProvider;
  /** Why a requested provider was not used (auto fallback), for /healthz and the logs. */
  fallbackReason?: string;
}

/** True when onnxruntime-node's CUDA provider library sits next to libonnxruntime. */
export function cudaProviderPresent(): boolean {
  const require = createRequire(import.meta.url);
  const pkg = path.dirname(require.resolve('onnxruntime-node/package.json'));
  return existsSync(path.join(pkg, 'bin', 'napi-v6', process.platform, process.arch, 'libonnxruntime_providers_cuda.so'));
}


export interface SessionExtras {
  /** Outputs to keep in device memory where the provider has one (WebGPU's 'gpu-buffer'). */
  deviceOutputs?: readonly string[];
  /** WebGPU storage-buffer cache mode (ONNX Runtime's default when absent). */
  webgpuBufferCache?: WebGpuBufferCache;
}

/** The options every session of this server gets on `provider` (benchmarks give their peers the same). */
export function sessionOptions(provider: ConcreteProvider, extras: SessionExtras = {}): ort.InferenceSession.SessionOptions {
  const keep = provider === 'webgpu' && extras.deviceOutputs?.length ? extras.deviceOutputs : undefined;
  return {
    ...(keep ? { preferredOutputLocation: Object.fromEntries(keep.map((n) => [n, 'gpu-buffer' as const])) } : {}),
    executionProviders: [provider === 'webgpu' && extras.webgpuBufferCache
      ? { name: 'webgpu', storageBufferCacheMode: extras.webgpuBufferCache } as ort.InferenceSession.ExecutionProviderConfig
      : provider],
    graphOptimizationLevel: 'all',
    // No CPU arena: run buffers go back to malloc when a run ends. The arena would keep every peak for
    // the process's life, grown in powers of two, so that resident memory said nothing about the runs
    // in flight and the guards' accounting could not be checked against it.
    enableCpuMemArena: provider !== 'cpu',
    // No memory pattern on the CPU either: once a shape has run, ONNX Runtime plans its next run of that
    // shape into one block, whose peak was a third higher than the first run's (reranker, 16 pairs of 300
    // tokens: 62.8 MiB against 46.5), so a shape's peak depended on whether it had run before.
    ...(provider === 'cpu' ? { enableMemPattern: false } : {}),
    // ONNX Runtime's default intra-op threads on the CPU; the option is for the CPU provider only.
    ...(provider === 'cpu' ? { intraOpNumThreads: 0 } : {}),
    // Allocate through the counting allocator where it is installed (ort-allocator.ts).
    ...(provider === 'cpu' && countingAllocator() ? { extra: { session: { use_env_allocators: '1' } } } : {}),
  };
}

export async function createSession(modelFile: string, requested: ExecutionProvider, extras: SessionExtras = {}): Promise<LoadedSession> {
  const order: ConcreteProvider[] = requested === 'auto' ? ['cuda', 'webgpu', 'cpu'] : [requested];
  const failures: string[] = [];
  for (const provider of order) {
    if (provider === 'cuda' && !cudaProviderPresent()) {
      failures.push('cuda: libonnxruntime_providers_cuda.so is not installed next to libonnxruntime');
      continue;
    }
    try {
      const session = await ort.InferenceSession.create(modelFile, sessionOptions(provider, extras));
      return { session, provider, fallbackReason: failures.length ? failures.join('; ') : undefined };
    } catch (e) {
      failures.push(`${provider}: ${(e as Error).message.split('\n')[0]}`);
    }
  }
  throw new Error(`no execution provider could load ${modelFile}: ${failures.join('; ')}`);
}

/**
 * Feeds of a BERT-style encoder for the inputs its export declares (token_type_ids is optional in
 * real exports: bge-small has it, others do not). Rows are token ids, padded to one width.
 */
export function encoderFeeds(session: ort.InferenceSession, rows: readonly (readonly number[])[], padId: number,
  typeRows?: readonly (readonly number[])[]): Record<string, ort.Tensor> {
  const { ids, mask, width } = padRows(rows, padId);
  const dims = [rows.length, width];
  const feeds: Record<string, ort.Tensor> = {};
  for (const name of session.inputNames) {
    if (name === 'input_ids') feeds[name] = new ort.Tensor('int64', ids, dims);
    else if (name === 'attention_mask') feeds[name] = new ort.Tensor('int64', mask, dims);
    else if (name === 'token_type_ids') {
      feeds[name] = new ort.Tensor('int64', typeRows ? padRows(typeRows, 0).ids : new BigInt64Array(ids.length), dims);
    } else throw new Error(`encoder input '${name}' is not supported`);
  }
  return feeds;
}

/** One run of an encoder over [batch, tokens] dummy ids (profiling: the shape is what matters). */
export async function runDummyEncoder(session: ort.InferenceSession, batch: number, tokens: number, padId: number): Promise<void> {
  const row = Array.from({ length: tokens }, (_, i) => (i === 0 ? padId + 1 : padId + 2));
  const result = await gatedRun(() => session.run(encoderFeeds(session, Array.from({ length: batch }, () => row), padId)));
  for (const t of Object.values(result)) t.dispose();
}
