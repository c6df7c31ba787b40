/**
 * A decoder-only LM exported with a KV cache (Optimum / transformers.js layout):
 *   inputs  input_ids [b, s], attention_mask [b, past + s], position_ids [b, s],
 *           past_key_values.N.key|value [b, kv_heads, past, head_dim]
 *   outputs logits [b, s, vocab], present.N.key|value [b, kv_heads, past + s, head_dim]
 * The shape facts come from config.json, so a real Llama/Qwen2 export drops in; the KV and logits
 * types (float32 or float16) from the graph.
 *
 * On WebGPU the present KV outputs stay on the device (preferredOutputLocation 'gpu-buffer'), so that
 * a decode step can feed them back as the next step's past without a round trip through the host;
 * only the logits come back. On the CPU every output is host memory.
 */
import path from 'node:path';
import * as ort from 'onnxruntime-node';
import type { ExecutionProvider } from '../config/config.js';
import { modelFiles, readJson, readJsonIfExists, type ModelFiles } from '../runtime/model-dir.js';
import { halfsToFloats } from '../runtime/float16.js';
import { kvTailModel, ONNX_FLOAT, ONNX_FLOAT16 } from '../runtime/onnx-graph.js';
import { createSession, sessionOptions, type ConcreteProvider, type LoadedSession, type SessionExtras } from '../runtime/session.js';
import { TextTokenizer } from '../runtime/tokenizer.js';
import { kvArray, kvBytesPerToken, type KvArray, type KvDtype } from './kv-pool.js';

interface DecoderConfig {
  model_type?: string;
  vocab_size: number;
  hidden_size: number;
  intermediate_size?: number;
  num_hidden_layers: number;
  num_attention_heads: number;
  num_key_value_heads?: number;
  head_dim?: number;
  max_position_embeddings?: number;
  bos_token_id?: number | null;
  eos_token_id?: number | number[] | null;
  pad_token_id?: number | null;
}

interface GenerationConfig {
  eos_token_id?: number | number[];
  bos_token_id?: number;
}

export interface DecoderShape {
  numLayers: number;
  hiddenSize: number;
  numHeads: number;
  intermediateSize: number;
  numKvHeads: number;
  headDim: number;
  vocabSize: number;
  maxPositions: number;
  /** Element type of the past/present KV tensors (and of the activations). */
  kvDtype: KvDtype;
}

/** One forward pass over a [batch, seq] block of new tokens on top of `past`. */
export interface ForwardInput {
  batch: number;
  seq: number;
  inputIds: BigInt64Array;
  positionIds: BigInt64Array;
  /** [batch, pastLen + seq]: 1 for real tokens, 0 for padding. */
  attentionMask: BigInt64Array;
  pastLen: number;
  /** Flat [k0, v0, k1, v1, ...]; empty means pastLen 0 (zero-length tensors are made here). */
  past: readonly ort.Tensor[];
}

export interface ForwardOutput {
  /** Logits of each row's last position, [batch, vocab]. */
  lastLogits: Float32Array;
  /**
   * Flat [k0, v0, ...], each [batch, kv_heads, pastLen + seq, head_dim]; the caller disposes them.
   * On the host, or on the device where the provider keeps them there (`presentOnDevice`).
   */
  present: ort.Tensor[];
}

/** Host present tensors' data (device-resident ones come back through DecoderModel.kvTail). */
export function presentData(present: readonly ort.Tensor[]): KvArray[] {
  return present.map((t) => {
    if (t.location !== 'cpu') throw new Error(`present KV is in ${t.location}: read it through kvTail`);
    return t.data as KvArray;
  });
}

export class DecoderModel {
  /** The kv-tail graph on this model's provider (onnx-graph.ts), made on first use. */
  private tail: Promise<ort.InferenceSession> | undefined;

  private constructor(
    readonly tokenizer: TextTokenizer,
    private readonly loaded: LoadedSession,
    readonly files: ModelFiles,
    readonly shape: DecoderShape,
    readonly bosId: number | undefined,
    readonly eosIds: ReadonlySet<number>,
  ) {}

  static async load(dir: string, ep: ExecutionProvider, extras: SessionExtras = {}): Promise<DecoderModel> {
    const files = await modelFiles(dir);
    const cfg = await readJson<DecoderConfig>(path.join(dir, 'config.json'));
    const gen = await readJsonIfExists<GenerationConfig>(path.join(dir, 'generation_config.json'));
    const tokenizer = await TextTokenizer.load(dir);
    const presentNames = Array.from({ length: cfg.num_hidden_layers }, (_, l) => [`present.${l}.key`, `present.${l}.value`]).flat();
    const loaded = await createSession(files.onnx, ep, { ...extras, deviceOutputs: presentNames });
    const heads = cfg.num_attention_heads;
    const pastType = loaded.session.inputMetadata.find((m) => m.name === 'past_key_values.0.key');
    const kvType = pastType?.isTensor ? pastType.type : 'float32';
    if (kvType !== 'float32' && kvType !== 'float16') throw new Error(`decoder ${files.onnx}: KV of type ${kvType} is not supported`);
    const shape: DecoderShape = {
      numLayers: cfg.num_hidden_layers,
      hiddenSize: cfg.hidden_size,
      numHeads: heads,
      intermediateSize: cfg.intermediate_size ?? 4 * cfg.hidden_size,
      numKvHeads: cfg.num_key_value_heads ?? heads,
      headDim: cfg.head_dim ?? cfg.hidden_size / heads,
      vocabSize: cfg.vocab_size,
      maxPositions: cfg.max_position_embeddings ?? 2048,
      kvDtype: kvType,
    };
    const eos = gen?.eos_token_id ?? cfg.eos_token_id ?? [];
    const eosIds = new Set(Array.isArray(eos) ? eos : [eos]);
    const expected = ['input_ids', 'attention_mask', 'past_key_values.0.key'];
    for (const name of expected) {
      if (!loaded.session.inputNames.includes(name)) {
        throw new Error(`decoder ${files.onnx} lacks input '${name}': export it with a KV cache (past_key_values)`);
      }
    }
    return new DecoderModel(tokenizer, loaded, files, shape, gen?.bos_token_id ?? cfg.bos_token_id ?? undefined, eosIds);
  }

  get provider(): ConcreteProvider {
    return this.loaded.provider;
  }

  /** True when present KV outputs stay in device memory between runs. */
  get presentOnDevice(): boolean {
    return this.loaded.provider === 'webgpu';
  }

  /** KV bytes one token occupies across all layers (keys and values). */
  get kvBytesPerToken(): number {
    return kvBytesPerToken(this.shape);
  }

  /**
   * One run of `rows` rows, `newTokens` each, over `context` zero past tokens, inputs built here as
   * the engine builds them: the start-up profile's prefill (context 0) and decode (newTokens 1) stages.
   */
  async profileRun(rows: number, newTokens: number, context: number): Promise<void> {
    const { numLayers, numKvHeads: H, headDim: D, kvDtype } = this.shape;
    // At context 0 these are the empty past tensors a prefill is fed.
    const past = Array.from({ length: 2 * numLayers }, () => new ort.Tensor(kvDtype, kvArray(kvDtype, rows * H * context * D), [rows, H, context, D]));
    const out = await this.forward({
      batch: rows,
      seq: newTokens,
      inputIds: new BigInt64Array(rows * newTokens).fill(BigInt(this.bosId ?? 1)),
      positionIds: BigInt64Array.from({ length: rows * newTokens }, (_, i) => BigInt(context + (i % newTokens))),
      attentionMask: new BigInt64Array(rows * (context + newTokens)).fill(1n),
      pastLen: context,
      past,
    });
    for (const t of out.present) t.dispose();
  }

  /**
   * The last `n` positions of each present tensor, in host memory: [batch, kv_heads, n, head_dim] per
   * layer key/value. Where present KV lives on the device this is the only download path, and it moves
   * just the tail; on the CPU it runs the same graph (so tests exercise it).
   */
  async kvTail(present: readonly ort.Tensor[], n: number): Promise<KvArray[]> {
    // Outputs in host memory: sessionOptions keeps outputs on the device only when asked to.
    this.tail ??= ort.InferenceSession.create(kvTailModel(present.length, this.shape.kvDtype === 'float16' ? ONNX_FLOAT16 : ONNX_FLOAT),
      sessionOptions(this.loaded.provider));
    const session = await this.tail;
    const feeds: Record<string, ort.Tensor> = { starts: new ort.Tensor('int64', BigInt64Array.of(BigInt(-n)), [1]) };
    present.forEach((t, i) => (feeds[`x${i}`] = t));
    const out = await session.run(feeds);
    return present.map((_, i) => {
      const t = out[`y${i}`]!;
      const data = t.data as KvArray;
      t.dispose();
      return data;
    });
  }

  async forward(input: ForwardInput): Promise<ForwardOutput> {
    const { batch, seq, pastLen } = input;
    const { numLayers, numKvHeads, headDim, vocabSize, kvDtype } = this.shape;
    const { session } = this.loaded;
    const feeds: Record<string, ort.Tensor> = {
      input_ids: new ort.Tensor('int64', input.inputIds, [batch, seq]),
      attention_mask: new ort.Tensor('int64', input.attentionMask, [batch, pastLen + seq]),
    };
    if (session.inputNames.includes('position_ids')) {
      feeds['position_ids'] = new ort.Tensor('int64', input.positionIds, [batch, seq]);
    }
    for (let l = 0; l < numLayers; l++) {
      for (const [j, kv] of (['key', 'value'] as const).entries()) {
        feeds[`past_key_values.${l}.${kv}`] =
          input.past[2 * l + j] ?? new ort.Tensor(kvDtype, kvArray(kvDtype, 0), [batch, numKvHeads, 0, headDim]);
      }
    }
    const result = await session.run(feeds);
    const logits = result['logits']!;
    const all = logits.data as Float32Array | Uint16Array;
    const last = all instanceof Float32Array ? new Float32Array(batch * vocabSize) : new Uint16Array(batch * vocabSize);
    for (let b = 0; b < batch; b++) {
      const off = (b * seq + seq - 1) * vocabSize;
      last.set(all.subarray(off, off + vocabSize), b * vocabSize);
    }
    const lastLogits = last instanceof Float32Array ? last : halfsToFloats(last);
    logits.dispose();
    const present: ort.Tensor[] = [];
    for (let l = 0; l < numLayers; l++) present.push(result[`present.${l}.key`]!, result[`present.${l}.value`]!);
    return { lastLogits, present };
  }
}
