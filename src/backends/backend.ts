/**
 * What every backend offers the layers above it, as vLLM's platforms and workers do: the service's
 * wiring (service/bootstrap.ts), the guard's memory model and the memory dashboard reach a decoder or an
 * encoder through these interfaces alone, never by its class.
 *
 *   DecoderBackend  the ONNX Runtime decoder (ort/decoder-model.ts, DecoderModel) and the native CUDA
 *                   decoder (cuda/cuda-decoder.ts, CudaDecoder): what it holds (planned or measured),
 *                   the runner it creates for a KV pool, what the memory model must know of its runs,
 *                   its profile run, and how it describes itself (/healthz, /debug/memory).
 *   EncoderBackend  what the embedder and the reranker run their model through (EncoderRuns): an ONNX
 *                   Runtime session (ort/encoder-session.ts) or the native CUDA encoder
 *                   (cuda/encoder-runner.ts), the latter with its exact device figures (`device`).
 *
 * And what both sides of these interfaces name: the provider a model runs on (ConcreteProvider), an
 * encoder's output and its layer dimensions. A run stopped by its signal ends with runtime/errors.ts's
 * RunInterrupted, whichever backend ran it.
 *
 * This module imports neither backend: ort/ and cuda/ are siblings that import it, not each other.
 */
import type { AdapterHost } from '../generate/adapters.js';
import type { DecoderShape, KvLayout } from '../generate/decoder-shape.js';
import type { ExecutionProvider } from '../config/config.js';
import type { ModelRunner } from '../generate/model-runner.js';
import type { LoadBytes } from '../runtime/load-bytes.js';
import type { RunStage } from '../runtime/run-meter.js';
import type { TextTokenizer } from '../runtime/tokenizer.js';

/** The execution provider a model runs on: the one asked for, or the one 'auto' found. */
export type ConcreteProvider = Exclude<ExecutionProvider, 'auto'>;

/** How a decoder runs, for /healthz and the start-up log: its KV layout and run path (and why not a faster one). */
export interface DecoderRuntime {
  layout: string;
  run_path: string;
  run_path_reason?: string;
}

/**
 * What the guard's memory model must know of a decoder's runs besides its shape (guards/memory-model.ts
 * DecoderDims): each field absent where it does not apply.
 */
export interface DecoderMemoryLayout {
  /** How the decoder's graph takes its KV cache; 'optimum' when absent. */
  kvLayout?: KvLayout;
  /** genai runs write the KV buffer in place and hand nothing back (the direct C-API path). */
  kvInPlace?: boolean;
  /** Every projection has a LoRA path (lora.ts): its output, zeros without an adapter, is one more buffer. */
  lora?: boolean;
  /** Adapters can run (their slots exist): the modules' largest rank, RAGGUARD_MAX_LORA_RANK. */
  loraMaxRank?: number;
  /**
   * Every buffer of the decoder's runs is allocated at start-up and counted there (the CUDA backend: its
   * activation workspace is sized from max_num_batched_tokens): a request's decoder runs add nothing.
   */
  preallocated?: boolean;
}

/** What /debug/memory says of a model's bytes: measured when it loaded, or exact from its own accountant. */
export interface MemoryDetail {
  how: 'measured' | 'exact';
  detail: string;
}

export interface DecoderBackend extends AdapterHost {
  readonly provider: ConcreteProvider;
  readonly tokenizer: TextTokenizer;
  readonly shape: DecoderShape;
  readonly bosId: number | undefined;
  /** KV bytes one token occupies across all layers (keys and values), as this backend stores it. */
  readonly kvBytesPerToken: number;
  /**
   * Every byte of its runs is allocated at start-up (the CUDA decoder): a run adds nothing the guard
   * must predict, and the start-up profile has nothing to measure (profileRun resolves at once).
   */
  readonly preallocated: boolean;
  /** Its KV layout and run path. */
  runtime(): DecoderRuntime;
  /** What the memory model must know of its runs; `loraMaxRank`: the adapters' largest rank where adapters run, else 0. */
  memoryLayout(loraMaxRank: number): DecoderMemoryLayout;
  /**
   * What it holds besides the KV pool before a runner exists, where it plans that exactly (the CUDA
   * decoder's plan); undefined where its load was measured (ONNX Runtime).
   */
  plannedLoadBytes(): LoadBytes | undefined;
  /** The runner over a KV pool of `numBlocks` blocks of `blockSize` tokens (the CUDA decoder allocates it now). */
  createRunner(numBlocks: number, blockSize: number): ModelRunner;
  /**
   * What `runner` (one this decoder created) holds besides its KV pool and LoRA slots, as the backend's
   * own accountant counts it; undefined where the load was measured.
   */
  runnerLoadBytes(runner: ModelRunner): LoadBytes | undefined;
  /** /debug/memory's line for the decoder running `runner`; `loaded`: what its measured load added, in words. */
  memoryDetail(runner: ModelRunner, loaded: string): MemoryDetail;
  /** One run of `rows` rows, `newTokens` each, over `context` past tokens: the start-up profile's prefill and decode stages. */
  profileRun(rows: number, newTokens: number, context: number): Promise<void>;
}

/** An encoder whose every buffer is allocated at load (the CUDA encoder): its figures are exact. */
export interface EncoderDevice {
  /** Device bytes allocated at load: weights, every run's activations, workspaces (its plan's total). */
  readonly deviceBytes: number;
  /** /debug/memory's line for it now; `host`: what its load added on the host and its files, in words. */
  memoryDetail(host: string): string;
}

export interface EncoderBackend extends EncoderRuns {
  /** Its exact device figures, where every buffer was allocated at load; absent where its load is measured (ONNX Runtime). */
  readonly device?: EncoderDevice;
}

export interface EncoderOutput {
  data: Float32Array;
  dims: number[];
}

/**
 * What the embedder and the reranker run their model through: an ONNX Runtime session
 * (ort/encoder-session.ts, EncoderSession), or the native CUDA encoder (cuda/encoder-runner.ts), which
 * computes the same outputs.
 */
export interface EncoderRuns {
  readonly provider: ConcreteProvider;
  /**
   * Every buffer of a run is allocated when the model loads (the CUDA encoder): its runs add nothing that
   * the guard must predict, and the start-up profile has nothing to measure.
   */
  readonly preallocated: boolean;
  /** Rows a run takes best (the CUDA encoder's limit); callers batch by their own default without. */
  readonly preferredBatch?: number;
  readonly outputNames: readonly string[];
  outputInfo(name: string): { type?: string; rank?: number };
  run(stage: RunStage | undefined, output: string, rows: readonly (readonly number[])[], padId: number,
    typeRows?: readonly (readonly number[])[], signal?: AbortSignal): Promise<EncoderOutput>;
  dummyRun(batch: number, tokens: number, padId: number): Promise<void>;
  release(): Promise<void>;
}

/** An encoder's layer dimensions (embedder, reranker), from which the memory model sizes its runs. */
export interface EncoderDims {
  numLayers: number;
  hiddenSize: number;
  numHeads: number;
  intermediateSize: number;
}
