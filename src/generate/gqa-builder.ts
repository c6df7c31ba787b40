/**
 * Builds a Llama/Qwen2-shaped decoder in onnxruntime-genai's layout from an exported model's weights,
 * the way genai's model builder does: attention is ONNX Runtime's GroupQueryAttention (com.microsoft),
 * which reads each row's K/V in place for its own length and writes the new tokens into the past
 * buffer when the present output is that same buffer.
 *
 * Why: the Optimum export's attention concatenates past and new KV into a fresh present tensor,
 * repeats the KV heads up to the query heads and masks a padded batch, every step; on the CPU that
 * copying grows with batch x context and ate the gain of batching (a batch-8 decode step over 480
 * tokens cost 7 times a batch-1 step). Here a decode step costs the weights once per batch plus each
 * row's own attention.
 *
 *   inputs  input_ids [b, s], attention_mask [b, t] (1 for a row's tokens, left-aligned: row r holds
 *           its first len_r positions), past_key_values.N.key|value [b, kv_heads, capacity, head_dim]
 *   outputs logits [b, 1, vocab] (the last position only: all a sampler needs),
 *           present.N.key|value [b, kv_heads, max(t, capacity), head_dim]
 * seqlens_k (= len_r - 1) and total_sequence_length (= t) come from the mask, as in genai's graphs;
 * positions (for the rotary embedding) from seqlens_k inside the operator.
 *
 * Weights are found by their module names (model.layers.N.self_attn.q_proj.weight, ...; a '_fp16'
 * suffix and a wrapper prefix are allowed), so any export that keeps names converts.
 */
import { floatsToHalfs, halfsToFloats } from '../runtime/float16.js';
import { int64s, ONNX_FLOAT, ONNX_FLOAT16, ONNX_INT32, type Initializer, type NodeSpec, type ValueSpec } from '../runtime/onnx-proto.js';
import { LORA_INDEX, loraSlots } from './lora.js';

export interface GqaSourceConfig {
  model_type?: string;
  vocab_size: number;
  hidden_size: number;
  intermediate_size: number;
  num_hidden_layers: number;
  num_attention_heads: number;
  num_key_value_heads?: number;
  head_dim?: number;
  rms_norm_eps?: number;
  rope_theta?: number;
  max_position_embeddings?: number;
  tie_word_embeddings?: boolean;
  bos_token_id?: number | null;
  eos_token_id?: number | number[] | null;
  pad_token_id?: number | null;
}

export type GqaDtype = 'float32' | 'float16';

export interface GqaGraph {
  nodes: NodeSpec[];
  initializers: Initializer[];
  inputs: ValueSpec[];
  outputs: ValueSpec[];
  /** onnxruntime-genai's genai_config.json for this graph. */
  genaiConfig: Record<string, unknown>;
}

/** Finds weights by module name, whatever prefix or '_fp16' suffix the export gave them. */
class Weights {
  private readonly byName = new Map<string, Initializer>();

  constructor(all: ReadonlyMap<string, Initializer>) {
    for (const t of all.values()) {
      const name = t.name.replace(/_fp16$/, '');
      const at = name.search(/(^|\.)(model\.|lm_head\.)/);
      this.byName.set(at < 0 ? name : name.slice(name[at] === '.' ? at + 1 : at), t);
    }
  }

  get(name: string): Initializer | undefined {
    return this.byName.get(name);
  }

  need(name: string): Initializer {
    const t = this.get(name);
    if (!t) throw new Error(`weight ${name} not found among the model's initializers`);
    return t;
  }

  /** float32 values of a float32 or float16 initializer. */
  static floats(t: Initializer): Float32Array {
    if (t.dataType === ONNX_FLOAT) return new Float32Array(new Uint8Array(t.data).buffer);
    if (t.dataType === ONNX_FLOAT16) return halfsToFloats(new Uint16Array(new Uint8Array(t.data).buffer));
    throw new Error(`weight ${t.name} has element type ${t.dataType}; float32 or float16 expected`);
  }
}

function tensor(name: string, dtype: GqaDtype, dims: number[], values: Float32Array): Initializer {
  const data = dtype === 'float32' ? new Uint8Array(values.buffer, values.byteOffset, values.byteLength) : new Uint8Array(floatsToHalfs(values).buffer);
  return { name, dataType: dtype === 'float32' ? ONNX_FLOAT : ONNX_FLOAT16, dims, data };
}

/** Rows of `parts` ([out_i, in] each) stacked, then transposed to [in, sum out_i]: a MatMul's right operand. */
function stackTransposed(parts: readonly Float32Array[], inDim: number): { values: Float32Array; outDim: number } {
  const outDim = parts.reduce((s, p) => s + p.length / inDim, 0);
  const values = new Float32Array(inDim * outDim);
  let col = 0;
  for (const p of parts) {
    const rows = p.length / inDim;
    for (let r = 0; r < rows; r++) {
      for (let i = 0; i < inDim; i++) values[i * outDim + col + r] = p[r * inDim + i]!;
    }
    col += rows;
  }
  return { values, outDim };
}

export interface GqaOptions {
  dtype?: GqaDtype;
  /**
   * Give every projection a LoRA path, (x A[i]) B[i] with A and B graph inputs holding every adapter
   * slot and i each row's entry in `lora_index` (lora.ts), default true. A run without an adapter feeds
   * rank-0 tensors.
   */
  lora?: boolean;
}

export function buildGqaDecoder(cfg: GqaSourceConfig, all: ReadonlyMap<string, Initializer>, opts: GqaOptions = {}): GqaGraph {
  const dtype = opts.dtype ?? 'float32';
  const lora = opts.lora ?? true;
  const w = new Weights(all);
  const H = cfg.hidden_size;
  const nh = cfg.num_attention_heads;
  const kvh = cfg.num_key_value_heads ?? nh;
  const D = cfg.head_dim ?? H / nh;
  if (lora && nh * D !== H) throw new Error(`LoRA paths need num_attention_heads x head_dim (${nh * D}) = hidden_size (${H}), as the projections here assume`);
  const L = cfg.num_hidden_layers;
  const V = cfg.vocab_size;
  const maxPos = cfg.max_position_embeddings ?? 2048;
  const eps = cfg.rms_norm_eps ?? 1e-6;
  const elem = dtype === 'float32' ? ONNX_FLOAT : ONNX_FLOAT16;
  const nodes: NodeSpec[] = [];
  const inits: Initializer[] = [];
  const add = (op: string, inputs: string[], outputs: string[], extra: Partial<NodeSpec> = {}) => nodes.push({ op, inputs, outputs, ...extra });
  // The input width of each projection: the hidden size, or the MLP's intermediate size for down_proj.
  const inDimOf = (p: string) => (p.endsWith('down_proj') ? cfg.intermediate_size : H);
  const linear = (name: string, x: string, out: string, parts: string[]) => {
    const ws = parts.map((p) => Weights.floats(w.need(`${p}.weight`)));
    const inDim = inDimOf(parts[0]!);
    const { values, outDim } = stackTransposed(ws, inDim);
    inits.push(tensor(`${name}.weight`, dtype, [inDim, outDim], values));
    const bs = parts.map((p) => w.get(`${p}.bias`));
    if (bs.some((b) => b !== undefined)) {
      const bias = new Float32Array(outDim);
      let at = 0;
      parts.forEach((_p, i) => {
        const rows = ws[i]!.length / inDim;
        if (bs[i]) bias.set(Weights.floats(bs[i]), at);
        at += rows;
      });
      inits.push(tensor(`${name}.bias`, dtype, [outDim], bias));
      add('MatMul', [x, `${name}.weight`], [`${out}_nobias`]);
      add('Add', [`${out}_nobias`, `${name}.bias`], [lora ? `${out}_base` : out]);
    } else add('MatMul', [x, `${name}.weight`], [lora ? `${out}_base` : out]);
    if (lora) {
      // The low-rank path: each row's entry of A and B ([b, in, r], [b, r, out], alive only for this
      // projection), then [b, s, in] x [b, in, r] -> [b, s, r] x [b, r, out]; zeros at rank 0.
      add('Gather', [`${name}.lora_A`, LORA_INDEX], [`${name}.lora_a_rows`], { attrs: { axis: { int: 0 } } });
      add('Gather', [`${name}.lora_B`, LORA_INDEX], [`${name}.lora_b_rows`], { attrs: { axis: { int: 0 } } });
      add('MatMul', [x, `${name}.lora_a_rows`], [`${name}.lora_xa`]);
      add('MatMul', [`${name}.lora_xa`, `${name}.lora_b_rows`], [`${name}.lora_xab`]);
      add('Add', [`${out}_base`, `${name}.lora_xab`], [out]);
    }
  };
  const norm = (weight: string, x: string, out: string) => {
    inits.push(tensor(weight, dtype, [H], Weights.floats(w.need(weight))));
    add('SimplifiedLayerNormalization', [x, weight], [out], { attrs: { axis: { int: -1 }, epsilon: { float: eps }, stash_type: { int: 1 } } });
  };

  // Sequence lengths from the mask, as genai's graphs take them.
  inits.push(int64s('one', [1n], []), int64s('axis1', [1n]), int64s('last', [-1n]), int64s('end', [2n ** 62n]));
  add('ReduceSum', ['attention_mask', 'axis1'], ['mask_sum'], { attrs: { keepdims: { int: 0 } } });
  add('Sub', ['mask_sum', 'one'], ['seqlens_k_64']);
  add('Cast', ['seqlens_k_64'], ['seqlens_k'], { attrs: { to: { int: ONNX_INT32 } } });
  add('Shape', ['attention_mask'], ['mask_shape']);
  add('Gather', ['mask_shape', 'one'], ['total_64'], { attrs: { axis: { int: 0 } } });
  add('Cast', ['total_64'], ['total_sequence_length'], { attrs: { to: { int: ONNX_INT32 } } });

  // Rotary tables: cos/sin of position x inverse frequency, [positions, head_dim / 2], float32 as torch computes them.
  const theta = cfg.rope_theta ?? 10000;
  const invFreq = Float32Array.from({ length: D / 2 }, (_, i) => 1 / theta ** ((2 * i) / D));
  const cos = new Float32Array(maxPos * (D / 2));
  const sin = new Float32Array(maxPos * (D / 2));
  for (let p = 0; p < maxPos; p++) {
    for (let i = 0; i < D / 2; i++) {
      const f = Math.fround(p * invFreq[i]!);
      cos[p * (D / 2) + i] = Math.cos(f);
      sin[p * (D / 2) + i] = Math.sin(f);
    }
  }
  inits.push(tensor('cos_cache', dtype, [maxPos, D / 2], cos), tensor('sin_cache', dtype, [maxPos, D / 2], sin));

  const embed = Weights.floats(w.need('model.embed_tokens.weight'));
  inits.push(tensor('model.embed_tokens.weight', dtype, [V, H], embed));
  add('Gather', ['model.embed_tokens.weight', 'input_ids'], ['h0'], { attrs: { axis: { int: 0 } } });
  let h = 'h0';
  for (let l = 0; l < L; l++) {
    const p = `model.layers.${l}`;
    norm(`${p}.input_layernorm.weight`, h, `${p}.attn_in`);
    linear(`${p}.self_attn.qkv_proj`, `${p}.attn_in`, `${p}.qkv`, [`${p}.self_attn.q_proj`, `${p}.self_attn.k_proj`, `${p}.self_attn.v_proj`]);
    add('GroupQueryAttention',
      [`${p}.qkv`, '', '', `past_key_values.${l}.key`, `past_key_values.${l}.value`, 'seqlens_k', 'total_sequence_length', 'cos_cache', 'sin_cache'],
      [`${p}.attn`, `present.${l}.key`, `present.${l}.value`],
      { domain: 'com.microsoft', attrs: { num_heads: { int: nh }, kv_num_heads: { int: kvh }, do_rotary: { int: 1 }, rotary_interleaved: { int: 0 } } });
    linear(`${p}.self_attn.o_proj`, `${p}.attn`, `${p}.attn_out`, [`${p}.self_attn.o_proj`]);
    add('Add', [h, `${p}.attn_out`], [`${p}.h_attn`]);
    norm(`${p}.post_attention_layernorm.weight`, `${p}.h_attn`, `${p}.mlp_in`);
    linear(`${p}.mlp.gate_proj`, `${p}.mlp_in`, `${p}.gate`, [`${p}.mlp.gate_proj`]);
    linear(`${p}.mlp.up_proj`, `${p}.mlp_in`, `${p}.up`, [`${p}.mlp.up_proj`]);
    add('Sigmoid', [`${p}.gate`], [`${p}.gate_sig`]);
    add('Mul', [`${p}.gate`, `${p}.gate_sig`], [`${p}.gate_silu`]);
    add('Mul', [`${p}.gate_silu`, `${p}.up`], [`${p}.act`]);
    linear(`${p}.mlp.down_proj`, `${p}.act`, `${p}.mlp_out`, [`${p}.mlp.down_proj`]);
    add('Add', [`${p}.h_attn`, `${p}.mlp_out`], [`${p}.h`]);
    h = `${p}.h`;
  }
  // Only the last position goes through the head: a sampler needs nothing else, and a prompt's logits
  // were most of a prefill's head cost (tokens x vocab x hidden).
  add('Slice', [h, 'last', 'end', 'axis1'], ['h_last']);
  norm('model.norm.weight', 'h_last', 'h_normed');
  const head = w.get('lm_head.weight');
  const headT = stackTransposed([head ? Weights.floats(head) : embed], H);
  inits.push(tensor('lm_head.weight', dtype, [H, V], headT.values));
  add('MatMul', ['h_normed', 'lm_head.weight'], ['logits']);

  const inputs: ValueSpec[] = [
    { name: 'input_ids', elemType: 7, dims: ['batch_size', 'sequence_length'] },
    { name: 'attention_mask', elemType: 7, dims: ['batch_size', 'total_sequence_length'] },
  ];
  const outputs: ValueSpec[] = [{ name: 'logits', elemType: elem, dims: ['batch_size', 1, V] }];
  for (let l = 0; l < L; l++) {
    for (const kv of ['key', 'value']) {
      inputs.push({ name: `past_key_values.${l}.${kv}`, elemType: elem, dims: ['batch_size', kvh, 'past_sequence_length', D] });
      outputs.push({ name: `present.${l}.${kv}`, elemType: elem, dims: ['batch_size', kvh, 'present_sequence_length', D] });
    }
  }
  if (lora) {
    const slots = loraSlots({ numLayers: L, hiddenSize: H, numHeads: nh, numKvHeads: kvh, headDim: D, intermediateSize: cfg.intermediate_size });
    // [rows], or [1] where every row has the same entry: one A and B then broadcast over the batch.
    inputs.push({ name: LORA_INDEX, elemType: 7, dims: ['lora_rows'] });
    for (const s of slots) {
      inputs.push({ name: s.a, elemType: elem, dims: ['lora_entries', s.inDim, `${s.a}.rank`] });
      inputs.push({ name: s.b, elemType: elem, dims: ['lora_entries', `${s.b}.rank`, s.outDim] });
    }
  }
  const genaiConfig = {
    model: {
      type: cfg.model_type ?? 'llama',
      bos_token_id: cfg.bos_token_id ?? null,
      eos_token_id: cfg.eos_token_id ?? null,
      pad_token_id: cfg.pad_token_id ?? null,
      context_length: maxPos,
      vocab_size: V,
      decoder: {
        filename: 'model.onnx',
        head_size: D,
        hidden_size: H,
        num_attention_heads: nh,
        num_key_value_heads: kvh,
        num_hidden_layers: L,
        inputs: { input_ids: 'input_ids', attention_mask: 'attention_mask', past_key_names: 'past_key_values.%d.key', past_value_names: 'past_key_values.%d.value' },
        outputs: { logits: 'logits', present_key_names: 'present.%d.key', present_value_names: 'present.%d.value' },
      },
    },
    search: { past_present_share_buffer: true, max_length: maxPos },
  };
  return { nodes, initializers: inits, inputs, outputs, genaiConfig };
}
