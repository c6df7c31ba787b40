/**
 * The CUDA encoder as the embedder and reranker run it (RAGGUARD_EMBEDDER_EP=cuda, RAGGUARD_RERANKER_EP=cuda):
 * the model directory's ONNX graph read into BERT's parameters (encoder-weights.ts), uploaded once into
 * one device allocation sized with the activations of the largest run (encoder-plan.ts), and runs of
 * padded batches on the native library (encoder.cu), behind the interface the ONNX Runtime session has
 * (EncoderRuns). The embedder's output is pooled and normalized on the device ('sentence_embedding'
 * [rows, hidden]); the reranker's is its logits ('logits' [rows, labels]).
 *
 * A call's rows are length-sorted and cut into runs of at most `maxRows` sequences and `maxTokens`
 * sequences x padded width, each padded to its own longest. Runs of one encoder go one at a time (its
 * buffers are one set); they do not take the process's run gate: they allocate nothing (the gate keeps
 * runs' workspaces from overlapping) and hold no CPU core while the device works.
 */
import path from 'node:path';
import type { EncoderBackend, EncoderDevice, EncoderOutput } from '../backend.js';
import type { LoadBytes } from '../../runtime/load-bytes.js';
import { readJson } from '../../runtime/model-dir.js';
import { RunInterrupted } from '../../runtime/errors.js';
import { metered, type RunStage } from '../../runtime/run-meter.js';
import { encoderNative, encoderUnavailable, type EncoderHandle, type EncoderNative, type EncoderNativeConfig, type EncoderNativeMemory } from './encoder-binding.js';
import { encoderShapeProblem, HEADS, outWidth, planEncoder, POOLINGS, type EncoderLimits, type EncoderPlan, type EncoderPooling, type EncoderShape } from './encoder-plan.js';
import { bertDimensions, EncoderCheckpointError, encoderTensors, graphParameters, readEncoderGraph, rerankHead, type BertConfig } from './encoder-weights.js';
import { DEFAULT_CUBLAS_WORKSPACE, CudaUnavailableError } from './cuda-runner.js';

/** RAGGUARD_CUDA_ENCODER_ROWS / _TOKENS: what one run holds (its activations are planned for it). */
export interface CudaEncoderLimits {
  maxRows?: number;
  maxTokens?: number;
  cublasWorkspaceBytes?: number;
  device?: number;
  /** The plain attention kernel instead of the tensor-core one (checks compare the two). */
  referenceAttention?: boolean;
  /** The native library (tests on the CPU hand in a stand-in); the built one by default. */
  native?: EncoderNative;
}

export interface CudaEncoderOptions extends CudaEncoderLimits {
  role: 'embedder' | 'reranker';
  /** The embedder's pooling (1_Pooling/config.json, as the CPU path detects it). */
  pooling?: EncoderPooling;
  /** The longest sequence the caller feeds (its truncation): a run must hold one. */
  maxSequence: number;
}

export const DEFAULT_ENCODER_ROWS = 128;
export const DEFAULT_ENCODER_TOKENS = 16384;

/** Output names the CPU path pools itself (embedder.ts selectOutput's per-token forms). */
const PER_TOKEN_OUTPUTS = ['last_hidden_state', 'token_embeddings'];

/** The device figures of a shape and its limits: what the native library must plan too. */
export function nativeConfig(shape: EncoderShape, limits: EncoderLimits, device = 0, referenceAttention = false): EncoderNativeConfig {
  return {
    num_layers: shape.numLayers, hidden: shape.hidden, num_heads: shape.numHeads, intermediate: shape.intermediate, vocab: shape.vocab,
    max_positions: shape.maxPositions, type_vocab: shape.typeVocab, num_labels: shape.numLabels, head: HEADS.indexOf(shape.head),
    pooling: POOLINGS.indexOf(shape.pooling), normalize: shape.normalize ? 1 : 0, act: shape.act === 'gelu' ? 0 : 1, ln_eps: shape.lnEps,
    max_rows: limits.maxRows, max_tokens: limits.maxTokens, cublas_workspace_bytes: limits.cublasWorkspaceBytes, device,
    attention: referenceAttention ? 1 : 0,
  };
}

/**
 * Runs of at most `maxRows` rows and `maxTokens` rows x width, over rows taken in order of length (each
 * run's width is its longest): index lists into `lengths`.
 */
export function splitRuns(lengths: readonly number[], maxRows: number, maxTokens: number): number[][] {
  const order = lengths.map((_, i) => i).sort((a, b) => lengths[a]! - lengths[b]! || a - b);
  const runs: number[][] = [];
  let run: number[] = [];
  for (const i of order) {
    const width = lengths[i]!;
    if (run.length > 0 && (run.length + 1 > maxRows || (run.length + 1) * width > maxTokens)) {
      runs.push(run);
      run = [];
    }
    run.push(i);
  }
  if (run.length > 0) runs.push(run);
  return runs;
}

export class CudaEncoder implements EncoderBackend, EncoderDevice {
  readonly provider = 'cuda' as const;
  readonly preallocated = true;
  readonly outputNames: readonly string[];
  readonly plan: EncoderPlan;
  /** Runs of this encoder, one at a time. */
  private tail: Promise<unknown> = Promise.resolve();
  private released = false;

  private constructor(
    private readonly native: EncoderNative,
    private readonly handle: EncoderHandle,
    readonly shape: EncoderShape,
    readonly limits: EncoderLimits,
    readonly dir: string,
  ) {
    this.outputNames = [shape.head === 'embedding' ? 'sentence_embedding' : 'logits'];
    this.plan = planEncoder(shape, limits);
  }

  /** The rows a run takes at most: the batch callers are best to hand in. */
  get preferredBatch(): number {
    return this.limits.maxRows;
  }

  /**
   * Reads the directory's config.json and ONNX graph, allocates the device memory and uploads the
   * weights. Refuses, by name: no library or GPU, a model that is not BERT, a graph whose parameters are
   * not all there (or of another shape), an embedder graph that pools itself, limits that cannot hold
   * one sequence.
   */
  static async load(dir: string, opts: CudaEncoderOptions): Promise<CudaEncoder> {
    const native = opts.native ?? encoderNative();
    const variable = opts.role === 'embedder' ? 'RAGGUARD_EMBEDDER_EP' : 'RAGGUARD_RERANKER_EP';
    if (!native) {
      throw new CudaUnavailableError(`${variable}=cuda: the CUDA encoder is unavailable: ${encoderUnavailable()}; ` +
        `run the ${opts.role} on ONNX Runtime instead (${variable}=cpu or auto)`);
    }
    const cfg = await readJson<BertConfig>(path.join(dir, 'config.json'));
    const dims = bertDimensions(cfg, dir);
    const onnx = path.join(dir, 'onnx', 'model.onnx');
    const params = graphParameters(readEncoderGraph(onnx));
    let shape: EncoderShape;
    if (opts.role === 'embedder') {
      const out = params.outputs.find((o) => PER_TOKEN_OUTPUTS.includes(o));
      if (!out) {
        throw new EncoderCheckpointError(`${dir}: the graph's outputs are [${params.outputs.join(', ')}]; the CUDA encoder pools per-token states (${PER_TOKEN_OUTPUTS.join(' or ')}) ` +
          'as 1_Pooling/config.json says, and does not run a graph that pools (or projects) itself: run this embedder on ONNX Runtime');
      }
      shape = { ...dims, numLabels: 0, head: 'embedding', pooling: opts.pooling ?? 'mean', normalize: true };
    } else {
      shape = { ...dims, ...rerankHead(params, dir), pooling: 'cls', normalize: false };
    }
    if (params.lnEps !== undefined) shape.lnEps = params.lnEps; // the graph's own, as ONNX Runtime runs it
    const problem = encoderShapeProblem(shape);
    if (problem) throw new EncoderCheckpointError(`${dir}: the CUDA encoder cannot run this model: ${problem}`);
    const limits: EncoderLimits = {
      maxRows: opts.maxRows ?? DEFAULT_ENCODER_ROWS, maxTokens: opts.maxTokens ?? DEFAULT_ENCODER_TOKENS,
      cublasWorkspaceBytes: opts.cublasWorkspaceBytes ?? DEFAULT_CUBLAS_WORKSPACE,
    };
    const longest = Math.min(opts.maxSequence, shape.maxPositions);
    if (limits.maxTokens < longest) {
      throw new Error(`RAGGUARD_CUDA_ENCODER_TOKENS ${limits.maxTokens} cannot hold one ${opts.role} input of ${longest} tokens`);
    }
    const tensors = encoderTensors(params, shape, dir);
    const config = nativeConfig(shape, limits, opts.device ?? 0, opts.referenceAttention ?? false);
    // The accountant's figures and the native allocator's must be the same numbers.
    const plan = planEncoder(shape, limits);
    const mine = [plan.weights, plan.activations, plan.cublasWorkspace, plan.hostPinned, plan.total];
    const theirs = native.plan(config);
    if (mine.some((v, i) => v !== theirs[i])) throw new Error(`CUDA encoder plan mismatch: ${mine.join(',')} vs native ${theirs.join(',')}`);
    const h = native.create(config);
    try {
      for (const { spec, values } of tensors) native.upload(h, spec.kind, spec.layer, values);
      native.loadDone(h);
    } catch (e) {
      native.destroy(h);
      throw e;
    }
    return new CudaEncoder(native, h, shape, limits, dir);
  }

  outputInfo(name: string): { type?: string; rank?: number } {
    return this.outputNames.includes(name) ? { type: 'float32', rank: 2 } : {};
  }

  /** The accountant's device figures and the device's free/total. */
  memory(): EncoderNativeMemory {
    return this.native.memory(this.handle);
  }

  /** Its exact figures (EncoderBackend): every buffer was allocated at load. */
  get device(): EncoderDevice {
    return this;
  }

  /** Device bytes allocated at load: weights, every run's activations, cuBLAS workspace (the plan's total). */
  get deviceBytes(): number {
    return this.plan.total;
  }

  /** /debug/memory's line: its device bytes by part as the native accountant allocated them, `host` among them. */
  memoryDetail(host: string): string {
    const m = this.memory();
    return `CUDA encoder (float16, ${this.shape.head} head): weights ${m.weights}, activations ${m.activations} (runs of ${this.limits.maxRows} sequences, ` +
      `${this.limits.maxTokens} tokens), cuBLAS workspace ${m.cublas_workspace} bytes on the GPU (exact), ${m.host_pinned} pinned on the host; ` +
      `${host}; the GPU has ${m.device_free} of ${m.device_total} bytes free`;
  }

  /** What the encoder holds: its device bytes (all allocated at load) and the pinned host staging. */
  loadBytes(): LoadBytes {
    return { bytes: this.plan.total + this.plan.hostPinned, hostBytes: this.plan.hostPinned, deviceBytes: this.plan.total };
  }

  /**
   * One call over token-id rows (`typeRows` their token types; zeros without), returning `output` for
   * every row in order: [rows, hidden] pooled embeddings or [rows, labels] logits. An abort of `signal`
   * stops the runs not yet started (RunInterrupted); `padId` is not needed (each run's lengths mask).
   */
  async run(stage: RunStage | undefined, output: string, rows: readonly (readonly number[])[], _padId: number,
    typeRows?: readonly (readonly number[])[], signal?: AbortSignal): Promise<EncoderOutput> {
    if (!this.outputNames.includes(output)) throw new Error(`the CUDA encoder has no output '${output}' (it has ${this.outputNames.join(', ')})`);
    if (this.released) throw new Error('the CUDA encoder was released');
    const s = this.shape, width = outWidth(s);
    rows.forEach((r, i) => {
      if (r.length < 1 || r.length > s.maxPositions || r.length > this.limits.maxTokens) throw new Error(`encoder input row ${i} has ${r.length} tokens (1 to ${Math.min(s.maxPositions, this.limits.maxTokens)})`);
      if (typeRows && typeRows[i]!.length !== r.length) throw new Error(`encoder input row ${i}: ${typeRows[i]!.length} token types for ${r.length} tokens`);
    });
    const out = new Float32Array(rows.length * width);
    for (const run of splitRuns(rows.map((r) => r.length), this.limits.maxRows, this.limits.maxTokens)) {
      if (signal?.aborted) throw new RunInterrupted(signal.reason);
      const w = rows[run[run.length - 1]!]!.length;
      const ids = new Int32Array(run.length * w), types = new Int32Array(run.length * w), lens = new Int32Array(run.length);
      run.forEach((i, r) => {
        ids.set(rows[i]!, r * w);
        if (typeRows) types.set(typeRows[i]!, r * w);
        lens[r] = rows[i]!.length;
      });
      const got = new Float32Array(run.length * width);
      const go = () => this.native.run(this.handle, ids, types, lens, run.length, w, got);
      await this.serial(() => (stage ? metered(stage, go) : go()));
      run.forEach((i, r) => out.set(got.subarray(r * width, (r + 1) * width), i * width));
    }
    return { data: out, dims: [rows.length, width] };
  }

  /** One run over [batch, tokens] dummy ids (profiling: the shape is what matters). */
  async dummyRun(batch: number, tokens: number, padId: number): Promise<void> {
    const row = Array.from({ length: tokens }, (_, i) => (i === 0 ? padId + 1 : padId + 2) % this.shape.vocab);
    await this.run(undefined, this.outputNames[0]!, Array.from({ length: batch }, () => row), padId);
  }

  /** Frees the device memory once every run begun has ended. */
  async release(): Promise<void> {
    if (this.released) return;
    this.released = true;
    await this.tail.catch(() => undefined);
    this.native.destroy(this.handle);
  }

  private serial<T>(work: () => Promise<T>): Promise<T> {
    const next = this.tail.then(work, work);
    this.tail = next.then(() => undefined, () => undefined); // the run's outputs not kept with it
    return next;
  }
}
