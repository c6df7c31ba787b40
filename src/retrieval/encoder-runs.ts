/**
 * Where an encoder (the embedder, the reranker) runs its model: the native CUDA encoder for 'cuda'
 * (RAGGUARD_EMBEDDER_EP / RAGGUARD_RERANKER_EP), else an ONNX Runtime session on the provider asked for.
 * ONNX Runtime is imported only then: the CUDA path runs where onnxruntime-node is absent (the GPU host's
 * checks and benchmarks carry only the CUDA path's packages).
 */
import type { ExecutionProvider } from '../config/config.js';
import { CudaEncoder, type CudaEncoderLimits } from '../backends/cuda/encoder-runner.js';
import type { EncoderPooling } from '../backends/cuda/encoder-plan.js';
import type { EncoderBackend } from '../backends/backend.js';
import type { SessionExtras } from '../backends/ort/session.js';
import { TokenizerPool } from '../runtime/tokenizer-pool.js';

/**
 * Load options: ONNX Runtime's session extras; the CUDA encoder's limits (RAGGUARD_CUDA_ENCODER_*) and
 * the threads that tokenize for it (RAGGUARD_TOKENIZER_THREADS, resolved).
 */
export type EncoderLoadExtras = SessionExtras & { cuda?: CudaEncoderLimits; tokenizerThreads?: number };

/**
 * The tokenizer threads of an encoder on the CUDA encoder (none on ONNX Runtime, whose runs use the
 * cores): started with the model, so that its load measures them.
 */
export async function tokenizerPool(dir: string, ep: ExecutionProvider, extras: EncoderLoadExtras): Promise<TokenizerPool | undefined> {
  const n = ep === 'cuda' ? extras.tokenizerThreads ?? 0 : 0;
  return n > 0 ? TokenizerPool.start(dir, n) : undefined;
}

/** Inputs below this many are tokenized on the main thread: a message to the threads costs more. */
export const POOL_MIN_INPUTS = 8;

/**
 * The model's runs, behind EncoderBackend (all the embedder and the reranker use). `cuda`: what the CUDA
 * encoder needs besides its limits: the role, its longest input (its truncation) and, for the embedder,
 * its pooling.
 */
export async function encoderRuns(dir: string, onnx: string, ep: ExecutionProvider, extras: EncoderLoadExtras,
  cuda: { role: 'embedder' | 'reranker'; maxSequence: number; pooling?: EncoderPooling }): Promise<EncoderBackend> {
  if (ep === 'cuda') return CudaEncoder.load(dir, { ...extras.cuda, ...cuda });
  const { EncoderSession } = await import('../backends/ort/encoder-session.js');
  return EncoderSession.create(onnx, ep, extras);
}
