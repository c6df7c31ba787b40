/**
 * The memory model: bytes a request needs, from the model configs and the request's shape, in the
 * plain explicit way of llama.cpp's accounting. Two kinds of memory:
 *   KV       lives in the block pool: blocks(prompt + new tokens) x block bytes;
 *   workspace  transient buffers of one model run: inputs, activations, outputs. A request's
 *            workspace peak is its largest stage: embedding the query, reranking its candidates
 *            (batches of pairs), prefilling its prompt, or one decode step over its whole context.
 * LoRA adapters' weights are neither: they live in slots allocated at start-up (lora-pool.ts), fixed bytes
 * the budget sets aside like the KV pool; a request's runs add only their rows gathered from them.
 * fp32 activations (what the CPU path runs). Figures are upper-bound sums of the buffers each op
 * produces in a layer, since a runtime keeps a layer's intermediates alive until the layer ends.
 */

import { bufferCapacity, dtypeBytes, kvBytesPerToken, type KvDtype } from '../generate/decoder-shape.js';
import type { DecoderMemoryLayout, EncoderDims } from '../backends/backend.js';
import { loraSlots, slotCapacity } from '../generate/lora.js';


/**
 * The decoder as the memory model sizes it: its shape, and what its backend says of its runs
 * (DecoderBackend.memoryLayout: KV layout, in-place runs, LoRA path, preallocated), never its class.
 */
export interface DecoderDims extends DecoderMemoryLayout {
  numLayers: number;
  hiddenSize: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  intermediateSize: number;
  vocabSize: number;
  /** The decoder's KV and activation type; float32 when absent. */
  kvDtype?: KvDtype;
  /** Positions the model takes at most (bounds a genai buffer's capacity). */
  maxPositions?: number;
}

/** A request as the guards see it, after prompt assembly. */
export interface RequestShape {
  queryTokens: number;
  /** Candidates retrieved (and reranked, after pruning: at most this many pairs). */
  topK: number;
  rerankTopN: number;
  /** Tokens of one (query, passage) pair fed to the reranker. */
  pairTokens: number;
  /** Pairs per reranker run (the model's default batch when absent; a reshape may lower it). */
  rerankBatch?: number;
  /**
   * As run: each reranker run's [pairs, width] (a batch pads to its own longest pair). When given, the
   * rerank stage is its largest run, not rerankBatch pairs of pairTokens (the worst case as asked).
   */
  rerankRuns?: readonly (readonly [number, number])[];
  promptTokens: number;
  maxNewTokens: number;
  /**
   * Samples of the prompt (OpenAI's n; 1 when absent): they share the prompt's full blocks (forked, the
   * engine) and each decodes as a row of its own, with its own new tokens' KV.
   */
  samples?: number;
  /** Prompt tokens already in the prefix cache: prefill computes only the rest (as run; 0 when asked). */
  cachedTokens?: number;
}

export type Stage = 'embed' | 'rerank' | 'prefill' | 'decode';

export interface Prediction {
  kvBlocks: number;
  kvBytes: number;
  workspaceBytes: number;
  /** What the guard reserves: the workspace plus the profile's headroom for run-to-run scatter. */
  reserveBytes: number;
  /** The stage whose workspace is the peak. */
  peakStage: Stage;
  stages: Record<Stage, number>;
}

const F32 = 4;

export const STAGES: readonly Stage[] = ['embed', 'rerank', 'prefill', 'decode'];

/** A run's shape: [batch or rows, tokens fed, context tokens]. */
export type RunShape = [number, number, number];

/**
 * A stage's measured bytes as a line in its analytic bytes, fitted by the start-up profile run: the
 * scale corrects the per-buffer sums, the offset is what every run holds whatever its shape
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
  private headroomFraction = 0;

  constructor(
    readonly encoder: EncoderDims,
    readonly decoder: DecoderDims,
    readonly blockSize: number,
    /** Pairs per reranker run (the reranker scores in batches). */
    readonly rerankBatch = 16,
    /**
     * Encoder stages whose runs allocate nothing: the CUDA encoder's buffers are all allocated at load,
     * counted with its weights (as `preallocated` is for the decoder).
     */
    readonly preallocated: Partial<Record<'embed' | 'rerank', boolean>> = {},
  ) {}

  get calibration(): Readonly<Calibration> {
    return this.fits;
  }

  /** The reservation's margin over the prediction (a fraction), from the profile run's scatter. */
  get headroom(): number {
    return this.headroomFraction;
  }

  /**
   * Adopts the profile run's fits (predictions are the fitted lines from now on) and its headroom: the
   * largest amount by which a profiled run exceeded its fitted prediction, which the guard reserves on
   * top, since the same shape's peak scatters from run to run.
   */
  calibrate(fits: Calibration, headroom = 0): void {
    this.fits = { ...fits };
    this.headroomFraction = headroom;
  }

  /** A stage's predicted bytes for a run of this shape (0 for a run that feeds nothing). */
  stageBytes(stage: Stage, shape: RunShape): number {
    if (shape[0] === 0 || shape[1] === 0) return 0;
    const f = this.fits[stage];
    return Math.ceil(f.scale * this.analytic(stage, shape) + f.offsetBytes);
  }

  /** The analytic bytes of a stage's run. */
  analytic(stage: Stage, [b, s, c]: RunShape): number {
    if (stage === 'embed' || stage === 'rerank') return this.preallocated[stage] ? 0 : this.encoderWorkspace(b, s);
    return this.decoderWorkspace(b, s, c);
  }

  private get actBytes(): number {
    return dtypeBytes(this.decoder.kvDtype);
  }

  private encoderScores(batch: number, seq: number): number {
    return batch * this.encoder.numHeads * seq * seq * F32 * 2;
  }

  private decoderScores(rows: number, newTokens: number, context: number): number {
    return 2 * rows * this.decoder.numHeads * newTokens * (context + newTokens) * this.actBytes;
  }

  /** The decoder's buffers that scale with the tokens fed, not the context: MLP, ids, logits of `logitPositions` per row. */
  private decoderPerNewToken(rows: number, newTokens: number, logitPositions: number): number {
    const d = this.decoder;
    return rows * newTokens * ((4 * d.hiddenSize + 3 * d.intermediateSize) * this.actBytes + 2 * 8) + rows * logitPositions * d.vocabSize * this.actBytes;
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
    const layer = tokens * (6 * e.hiddenSize + e.intermediateSize) * F32 + this.encoderScores(batch, seq);
    const output = tokens * e.hiddenSize * F32;
    return inputs + layer + output;
  }

  /**
   * One decoder run of `rows` rows, `newTokens` each, over `context` cached tokens.
   *   optimum: the past fed in, the present returned (context + new), one layer's keys/values repeated
   *            to all query heads (the export materialises it), scores and their softmax, MLP
   *            activations and every position's logits.
   *   genai:   the past buffer (its capacity; twice where the run hands back a copy of it), the
   *            activations of the tokens fed (projections, MLP), the last position's logits. Its
   *            attention holds no [new, context] score matrix: measured peaks grow linearly with the
   *            prompt (6.4, 13.0, 26.0, 32.4 MiB for 250 to 1500 tokens on the shipped decoder).
   */
  decoderWorkspace(rows: number, newTokens: number, context: number): number {
    const d = this.decoder;
    if (d.preallocated) return 0;
    const total = context + newTokens;
    const mask = rows * total * 8;
    if (d.kvLayout === 'genai') {
      const capacity = bufferCapacity(total, d.maxPositions ?? total);
      const buffers = (d.kvInPlace ? 1 : 2) * rows * capacity * this.kvBytesPerToken;
      const qkv = rows * newTokens * (d.numHeads + 2 * d.numKvHeads) * d.headDim * this.actBytes;
      // The LoRA path's output, [rows, new, out] of the projection being added to (the widest: MLP's or qkv's).
      const lora = d.lora ? rows * newTokens * Math.max(d.intermediateSize, (d.numHeads + 2 * d.numKvHeads) * d.headDim) * this.actBytes : 0;
      return buffers + mask + qkv + lora + this.decoderPerNewToken(rows, newTokens, 1);
    }
    const past = rows * context * this.kvBytesPerToken;
    const present = rows * total * this.kvBytesPerToken;
    const repeated = 2 * rows * d.numHeads * total * d.headDim * this.actBytes;
    return past + present + repeated + mask + this.decoderScores(rows, newTokens, context) + this.decoderPerNewToken(rows, newTokens, newTokens);
  }

  /**
   * What adapters add to a decoder run of `rows` rows feeding `newTokens` each, where they can run: the
   * rows' entries of A and B gathered for one projection at a time ([rows, in, capacity] and [rows,
   * capacity, out], the widest projection's) and the low-rank activations [rows, new, capacity]. Every
   * request counts it, with or without an adapter: a base-model row in a batch with adapters gathers
   * zeros too. Exact sizes, outside the fit: the profile run runs no adapter. The adapters' weights are
   * the slots', allocated at start-up (lora-pool.ts), not a request's. One projection's, not every
   * layer's: the graph ties each layer's gathers to the layer's input (gqa-builder.ts), so they run with
   * the layer and are released after it (before that, adapter runs of the 1.5B measured ~28 MiB over this).
   */
  loraRows(rows: number, newTokens: number): number {
    const r = this.decoder.loraMaxRank ?? 0;
    if (r === 0 || newTokens <= 0 || this.decoder.preallocated) return 0;
    // One layer's slots: every layer's are the same shapes.
    const slots = loraSlots({ ...this.decoder, numLayers: 1 });
    const widest = Math.max(...slots.map((s) => (s.inDim + s.outDim) * slotCapacity(s, r)));
    const capacity = Math.max(...slots.map((s) => slotCapacity(s, r)));
    return rows * (widest + newTokens * capacity) * this.actBytes;
  }

  /**
   * genai layout: a decode step that changes its buffer (the batch outgrew it and is widened, or the
   * batch changed and is gathered into a new one) runs while the last step's buffer, at most as large,
   * is still held (it is released at the step barrier, after the run). The profile run's single runs
   * never see it, so it stays outside the fit: measured decode peaks were twice the fitted buffer.
   */
  replacedBuffer(rows: number, tokens: number): number {
    const d = this.decoder;
    return d.kvLayout === 'genai' && !d.preallocated ? rows * bufferCapacity(tokens, d.maxPositions ?? tokens) * this.kvBytesPerToken : 0;
  }

  predict(r: RequestShape): Prediction {
    const tokens = r.promptTokens + r.maxNewTokens;
    const n = r.samples ?? 1;
    const cached = r.cachedTokens ?? 0;
    const stages: Record<Stage, number> = {
      embed: this.stageBytes('embed', [1, r.queryTokens, 0]),
      rerank: r.rerankRuns?.length
        ? Math.max(...r.rerankRuns.map(([pairs, width]) => this.stageBytes('rerank', [pairs, width, 0])))
        : this.stageBytes('rerank', [Math.min(r.rerankBatch ?? this.rerankBatch, r.topK), r.pairTokens, 0]),
      prefill: this.stageBytes('prefill', [1, r.promptTokens - cached, cached]) + this.loraRows(1, r.promptTokens - cached),
      decode: this.stageBytes('decode', [n, 1, tokens - 1]) + this.loraRows(n, 1) + this.replacedBuffer(n, tokens),
    };
    const peakStage = (Object.keys(stages) as Stage[]).reduce((a, b) => (stages[b] > stages[a] ? b : a));
    // The prompt's full blocks once; each sample its partly filled last prompt block (copied on write) onwards.
    const shared = Math.floor(r.promptTokens / this.blockSize);
    const kvBlocks = shared + n * (this.kvBlocks(tokens) - shared);
    const workspaceBytes = stages[peakStage];
    return {
      kvBlocks, kvBytes: kvBlocks * this.blockSize * this.kvBytesPerToken, workspaceBytes,
      reserveBytes: Math.ceil(workspaceBytes * (1 + this.headroomFraction)), peakStage, stages,
    };
  }
}
