/**
 * What the ONNX Runtime decoder's runs take and give (its forward pass, its KV tensors) and what its
 * runner (ort-runner.ts) and generator (generator.ts) need of it: the decoder model (decoder-model.ts)
 * implements OrtDecoder and makes its runner, so this module imports neither of them.
 */
import type { Tensor } from 'onnxruntime-node';
import type { DecoderShape, KvArray } from '../../generate/decoder-shape.js';
import type { DecoderAdapter } from '../../generate/lora-pool.js';
import type { HostTensor } from './ort-direct.js';
import type { TextTokenizer } from '../../runtime/tokenizer.js';

/**
 * A KV tensor as runs take and return it: onnxruntime-node's, or one in ONNX Runtime's own host
 * memory (a direct session's). A genai run on a direct session returns its past tensors themselves.
 */
export type KvTensor = Tensor | HostTensor;

/** One forward pass: `tokens[r]` new tokens (equal counts) on top of row r's `lengths[r]` cached ones. */
export interface ForwardInput {
  tokens: readonly (readonly number[])[];
  lengths: readonly number[];
  /**
   * A padded prefill (`paddedPrefill` models only, every length 0): row r's real tokens are the first
   * counts[r] of tokens[r], the rest padding that its mask leaves out. Its logits are those of its last
   * real token, its KV past counts[r] is the pads' (never to be stored or read). Absent: all real.
   */
  counts?: readonly number[];
  /**
   * Flat [k0, v0, k1, v1, ...] holding the rows' cached KV as `kvPlacement` lays it out in `width`
   * positions (DecoderModel.pastWidth); absent: zeroed (genai) or zero-length (optimum) tensors.
   */
  past?: readonly KvTensor[];
  width: number;
  /** Each row's LoRA adapter (undefined: the base model); absent: no row has one. */
  adapters?: readonly (DecoderAdapter | undefined)[];
  /** Stops the run (RunInterrupted) once aborted: its KV outputs are then partial, not to be kept. */
  signal?: AbortSignal;
}

export interface ForwardOutput {
  /** Logits of each row's last position, [batch, vocab]; valid until the model's next forward (they may view its output buffer). */
  lastLogits: Float32Array;
  /**
   * Each row's argmax of `lastLogits` (the first index of the largest), taken by the graph where it has
   * the greedy_ids output (gqa-builder.ts's float32 graphs); absent otherwise.
   */
  greedyIds?: readonly number[];
  /**
   * Flat [k0, v0, ...], each [batch, kv_heads, width, head_dim]; the caller disposes them (the past
   * tensors themselves where the run wrote in place). On the host, or on the device where the
   * provider keeps them there (`presentOnDevice`).
   */
  present: KvTensor[];
  /** Positions in `present`. */
  width: number;
}

/** Host present tensors' data (device-resident ones come back through DecoderModel.kvTail). */
export function presentData(present: readonly KvTensor[]): KvArray[] {
  return present.map((t) => {
    if (t.location !== 'cpu') throw new Error(`present KV is in ${t.location}: read it through kvTail`);
    return t.data as KvArray;
  });
}

/** The decoder model as its runner and generator run it (DecoderModel, decoder-model.ts). */
export interface OrtDecoder {
  readonly tokenizer: TextTokenizer;
  readonly shape: DecoderShape;
  readonly eosIds: ReadonlySet<number>;
  /** The graph takes a prefill batch right-padded to its longest row (ForwardInput.counts). */
  readonly paddedPrefill: boolean;
  /** True when present KV outputs stay in device memory between runs. */
  readonly presentOnDevice: boolean;
  /** How a batch's cached tokens sit in the past tensors: right-aligned (optimum) or left-aligned (genai). */
  readonly kvPlacement: 'right' | 'left';
  forward(input: ForwardInput): Promise<ForwardOutput>;
  /** Positions the past tensors need for rows of `lengths` cached tokens taking `newTokens` more. */
  pastWidth(lengths: readonly number[], newTokens: number): number;
  /** Whether a run's present (of `width` positions) can be the past of a run feeding `newTokens` to rows of `lengths`, as it is. */
  canExtend(width: number, lengths: readonly number[], newTokens: number): boolean;
  /** Host present tensors of a left-aligned batch copied into buffers of `newWidth` positions. */
  widen(present: readonly KvTensor[], width: number, newWidth: number): KvTensor[];
  /** Position of row token `t` (of a row holding `length` tokens) in a present tensor of `width` positions. */
  slot(width: number, length: number, t: number): number;
  /** The last `n` positions of present tensors, read back to the host. */
  kvTail(present: readonly KvTensor[], n: number): Promise<KvArray[]>;
  /** Zeroed past tensors for `rows` rows of `width` positions, a spare reused where one fits. */
  allocPastPaced(rows: number, width: number, spare: KvTensor[] | undefined, pace: () => Promise<void> | undefined): Promise<KvTensor[]>;
}
