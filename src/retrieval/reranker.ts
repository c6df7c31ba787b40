/**
 * Cross-encoder reranker: scores (query, passage) pairs jointly ([CLS] q [SEP] p [SEP]) with one
 * logit each, the layout of a bge-reranker / BertForSequenceClassification export. With
 * RAGGUARD_RERANKER_EP=cuda a BERT cross-encoder runs on the native CUDA encoder (backends/cuda/encoder-runner.ts).
 */
import path from 'node:path';
import type { ExecutionProvider } from '../config/config.js';
import type { ConcreteProvider, EncoderBackend, EncoderDevice, EncoderDims } from '../backends/backend.js';
import { modelFiles, readJson, type ModelFiles } from '../runtime/model-dir.js';
import type { TokenizerPool } from '../runtime/tokenizer-pool.js';
import { encoderRuns, POOL_MIN_INPUTS, tokenizerPool, type EncoderLoadExtras } from './encoder-runs.js';
import { TextTokenizer, type PairEncoding } from '../runtime/tokenizer.js';

interface EncoderConfig {
  num_hidden_layers: number;
  hidden_size: number;
  num_attention_heads: number;
  intermediate_size: number;
  max_position_embeddings?: number;
  pad_token_id?: number;
}

/**
 * A logit as a relevance score in (0, 1): the sigmoid, as vLLM scores a one-label cross-encoder and as
 * Cohere's and Jina's rerank APIs report relevance. The order is the logits' order.
 */
export function relevance(logit: number): number {
  return 1 / (1 + Math.exp(-logit));
}

/** Pairs scored per model run. */
export const RERANK_BATCH = 16;

export class Reranker {
  private constructor(
    readonly tokenizer: TextTokenizer,
    private readonly session: EncoderBackend,
    readonly files: ModelFiles,
    /** Longest pair fed to the model; longer passages are cut (the query is kept whole). */
    readonly maxTokens: number,
    private readonly padId: number,
    /** Dimensions for the memory model. */
    readonly dims: EncoderDims,
    /** Threads that tokenize large calls (the CUDA encoder's; none on ONNX Runtime). */
    private readonly pool?: TokenizerPool,
  ) {}

  static async load(dir: string, ep: ExecutionProvider, extras: EncoderLoadExtras = {}, maxTokens = 256): Promise<Reranker> {
    const files = await modelFiles(dir);
    const cfg = await readJson<EncoderConfig>(path.join(dir, 'config.json'));
    const tokenizer = await TextTokenizer.load(dir);
    const longest = Math.min(maxTokens, cfg.max_position_embeddings ?? 512);
    const session = await encoderRuns(dir, files.onnx, ep, extras, { role: 'reranker', maxSequence: longest });
    const dims = { numLayers: cfg.num_hidden_layers, hiddenSize: cfg.hidden_size, numHeads: cfg.num_attention_heads, intermediateSize: cfg.intermediate_size };
    return new Reranker(tokenizer, session, files, longest, cfg.pad_token_id ?? 0, dims, await tokenizerPool(dir, ep, extras));
  }

  /** Frees the model (and stops the tokenizer threads); the reranker is unusable afterwards. */
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

  /** Pairs per model run by default: the CUDA encoder's rows, else RERANK_BATCH. */
  get batchSize(): number {
    return this.session.preferredBatch ?? RERANK_BATCH;
  }

  /** The pair as the model sees it: over-long pairs keep their head and their closing [SEP]. */
  pairInput(query: string, passage: string): PairEncoding {
    return this.truncated(this.tokenizer.encodePair(query, passage));
  }

  private truncated(e: PairEncoding): PairEncoding {
    if (e.ids.length <= this.maxTokens) return e;
    const n = this.maxTokens - 1;
    return {
      ids: [...e.ids.slice(0, n), e.ids[e.ids.length - 1]!],
      typeIds: [...e.typeIds.slice(0, n), e.typeIds[e.typeIds.length - 1]!],
    };
  }

  /**
   * One relevance logit per passage, in the passages' order; the longest pair fed to the model; and
   * each run's shape, [pairs, width] (a batch is padded to its own longest pair): the memory model sizes
   * the rerank stage as it ran by its largest run. An abort of `signal` stops the runs not yet done,
   * the one going included (RunInterrupted).
   */
  score(query: string, passages: readonly string[], batchSize = this.batchSize, signal?: AbortSignal): Promise<{ scores: number[]; pairTokens: number; runs: [number, number][] }> {
    return this.scorePairs(passages.map((p) => [query, p] as const), batchSize, signal);
  }

  /** As score, for pairs of any queries (POST /v1/score). */
  async scorePairs(pairs: readonly (readonly [string, string])[], batchSize = this.batchSize, signal?: AbortSignal): Promise<{ scores: number[]; pairTokens: number; runs: [number, number][] }> {
    const scores: number[] = [];
    const runs: [number, number][] = [];
    const encoded = this.pool && pairs.length >= POOL_MIN_INPUTS ? (await this.pool.encodePairs(pairs)).map((e) => this.truncated(e)) : undefined;
    for (let s = 0; s < pairs.length; s += batchSize) {
      const batch = encoded ? encoded.slice(s, s + batchSize) : pairs.slice(s, s + batchSize).map(([q, p]) => this.pairInput(q, p));
      runs.push([batch.length, Math.max(...batch.map((p) => p.ids.length))]);
      scores.push(...(await this.scoreEncoded(batch, signal)));
    }
    return { scores, pairTokens: Math.max(0, ...runs.map(([, w]) => w)), runs };
  }

  /** One run over `pairs` dummy pairs of `tokens` tokens: the start-up profile's rerank stage. */
  async profileRun(pairs: number, tokens: number): Promise<void> {
    await this.session.dummyRun(pairs, tokens, this.padId);
  }

  /** One model run over pairs already encoded (pairInput): their logits, in order. */
  async scoreEncoded(pairs: readonly PairEncoding[], signal?: AbortSignal): Promise<number[]> {
    const { session } = this;
    const name = session.outputNames.includes('logits') ? 'logits' : session.outputNames[0]!;
    const logits = (await session.run('rerank', name, pairs.map((p) => p.ids), this.padId, pairs.map((p) => p.typeIds), signal)).data;
    const labels = logits.length / pairs.length;
    const out = pairs.map((_, i) => logits[i * labels]!);
    return out;
  }
}
