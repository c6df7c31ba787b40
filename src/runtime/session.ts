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
import type { ExecutionProvider } from '../config/config.js';

export type ConcreteProvider = Exclude<ExecutionProvider, 'auto'>;

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

function sessionOptions(provider: ConcreteProvider): ort.InferenceSession.SessionOptions {
  return {
    executionProviders: [provider],
    graphOptimizationLevel: 'all',
    // Small models: a few intra-op threads per session keep concurrent requests from fighting.
    intraOpNumThreads: provider === 'cpu' ? 0 : undefined,
  };
}

export async function createSession(modelFile: string, requested: ExecutionProvider): Promise<LoadedSession> {
  const order: ConcreteProvider[] = requested === 'auto' ? ['cuda', 'webgpu', 'cpu'] : [requested];
  const failures: string[] = [];
  for (const provider of order) {
    if (provider === 'cuda' && !cudaProviderPresent()) {
      failures.push('cuda: libonnxruntime_providers_cuda.so is not installed next to libonnxruntime');
      continue;
    }
    try {
      const session = await ort.InferenceSession.create(modelFile, sessionOptions(provider));
      return { session, provider, fallbackReason: failures.length ? failures.join('; ') : undefined };
    } catch (e) {
      failures.push(`${provider}: ${(e as Error).message.split('\n')[0]}`);
    }
  }
  throw new Error(`no execution provider could load ${modelFile}: ${failures.join('; ')}`);
}
