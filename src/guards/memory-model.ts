/**
 * The memory model: bytes a request needs, from the model configs and the request's shape, in the
 * plain explicit way of llama.cpp's accounting. Two kinds of memory:
 *   KV       lives in the block pool: blocks(prompt + new tokens) x block bytes;
 *   workspace  transient buffers of one model run: inputs, activations, outputs. A request's
 *            workspace peak is its largest stage: embedding the query, reranking its candidates
 *            (batches of pairs), prefilling its prompt, or one decode step over its whole context.
 * fp32 activations (what the CPU path runs). Figures are upper-bound sums of the buffers each op
 * produces in a layer, since a runtime keeps a layer's intermediates alive until the layer ends.
 */

import { kvBytesPerToken } from '../generate/kv-pool.js';

export interface EncoderDims {
  numLayers: number;
  hiddenSize: number;
  numHeads: number;
  intermediateSize: number;
}

export interface DecoderDims {
  numLayers: number;
  hiddenSize: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  intermediateSize: number;
  vocabSize: number;
}

/** A request as the guards see it, after prompt assembly. */
export interface RequestShape {
  queryTokens: number;
  /** Candidates retrieved (and reranked, after pruning: at most this many pairs). */
  topK: number;
  rerankTopN: number;
  /** Tokens of one (query, passage) pair fed to the reranker. */
  pairTokens: number;
  promptTokens: number;
  maxNewTokens: number;
  /** Prompt tokens already in the prefix cache: prefill computes only the rest (as run; 0 when asked). */
  cachedTokens?: number;
}

export type Stage = 'embed' | 'rerank' | 'prefill' | 'decode';

export interface Prediction {
  kvBlocks: number;
  kvBytes: number;
  workspaceBytes: number;
  /** The stage whose workspace is the peak. */
  peakStage: Stage;
  stages: Record<Stage, number>;
}

const F32 = 4;

export const STAGES: readonly Stage[] = ['embed', 'rerank', 'prefill', 'decode'];

/**
 * A stage's measured bytes as a line in its analytic bytes, fitted by the start-up profile run:
 * the scale corrects the per-buffer sums, the offset is what every run holds whatever its shape
 * (thread-local scratch, the runtime's per-run state).
 */
export interface StageFit {
  scale: number;
  offsetBytes: number;
}
export type Calibration = Record<Stage, StageFit>;

const ANALYTIC: StageFit = { scale: 1, offsetBytes: 0 };

export class MemoryModel {
  private fits: Calibration = { embed: ANALYTIC, rerank: ANALYTIC, prefill: ANALYTIC, decode: ANALYTIC };

  constructor(
    readonly encoder: EncoderDims,
    readonly decoder: DecoderDims,
    readonly blockSize: number,
    /** Pairs per reranker run (the reranker scores in batches). */
    readonly rerankBatch = 16,
  ) {}

  get calibration(): Readonly<Calibration> {
    return this.fits;
  }

  /** Adopts the profile run's fits: predictions are scale x analytic + offset from now on. */
  calibrate(fits: Calibration): void {
    this.fits = { ...fits };
  }

  /** A stage's predicted bytes from its analytic bytes (0 stays 0: a stage that does not run). */
  private calibrated(stage: Stage, analytic: number): number {
    const f = this.fits[stage];
    return analytic === 0 ? 0 : Math.ceil(f.scale * analytic + f.offsetBytes);
  }

  get kvBytesPerToken(): number {
    return kvBytesPerToken(this.decoder);
  }

  kvBlocks(tokens: number): number {
    return Math.ceil(tokens / this.blockSize);
  }

  /** One encoder run over [batch, seq]: ids and mask, a layer's activations and attention scores, the output. */
  encoderWorkspace(batch: number, seq: number): number {
    const e = this.encoder;
    const tokens = batch * seq;
    const inputs = 3 * tokens * 8; // int64 ids, mask, token types
    const layer = tokens * (6 * e.hiddenSize + e.intermediateSize) * F32 + batch * e.numHeads * seq * seq * F32 * 2;
    const output = tokens * e.hiddenSize * F32;
    return inputs + layer + output;
  }

  /**
   * One decoder run of `rows` rows, `newTokens` each, over `context` cached tokens: the past fed in,
   * the present returned (context + new), one layer's keys/values repeated to all query heads (GQA
   * exports materialise it), scores, MLP activations, and the logits.
   */
  decoderWorkspace(rows: number, newTokens: number, context: number): number {
    const d = this.decoder;
    const total = context + newTokens;
    const past = rows * context * this.kvBytesPerToken;
    const present = rows * total * this.kvBytesPerToken;
    const repeated = 2 * rows * d.numHeads * total * d.headDim * F32;
    const scores = 2 * rows * d.numHeads * newTokens * total * F32;
    const mlp = rows * newTokens * (4 * d.hiddenSize + 3 * d.intermediateSize) * F32;
    const logits = rows * newTokens * d.vocabSize * F32;
    const inputs = rows * (2 * newTokens + total) * 8;
    return past + present + repeated + scores + mlp + logits + inputs;
  }

  predict(r: RequestShape): Prediction {
    const tokens = r.promptTokens + r.maxNewTokens;
    const stages: Record<Stage, number> = {
      embed: this.calibrated('embed', this.encoderWorkspace(1, r.queryTokens)),
      rerank: r.topK === 0 ? 0 : this.calibrated('rerank', this.encoderWorkspace(Math.min(this.rerankBatch, r.topK), r.pairTokens)),
      prefill: this.calibrated('prefill', this.decoderWorkspace(1, r.promptTokens - (r.cachedTokens ?? 0), r.cachedTokens ?? 0)),
      decode: this.calibrated('decode', this.decoderWorkspace(1, 1, tokens - 1)),
    };
    const peakStage = (Object.keys(stages) as Stage[]).reduce((a, b) => (stages[b] > stages[a] ? b : a));
    const kvBlocks = this.kvBlocks(tokens);
    return { kvBlocks, kvBytes: kvBlocks * this.blockSize * this.kvBytesPerToken, workspaceBytes: stages[peakStage], peakStage, stages };
  }
}
