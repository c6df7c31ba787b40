/**
 * A stand-in for the native CUDA library (binding.ts's CudaBackend) on machines without a GPU: its
 * "model" answers each sequence with (its last token + 1 + 10 x its LoRA entry) mod vocab (standInLogits,
 * with the packed penalties applied as the kernel applies them), read from the packed step as the kernels read it (an adapter's rows come out different from the base model's, each by
 * its own entry); its plan and memory figures are step-pack.ts's, as the real library's must be. So the
 * CUDA runner's and the server's own logic run on the CPU (scripts/check-cuda.ts checks the device).
 * Also the tiny Qwen2-shaped checkpoint the CUDA tests load.
 */
import type { CudaBackend, EngineHandle, NativeConfig, NativeMemory } from '../src/backends/cuda/binding.js';
import { parseConfig, type CudaModelConfig } from '../src/backends/cuda/hf-checkpoint.js';
import { planDevice, SEQ_ARRAYS } from '../src/backends/cuda/step-pack.js';
import { argmax } from '../src/generate/sampler.js';
import { writeSafetensors } from '../src/runtime/safetensors.js';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';

/**
 * The stand-in model's logits after `last` (LoRA entry `lora`): 1 for (last + 1 + 10 x lora) mod vocab,
 * 0.9 for the token after it, 0 elsewhere; so a penalty on the first makes the second win.
 */
export function standInLogits(last: number, lora: number, vocab: number): Float32Array {
  const l = new Float32Array(vocab);
  const target = (last + 1 + 10 * lora) % vocab;
  l[target] = 1;
  l[(target + 1) % vocab] = 0.9;
  return l;
}

/** Qwen2-shaped: hidden 8, 2 heads of 4 (q 8), 1 kv head (k, v 4), intermediate 12, 2 layers, vocab 32. */
export const TINY = {
  model_type: 'qwen2', vocab_size: 32, hidden_size: 8, intermediate_size: 12, num_hidden_layers: 2, num_attention_heads: 2,
  num_key_value_heads: 1, max_position_embeddings: 64, rope_theta: 10000, tie_word_embeddings: true, eos_token_id: 2,
};

/** TINY's tensors (zeros), as a Qwen2 checkpoint names them. */
export function tinyTensors(): Map<string, { shape: number[]; values: Float32Array }> {
  const t = new Map<string, { shape: number[]; values: Float32Array }>();
  const add = (name: string, shape: number[]) => t.set(name, { shape, values: new Float32Array(shape.reduce((a, b) => a * b, 1)) });
  add('model.embed_tokens.weight', [32, 8]);
  add('model.norm.weight', [8]);
  for (let l = 0; l < 2; l++) {
    const p = `model.layers.${l}.`;
    for (const n of ['input_layernorm', 'post_attention_layernorm']) add(p + n + '.weight', [8]);
    add(p + 'self_attn.q_proj.weight', [8, 8]);
    add(p + 'self_attn.k_proj.weight', [4, 8]);
    add(p + 'self_attn.v_proj.weight', [4, 8]);
    add(p + 'self_attn.q_proj.bias', [8]);
    add(p + 'self_attn.k_proj.bias', [4]);
    add(p + 'self_attn.v_proj.bias', [4]);
    add(p + 'self_attn.o_proj.weight', [8, 8]);
    add(p + 'mlp.gate_proj.weight', [12, 8]);
    add(p + 'mlp.up_proj.weight', [12, 8]);
    add(p + 'mlp.down_proj.weight', [8, 12]);
  }
  return t;
}

/** TINY as a checkpoint directory (config.json and model.safetensors) in `dir`. */
export async function writeTinyCheckpoint(dir: string): Promise<void> {
  await writeFile(path.join(dir, 'config.json'), JSON.stringify(TINY));
  await writeFile(path.join(dir, 'model.safetensors'), writeSafetensors(tinyTensors()));
}

/**
 * Penalty entries (distinct tokens, each with its count in the output) applied to `logits` in place, as
 * ragguard_cuda.cu's penalty_kernel applies them: the repetition penalty (0 or 1: off) to every entry,
 * presence and frequency to those the output holds.
 */
export function applyPenaltyEntries(logits: Float32Array, p: { repetition: number; presence: number; frequency: number },
  tokens: ArrayLike<number>, counts: ArrayLike<number>): void {
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i]!, n = counts[i]!;
    let x = logits[t]!;
    if (p.repetition > 0 && p.repetition !== 1) x = x > 0 ? x / p.repetition : x * p.repetition;
    if (n > 0) x = x - p.presence - p.frequency * n;
    logits[t] = x;
  }
}

export interface SlotWrite { layer: number; projection: number; entry: number; a: Float32Array | null; b: Float32Array | null }

export interface QuantUpload { kind: number; layer: number; row0: number; type: number; rows: number; cols: number; offset: number; bytes: number; data: boolean }

export interface StandIn extends CudaBackend {
  /** Every quantized segment uploaded (a GGUF decoder's matrices), its packed size. */
  readonly uploads: QuantUpload[];
  /** Each step's token and sequence counts and its sequences' LoRA entries. */
  readonly steps: { T: number; S: number; lora: number[] }[];
  /** Every LoRA slot write (copies of A and B). */
  readonly writes: SlotWrite[];
  /** Engines created and not destroyed. */
  live: number;
  /** The last engine's configuration. */
  created: NativeConfig | undefined;
  /**
   * Calls that shape the products, in order: `fp8-gemm:<mode>` (rg_set_fp8_gemm), `gemv:<rows>`
   * (rg_set_gemv_rows), `qgemv-math:<mode>` (rg_set_qgemv_math) and `graphs` (their capture).
   */
  readonly events: string[];
}

/** `config`: a config.json's object, or a config already parsed (a GGUF file's: gguf-checkpoint.ts planGguf). */
export function standInCuda(config: Record<string, unknown> | CudaModelConfig, opts: { omitLoraFromPlan?: boolean } = {}): StandIn {
  const parsed = 'numLayers' in config ? config as CudaModelConfig : parseConfig(config as Parameters<typeof parseConfig>[0]);
  const vocab = parsed.vocabSize;
  const planOf = (cfg: NativeConfig) => planDevice(parsed, cfg.dtype === 1 ? 'bfloat16' : 'float16', {
    numBlocks: cfg.num_blocks, blockSize: cfg.block_size, maxBatchedTokens: cfg.max_batched_tokens, maxSeqs: cfg.max_seqs,
    maxBlocksPerSeq: cfg.max_blocks_per_seq, cublasWorkspaceBytes: cfg.cublas_workspace_bytes,
    maxLoras: cfg.max_loras, maxLoraRank: cfg.max_lora_rank,
  }, cfg.quantized ? { bytes: cfg.quant_bytes, tileBytes: cfg.quant_tile_bytes } : undefined);
  const engines = new Map<EngineHandle, NativeConfig>();
  const s: StandIn = {
    steps: [],
    writes: [],
    uploads: [],
    live: 0,
    created: undefined,
    events: [],
    deviceCount: () => 1,
    plan: (cfg) => {
      const p = planOf(cfg);
      return [p.weights, p.kvPool, p.workspace, p.cublasWorkspace, p.hostPinned, opts.omitLoraFromPlan ? 0 : p.lora];
    },
    create: (cfg) => {
      const h = {} as EngineHandle;
      engines.set(h, cfg);
      s.created = cfg;
      s.live++;
      return h;
    },
    destroy: (h) => {
      if (engines.delete(h)) s.live--;
    },
    setRope: () => {},
    loadTensor: () => {},
    loadDone: () => {},
    captureGraphs: () => {
      s.events.push('graphs');
      return 0;
    },
    setGemvRows: (_h, rows) => void s.events.push(`gemv:${rows}`),
    setQgemvMath: (_h, mode) => void s.events.push(`qgemv-math:${mode}`),
    setFp8Gemm: (_h, mode) => void s.events.push(`fp8-gemm:${mode}`),
    fp8GemmNote: () => '',
    step: (_h, words, tokensOut, logitsOut) => new Promise((resolve) => setImmediate(() => {
      const T = words[0]!, S = words[1]!, W = words[2]!, P = words[3]!;
      const ids = words.subarray(4, 4 + T);
      const seq = (k: number) => words.subarray(4 + 4 * T + k * S, 4 + 4 * T + (k + 1) * S);
      const f32 = (k: number) => new Float32Array(words.buffer, words.byteOffset + (4 + 4 * T + k * S) * 4, S);
      const last = seq(1), lora = seq(8), rep = f32(9), presence = f32(10), frequency = f32(11), penStart = seq(12), penCount = seq(13);
      const penTokens = 4 + 4 * T + SEQ_ARRAYS * S + S * W;
      const maskAt = seq(14), masks = penTokens + 2 * P, mw = Math.ceil(vocab / 32);
      s.steps.push({ T, S, lora: [...lora] });
      for (let r = 0; r < S; r++) {
        const logits = standInLogits(ids[last[r]!]!, lora[r]!, vocab);
        const from = penTokens + penStart[r]!, to = from + penCount[r]!;
        applyPenaltyEntries(logits, { repetition: rep[r]!, presence: presence[r]!, frequency: frequency[r]! },
          words.subarray(from, to), words.subarray(from + P, to + P));
        if (maskAt[r]! > 0) {
          const m = words.subarray(masks + (maskAt[r]! - 1) * mw, masks + maskAt[r]! * mw);
          for (let t = 0; t < vocab; t++) if (((m[t >>> 5]! >>> (t & 31)) & 1) === 0) logits[t] = -Infinity;
        }
        tokensOut[r] = argmax(logits);
        // As the library does when asked (keepLogits): each row's logits after penalties and mask.
        logitsOut?.set(logits, r * vocab);
      }
      resolve();
    })),
    copyBlocks: () => {},
    loraWrite: (_h, layer, projection, entry, a, b) => void s.writes.push({ layer, projection, entry, a: a && a.slice(), b: b && b.slice() }),
    quantUpload: (_h, kind, layer, row0, type, rows, cols, offset, packed, bytes) => {
      if (packed && packed.length !== bytes) throw new Error('packed length differs from bytes');
      s.uploads.push({ kind, layer, row0, type, rows, cols, offset, bytes, data: packed !== null });
    },
    memory: (h): NativeMemory => {
      const cfg = engines.get(h);
      if (!cfg) throw new Error('no such engine');
      const p = planOf(cfg);
      return {
        weights: p.weights, kv_pool: p.kvPool, workspace: p.workspace, cublas_workspace: p.cublasWorkspace, graphs: 0,
        host_pinned: p.hostPinned, total: p.total, device_free: 100e9, device_total: 141e9, lora: p.lora,
      };
    },
  };
  return s;
}
