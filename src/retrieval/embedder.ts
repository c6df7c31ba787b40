/**
 * Text embedder: an ONNX encoder (feature-extraction export: last_hidden_state), pooled as its
 * sentence-transformers 1_Pooling/config.json says (mean by default, or the CLS token), then
 * L2-normalised so that inner product is cosine similarity.
 */
import path from 'node:path';
import type { ExecutionProvider } from '../config/config.js';
import { modelFiles, readJson, readJsonIfExists, type ModelFiles } from '../runtime/model-dir.js';
import { EncoderSession } from '../runtime/encoder-session.js';
import type { ConcreteProvider, SessionExtras } from '../runtime/session.js';
import { TextTokenizer } from '../runtime/tokenizer.js';

interface EncoderConfig {
  hidden_size: number;
  max_position_embeddings?: number;
  pad_token_id?: number;
}

interface PoolingConfig {
  pooling_mode_cls_token?: boolean;
  pooling_mode_mean_tokens?: boolean;
}

export type Pooling = 'mean' | 'cls';

/** Encodes with [CLS] ... [SEP]; over-long input keeps its first tokens and its closing special token. */
export function truncateSpecial(ids: number[], maxTokens: number): number[] {
  if (ids.length <= maxTokens) return ids;
  return [...ids.slice(0, maxTokens - 1), ids[ids.length - 1]!];
}

export class Embedder {
  private constructor(
    readonly tokenizer: TextTokenizer,
    private readonly session: EncoderSession,
    readonly files: ModelFiles,
    readonly dimension: number,
    readonly maxTokens: number,
    readonly pooling: Pooling,
    private readonly padId: number,
  ) {}

  static async load(dir: string, ep: ExecutionProvider, extras: SessionExtras = {}): Promise<Embedder> {
    const files = await modelFiles(dir);
    const cfg = await readJson<EncoderConfig>(path.join(dir, 'config.json'));
    const pool = await readJsonIfExists<PoolingConfig>(path.join(dir, '1_Pooling', 'config.json'));
    const tokenizer = await TextTokenizer.load(dir);
    const session = await EncoderSession.create(files.onnx, ep, extras);
    const modelMax = Number(tokenizer.config['model_max_length'] ?? Infinity);
    const maxTokens = Math.min(cfg.max_position_embeddings ?? 512, Number.isFinite(modelMax) ? modelMax : 512);
    const pooling: Pooling = pool?.pooling_mode_cls_token ? 'cls' : 'mean';
    return new Embedder(tokenizer, session, files, cfg.hidden_size, maxTokens, pooling, cfg.pad_token_id ?? 0);
  }

  get provider(): ConcreteProvider {
    return this.session.provider;
  }

  /** Token ids fed to the model for `text` (special tokens added, truncated to maxTokens). */
  inputIds(text: string): number[] {
    return truncateSpecial(this.tokenizer.encode(text, true), this.maxTokens);
  }

  /** Unit-length embeddings, row-major: row i is texts[i]. */
  async embed(texts: readonly string[], batchSize = 32): Promise<Float32Array> {
    const out = new Float32Array(texts.length * this.dimension);
    const rows = texts.map((t) => this.inputIds(t));
    // Length-sorted batches waste little on padding.
    const order = rows.map((_, i) => i).sort((a, b) => rows[a]!.length - rows[b]!.length);
    for (let s = 0; s < order.length; s += batchSize) {
      const idx = order.slice(s, s + batchSize);
      const vecs = await this.embedBatch(idx.map((i) => rows[i]!));
      idx.forEach((i, r) => out.set(vecs.subarray(r * this.dimension, (r + 1) * this.dimension), i * this.dimension));
    }
    return out;
  }

  /** One run over [batch, tokens] dummy ids: the start-up profile's embed stage. */
  async profileRun(batch: number, tokens: number): Promise<void> {
    await this.session.dummyRun(batch, tokens, this.padId);
  }

  private async embedBatch(rows: number[][]): Promise<Float32Array> {
    const { session } = this;
    const name = session.outputNames.includes('last_hidden_state') ? 'last_hidden_state' : session.outputNames[0]!;
    const hidden = await session.run('embed', name, rows, this.padId);
    const width = hidden.dims[1]!;
    const h = hidden.data;
    const d = this.dimension;
    const out = new Float32Array(rows.length * d);
    for (let r = 0; r < rows.length; r++) {
      const v = out.subarray(r * d, (r + 1) * d);
      if (this.pooling === 'cls') {
        v.set(h.subarray(r * width * d, r * width * d + d));
      } else {
        const n = rows[r]!.length;
        for (let t = 0; t < n; t++) {
          const base = (r * width + t) * d;
          for (let k = 0; k < d; k++) v[k]! += h[base + k]!;
        }
        for (let k = 0; k < d; k++) v[k]! /= n;
      }
      normalize(v);
    }
    return out;
  }
}

export function normalize(v: Float32Array): void {
  let s = 0;
  for (let k = 0; k < v.length; k++) s += v[k]! * v[k]!;
  const n = Math.sqrt(s);
  if (n > 0) for (let k = 0; k < v.length; k++) v[k]! /= n;
}
