/**
 * Model execution behind one interface, as vLLM's ModelRunner: the engine schedules (which sequences
 * run this step, their blocks) and a runner executes the step on its backend and says each sequence's
 * next token. The engine, scheduler, block manager and guards never learn which backend runs:
 *
 * - OrtModelRunner (backends/ort/ort-runner.ts): an ONNX decoder through ONNX Runtime (CPU, WebGPU); the
 *   KV values live in a host-side paged pool gathered into the decoder's past tensors, sampling on the host.
 * - CudaModelRunner (backends/cuda/cuda-runner.ts): the native CUDA decoder; the KV pool is one device
 *   allocation laid out by block, the kernels read the block tables, sampling on the device.
 */
import type { DecoderShape } from './decoder-shape.js';
import type { FinishReason } from './generation.js';
import type { BlockCopy } from './scheduler.js';
import type { SamplingParams, Sequence } from './sequence.js';
import type { TokenLogprobs } from './logprobs.js';

/** Text out of token ids (the decoder's tokenizer). */
export interface TokenDecoder {
  decode(ids: readonly number[]): string;
}

/** What the engine hands a runner for one step: the scheduler's plan and the sequences' block tables. */
export interface RunnerStep {
  /** Running sequences feeding one token each. */
  decodes: readonly Sequence[];
  /** Newly admitted or resumed sequences feeding their pending tokens (seq.pending, from seq.numComputed). */
  prefills: readonly Sequence[];
  /** A sequence's physical block ids in logical order. */
  blocks(seq: Sequence): ArrayLike<number>;
  /**
   * Aborted once every sequence of the step was abandoned (its client gone): nobody waits for the
   * step's results, so a runner may stop its runs then (execute rejects, and the engine finishes the
   * step's sequences, their KV discarded). Undefined where some sequence cannot be abandoned.
   */
  signal?: AbortSignal;
}

/** The engine's side of a step: what a runner reports back as results come in. */
export interface StepSink {
  /**
   * `fed` tokens of `seq` are now computed and `next` was sampled after them; says why the sequence
   * ends, if it does (the runner then calls finish once the sequence's KV is where prefix hits read it).
   */
  accept(seq: Sequence, fed: number, next: number, extras?: SampleExtras): FinishReason | undefined;
  finish(seq: Sequence, reason: FinishReason): void;
}

/** What a runner that samples on the host reports with a token, where the request asked for it. */
export interface SampleExtras {
  /** The token's logprobs (params.logprobs). */
  logprobs?: TokenLogprobs;
  /** seq.forks' first tokens, sampled from the same logits (their prompt's KV is seq's). */
  forks?: { seq: Sequence; next: number; logprobs?: TokenLogprobs }[];
}

export interface KvPoolInfo {
  /** Bytes of the KV pool (host or device), allocated up front. */
  bytes: number;
  numBlocks: number;
  blockSize: number;
  bytesPerSlot: number;
  /** Where the pool lives. */
  location: 'host' | 'device';
}

/** Counters a runner keeps of its own work (the ONNX Runtime runner's; others report none). */
export interface RunnerStats {
  /** Decode steps whose past was last step's present (no gather from the pool). */
  pastReused: number;
  /** Lazy write-backs of the carried batch's new KV into the pool (0 when every run stores its own). */
  writeBacks: number;
  /** Turns of the event loop given between slices of a step's main-thread work (pacer.ts). */
  paced: number;
  /** Past tensors made in the memory of a finished run's tensor instead of a new allocation (direct sessions). */
  spareTaken: number;
  /** Prefill runs of several sequences (right-padded to the longest), and the sequences they prefilled. */
  paddedPrefills: number;
  paddedPrefillRows: number;
}

export interface ModelRunner {
  readonly stats?: RunnerStats;
  readonly shape: DecoderShape;
  readonly eosIds: ReadonlySet<number>;
  readonly tokenizer: TokenDecoder;
  readonly pool: KvPoolInfo;
  /**
   * Whether the runner samples on the host and reports SampleExtras (logprobs, forks' first tokens);
   * a runner that samples on the device does not, and such requests are refused up front.
   */
  readonly hostSampling?: boolean;
  /** Why this runner cannot generate as asked (a sampling feature it lacks), or undefined: refused up front, never approximated. */
  refuse?(params: SamplingParams): string | undefined;
  /**
   * The step barrier: every run of the last step has completed and its buffers are released. The batch
   * shape changes only after it.
   */
  barrier(): Promise<void>;
  /**
   * Called before the scheduler may move blocks between sequences (admission, preemption): whatever KV
   * only the runner's side holds reaches the pool. Rejects when it could not: the sequences returned by
   * `abandon()` then cannot go on.
   */
  syncPool(blocks: RunnerStep['blocks']): Promise<void>;
  /** Copy-on-write copies the block manager asked for, before the step that writes them. */
  copyBlocks(copies: readonly BlockCopy[]): void;
  /** Runs one scheduled step, reporting each sequence's next token to `sink`. */
  execute(step: RunnerStep, sink: StepSink): Promise<void>;
  /**
   * Drops whatever the runner carries between steps (after a failure, or when the loop stops); returns
   * the running sequences whose newest KV was only there.
   */
  abandon(): Sequence[];
}
