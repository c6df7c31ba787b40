/**
 * A GGUF decoder as the genai builder's input (gqa-builder.ts): its shape facts from the metadata
 * (architectures llama and qwen2), its weights by Hugging Face module name, floats dequantized or
 * blocks handed over as stored (Q4_0, Q4_1, Q4_K at 4 bits; Q8_0, Q6_K and Q5_0 at 8), and what cannot be
 * represented refused by name.
 *
 * llama.cpp's converter (convert_hf_to_gguf.py) permutes the rows of a llama model's q and k
 * projections within each head, from the rotate-half pairing (i, i + d/2) that transformers uses to
 * adjacent pairs (2i, 2i + 1) that ggml's plain rope rotates; qwen2 is converted unpermuted and run
 * with the NEOX (rotate-half) rope. The permutation is undone here, rows whole (quantized blocks run
 * along a row), so that the graph is the transformers model's (rotate-half GroupQueryAttention) and
 * adapters trained on it apply as they are.
 */
import { GGML, GgufFile, ggmlTypeName, halfToFloat, q4kScaleMin, q5Value, rowBytes, type GgufTensorInfo } from '../../../runtime/gguf.js';
import type { BlockWeight, GqaOptions, GqaSourceConfig, WeightSource } from './gqa-builder.js';

export const GGUF_ARCHITECTURES = ['llama', 'qwen2'] as const;

/** Hugging Face module name -> GGUF tensor name. */
function ggufName(hf: string): string | undefined {
  if (hf === 'model.embed_tokens.weight') return 'token_embd.weight';
  if (hf === 'model.norm.weight') return 'output_norm.weight';
  if (hf === 'lm_head.weight') return 'output.weight';
  const m = /^model\.layers\.(\d+)\.(.+)\.(weight|bias)$/.exec(hf);
  if (!m) return undefined;
  const map: Record<string, string> = {
    input_layernorm: 'attn_norm', post_attention_layernorm: 'ffn_norm',
    'self_attn.q_proj': 'attn_q', 'self_attn.k_proj': 'attn_k', 'self_attn.v_proj': 'attn_v', 'self_attn.o_proj': 'attn_output',
    'mlp.gate_proj': 'ffn_gate', 'mlp.up_proj': 'ffn_up', 'mlp.down_proj': 'ffn_down',
  };
  const part = map[m[2]!];
  return part && `blk.${m[1]}.${part}.${m[3]}`;
}

export interface GgufModel {
  file: GgufFile;
  arch: (typeof GGUF_ARCHITECTURES)[number];
  config: GqaSourceConfig;
  rotary: NonNullable<GqaOptions['rotary']>;
  source: WeightSource;
}

/** Opens a GGUF decoder: checks it is one this builder represents exactly, or says what is not. */
export function ggufModel(file: GgufFile): GgufModel {
  const arch = file.str('general.architecture');
  if (!GGUF_ARCHITECTURES.includes(arch as GgufModel['arch'])) {
    throw new Error(`${file.path}: architecture '${arch}' is not supported (${GGUF_ARCHITECTURES.join(', ')} are)`);
  }
  const a = arch as GgufModel['arch'];
  const k = (key: string) => `${a}.${key}`;
  const hidden = file.num(k('embedding_length'));
  const heads = file.num(k('attention.head_count'));
  const kvHeads = file.num(k('attention.head_count_kv'), heads);
  const headDim = file.num(k('attention.key_length'), hidden / heads);
  if (file.num(k('attention.value_length'), headDim) !== headDim) throw new Error(`${file.path}: ${k('attention.value_length')} differs from the key length`);
  const ropeDim = file.num(k('rope.dimension_count'), headDim);
  if (ropeDim !== headDim) throw new Error(`${file.path}: ${k('rope.dimension_count')} ${ropeDim} rotates part of a head of ${headDim}: partial rotary is not supported`);
  const embd = file.need('token_embd.weight');
  const vocab = file.num(k('vocab_size'), embd.dims[1]);
  const rotary: GgufModel['rotary'] = {};
  const scaling = file.str(k('rope.scaling.type')) ?? 'none';
  if (scaling === 'linear') rotary.linearFactor = file.num(k('rope.scaling.factor'));
  else if (scaling !== 'none') throw new Error(`${file.path}: ${k('rope.scaling.type')} '${scaling}' is not supported (none and linear are)`);
  const freqs = file.tensor('rope_freqs.weight');
  if (freqs) rotary.freqFactors = file.floats(freqs);
  for (const key of [k('attn_logit_softcapping'), k('final_logit_softcapping'), k('attention.sliding_window')]) {
    if (file.get(key) !== undefined) throw new Error(`${file.path}: ${key} is not supported`);
  }
  const tokenId = (key: string) => (file.get(key) === undefined ? null : file.num(key));
  const config: GqaSourceConfig = {
    model_type: a,
    vocab_size: vocab,
    hidden_size: hidden,
    intermediate_size: file.num(k('feed_forward_length')),
    num_hidden_layers: file.num(k('block_count')),
    num_attention_heads: heads,
    num_key_value_heads: kvHeads,
    head_dim: headDim,
    rms_norm_eps: file.num(k('attention.layer_norm_rms_epsilon')),
    rope_theta: file.num(k('rope.freq_base'), 10000),
    max_position_embeddings: file.num(k('context_length')),
    tie_word_embeddings: file.tensor('output.weight') === undefined,
    bos_token_id: tokenId('tokenizer.ggml.bos_token_id'),
    eos_token_id: tokenId('tokenizer.ggml.eos_token_id'),
    pad_token_id: tokenId('tokenizer.ggml.padding_token_id'),
  };
  return { file, arch: a, config, rotary, source: new GgufWeights(file, a, config) };
}

/** Row r of the transformers layout comes from stored row perm[r] (within each head of `headDim` rows). */
function unpermutation(rows: number, headDim: number): Int32Array {
  const perm = new Int32Array(rows);
  const half = headDim / 2;
  for (let h = 0; h < rows / headDim; h++) {
    for (let j = 0; j < 2; j++) for (let i = 0; i < half; i++) perm[h * headDim + j * half + i] = h * headDim + 2 * i + j;
  }
  return perm;
}

function permuteRows<A extends Uint8Array | Float32Array>(a: A, rowLen: number, perm: Int32Array | undefined): A {
  if (!perm) return a;
  const out = new (a.constructor as new (n: number) => A)(a.length);
  for (let r = 0; r < perm.length; r++) out.set(a.subarray(perm[r]! * rowLen, (perm[r]! + 1) * rowLen), r * rowLen);
  return out;
}

class GgufWeights implements WeightSource {
  constructor(private readonly file: GgufFile, private readonly arch: GgufModel['arch'], private readonly cfg: GqaSourceConfig) {}

  private info(hf: string): GgufTensorInfo | undefined {
    const name = ggufName(hf);
    return name === undefined ? undefined : this.file.tensor(name);
  }

  /** The row permutation that undoes llama.cpp's for llama's q and k (weights and biases). */
  private perm(hf: string, rows: number): Int32Array | undefined {
    if (this.arch !== 'llama') return undefined;
    const D = this.cfg.head_dim!;
    if (/\.self_attn\.(q|k)_proj\./.test(hf)) return unpermutation(rows, D);
    return undefined;
  }

  rows(hf: string): number | undefined {
    const t = this.info(hf);
    return t && (t.dims[1] ?? 1);
  }

  floats(hf: string): Float32Array | undefined {
    const t = this.info(hf);
    if (!t) return undefined;
    const rowLen = t.dims[0]!;
    const rows = t.dims.slice(1).reduce((x, y) => x * y, 1);
    return permuteRows(this.file.floats(t), rows === 1 && hf.endsWith('.bias') ? 1 : rowLen, this.perm(hf, hf.endsWith('.bias') ? rowLen : rows));
  }

  blocks(hf: string): BlockWeight | undefined {
    const t = this.info(hf);
    if (!t || t.dims.length !== 2) return undefined;
    const [kIn, n] = t.dims as [number, number];
    const b = toBlocks(t.type, this.file.raw(t), n, kIn);
    if (!b) return undefined;
    const perm = this.perm(hf, n);
    if (!perm) return b;
    const blocks = kIn / b.blockSize;
    return {
      ...b,
      data: permuteRows(b.data, b.data.length / n, perm),
      scales: permuteRows(b.scales, blocks, perm),
      zeroPoints: b.zeroPoints && permuteRows(b.zeroPoints, b.zeroPoints.length / n, perm),
      mins: b.mins && permuteRows(b.mins, blocks, perm),
    };
  }
}

/**
 * Blocks read as q d + min (Q4_1, Q4_K) with zero points moved to each block's own zero, z =
 * round(-min / d) within 0..15, and the min term keeping the rest: q d + min = (q - z) d + (min + z d),
 * the same weights (the rest rounded once to float32).
 *
 * Why: MatMulNBits quantizes x to int8 per block (accuracy level 4, as gqa-builder.ts runs it) while the
 * graph's min term multiplies the float x. With z = 0 the quantized part of a weight is q d, all of one
 * sign and up to 15 d: x's rounding error is multiplied by that, and the min term, which cancels the
 * offset in the weight, does not cancel the error. llama.cpp avoids it by taking its min term from the
 * quantized x; here the quantized part is made as small as the weight itself. Largest log-probability
 * difference from llama.cpp's reference vectors on the files as stored (whose products quantize x too),
 * at level 4: Qwen2.5-Coder-0.5B Q4_K_M 1.05 nats with z = 0, 0.29 centred (0.35 with these products at
 * level 0); SmolLM2-135M Q4_1 1.48 with z = 0 and 5 greedy ids of 72 wrong, 0.56 centred and none wrong
 * (1.04 at level 0).
 */
function centreZeroPoints(b: BlockWeight & { mins: Float32Array }): BlockWeight {
  const blocks = b.k / b.blockSize;
  const perRow = Math.ceil(blocks / 2);
  const zeroPoints = new Uint8Array(b.n * perRow);
  const mins = new Float32Array(b.mins.length);
  for (let r = 0; r < b.n; r++) {
    for (let j = 0; j < blocks; j++) {
      const i = r * blocks + j;
      const d = b.scales[i]!;
      const z = d === 0 ? 0 : Math.min(15, Math.max(0, Math.round(-b.mins[i]! / d)));
      mins[i] = Math.fround(b.mins[i]! + z * d);
      // Two 4-bit zero points a byte, the even block's in the low nibble (MatMulNBits' packing).
      zeroPoints[r * perRow + (j >> 1)]! |= (j & 1) === 1 ? z << 4 : z;
    }
  }
  return { ...b, zeroPoints, mins };
}

/** A stored half as a number (exact in float32, as ggml widens it). */
function f16(b: Uint8Array, at: number): number {
  return halfToFloat(b[at]! | (b[at + 1]! << 8));
}

/** 32 nibbles of ggml's order (element j low, j + 16 high, in byte j) into MatMulNBits' (2i low, 2i + 1 high, in byte i). */
function repackNibbles(get: (e: number) => number, out: Uint8Array, at: number): void {
  for (let i = 0; i < 16; i++) out[at + i] = get(2 * i) | (get(2 * i + 1) << 4);
}

/**
 * A ggml tensor of `n` rows of `k` as MatMulNBits blocks, without loss, for the types that map onto
 * them; undefined for the others (the builder dequantizes those).
 */
export function toBlocks(type: number, raw: Uint8Array, n: number, k: number): BlockWeight | undefined {
  const rb = (() => { try { return rowBytes(type, k); } catch { return 0; } })();
  switch (type) {
    case GGML.Q4_0:
    case GGML.Q4_1: {
      const blocks = k / 32;
      const size = type === GGML.Q4_0 ? 18 : 20;
      const data = new Uint8Array(n * blocks * 16);
      const scales = new Float32Array(n * blocks);
      const mins = type === GGML.Q4_1 ? new Float32Array(n * blocks) : undefined;
      for (let blk = 0; blk < n * blocks; blk++) {
        const at = blk * size;
        scales[blk] = f16(raw, at);
        if (mins) mins[blk] = f16(raw, at + 2);
        const qs = at + (mins ? 4 : 2);
        repackNibbles((e) => (e < 16 ? raw[qs + e]! & 0x0f : raw[qs + e - 16]! >> 4), data, blk * 16);
      }
      // Q4_0: (q - 8) d, MatMulNBits' default zero point; Q4_1: q d + m, zero points at each block's zero and the min term.
      return mins ? centreZeroPoints({ bits: 4, blockSize: 32, n, k, data, scales, mins }) : { bits: 4, blockSize: 32, n, k, data, scales };
    }
    case GGML.Q8_0: {
      const blocks = k / 32;
      const data = new Uint8Array(n * k);
      const scales = new Float32Array(n * blocks);
      for (let blk = 0; blk < n * blocks; blk++) {
        const at = blk * 34;
        scales[blk] = f16(raw, at);
        // int8 q as q + 128 against the default zero point 128.
        for (let j = 0; j < 32; j++) data[blk * 32 + j] = (raw[at + 2 + j]! + 128) & 0xff;
      }
      return { bits: 8, blockSize: 32, n, k, data, scales };
    }
    case GGML.Q5_0: {
      // 5-bit q with zero point 16 and scale d: 8-bit blocks of 32, exact (ONNX Runtime has no 5-bit kernel).
      // Stored as q + 112 against MatMulNBits' default zero point 128 ((q + 112) - 128 = q - 16): the
      // product then takes no zero-point input, which ONNX Runtime's 8-bit kernel runs faster without, and
      // shares one form with Q8_0 blocks (a layer's q/k/v of both types fuse into one product).
      const blocks = k / 32;
      const data = new Uint8Array(n * k);
      const scales = new Float32Array(n * blocks);
      for (let blk = 0; blk < n * blocks; blk++) {
        const at = blk * 22;
        scales[blk] = f16(raw, at);
        for (let j = 0; j < 32; j++) data[blk * 32 + j] = q5Value(raw, at, j) + 112;
      }
      return { bits: 8, blockSize: 32, n, k, data, scales };
    }
    case GGML.Q4_K: {
      // A super-block of 256 is 8 blocks of 32, each scale d * sc and min -dmin * m.
      const blocks = k / 32;
      const data = new Uint8Array(n * blocks * 16);
      const scales = new Float32Array(n * blocks);
      const mins = new Float32Array(n * blocks);
      for (let sb = 0; sb < (n * k) / 256; sb++) {
        const at = sb * 144;
        const d = f16(raw, at);
        const dmin = f16(raw, at + 2);
        for (let j = 0; j < 8; j++) {
          const [sc, m] = q4kScaleMin(raw, at + 4, j);
          const blk = sb * 8 + j;
          scales[blk] = Math.fround(d * sc);
          mins[blk] = -Math.fround(dmin * m);
          const q = at + 16 + 32 * (j >> 1);
          const high = (j & 1) === 1;
          repackNibbles((e) => (high ? raw[q + e]! >> 4 : raw[q + e]! & 0x0f), data, blk * 16);
        }
      }
      return centreZeroPoints({ bits: 4, blockSize: 32, n, k, data, scales, mins });
    }
    case GGML.Q6_K: {
      // 16 blocks of 16 per super-block, 6-bit q with zero point 32 and scale d * sc: 8-bit blocks of 16,
      // stored as q + 96 against the default zero point 128 (as Q5_0 above).
      const blocks = k / 16;
      const data = new Uint8Array(n * k);
      const scales = new Float32Array(n * blocks);
      for (let sb = 0; sb < (n * k) / 256; sb++) {
        const at = sb * 210;
        const d = f16(raw, at + 208);
        for (let half = 0; half < 2; half++) {
          const ql = at + 64 * half;
          const qh = at + 128 + 32 * half;
          const y = sb * 256 + 128 * half;
          for (let l = 0; l < 32; l++) {
            const h = raw[qh + l]!;
            data[y + l] = ((raw[ql + l]! & 0x0f) | ((h & 3) << 4)) + 96;
            data[y + l + 32] = ((raw[ql + l + 32]! & 0x0f) | (((h >> 2) & 3) << 4)) + 96;
            data[y + l + 64] = ((raw[ql + l]! >> 4) | (((h >> 4) & 3) << 4)) + 96;
            data[y + l + 96] = ((raw[ql + l + 32]! >> 4) | (((h >> 6) & 3) << 4)) + 96;
          }
          for (let i = 0; i < 8; i++) scales[sb * 16 + half * 8 + i] = Math.fround(d * ((raw[at + 192 + 8 * half + i]! << 24) >> 24));
        }
      }
      return { bits: 8, blockSize: 16, n, k, data, scales };
    }
    default:
      if (rb === 0) throw new Error(`ggml type ${ggmlTypeName(type)} is not supported (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K are)`);
      return undefined; // float types: the builder's float MatMul
  }
}
