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
 *   outputs logits [b, 1, vocab] (each row's last real position only: all a sampler needs),
 *           greedy_ids [b, 1] int64 (float32 graphs: each row's argmax of its logits),
 *           last_positions [b] int64 (that position: min(s, mask_sum) - 1),
 *           present.N.key|value [b, kv_heads, max(t, capacity), head_dim]
 * seqlens_k (= len_r - 1) and total_sequence_length (= t) come from the mask, as in genai's graphs;
 * positions (for the rotary embedding) from seqlens_k inside the operator.
 *
 * Weights come from a WeightSource by their module names (model.layers.N.self_attn.q_proj.weight, ...):
 * an exported graph's initializers (a '_fp16' suffix and a wrapper prefix are allowed), or a GGUF file
 * (gguf-weights.ts). A source that holds block-quantized projections may hand them over as they are
 * (`weights: 'nbits'`): they become ONNX Runtime's MatMulNBits (com.microsoft), which reads 4 or 8 bits
 * a weight and a scale per block instead of 32 bits a weight.
 *
 * Its parts: the weights it reads and writes (gqa-weights.ts), who runs block products (cpu-kernels.ts).
 */
import { qmatmul4Layout, qmatmul8Layout } from '../qmatmul-layout.js';
import { int64s, ONNX_FLOAT, ONNX_FLOAT16, ONNX_INT32, ONNX_INT64, ONNX_UINT8, type Initializer, type NodeSpec, type ValueSpec } from '../../../runtime/onnx-proto.js';
import { LORA_INDEX, loraSlots } from '../../../generate/lora.js';
import { rotaryFromConfig, type RotaryScaling } from './rope-scaling.js';
import { NBITS_ACCURACY, qmatmulTakes, type CpuKernels } from './cpu-kernels.js';
import { sameBlockForm, stackBlocks, stackTransposed, tensor, Weights, type BlockWeight, type GqaDtype, type WeightSource } from './gqa-weights.js';

export { gqaOpsets, type CpuKernels } from './cpu-kernels.js';
export type { BlockWeight, GqaDtype, WeightSource } from './gqa-weights.js';

/** The output holding each row's argmax of the last logits (float32 graphs built here). */
export const GREEDY_IDS = 'greedy_ids';

/**
 * The output holding the position of each row whose hidden state went through the head: a graph with
 * it takes right-padded prefill rows (each row's mask covering only its real tokens).
 */
export const LAST_POSITIONS = 'last_positions';

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
  /** transformers' rotary scaling (rope-scaling.ts reads it; what it cannot represent is refused). */
  rope_scaling?: unknown;
  rope_parameters?: unknown;
  max_position_embeddings?: number;
  tie_word_embeddings?: boolean;
  bos_token_id?: number | null;
  eos_token_id?: number | number[] | null;
  pad_token_id?: number | null;
}

export interface GqaGraph {
  nodes: NodeSpec[];
  initializers: Initializer[];
  inputs: ValueSpec[];
  outputs: ValueSpec[];
  /** onnxruntime-genai's genai_config.json for this graph. */
  genaiConfig: Record<string, unknown>;
}

export interface GqaOptions {
  dtype?: GqaDtype;
  /**
   * Give every projection a LoRA path, (x A[i]) B[i] with A and B graph inputs holding every adapter
   * slot and i each row's entry in `lora_index` (lora.ts), default true. A run without an adapter feeds
   * rank-0 tensors.
   */
  lora?: boolean;
  /**
   * 'nbits': projections the source stores block-quantized become MatMulNBits (float32 graphs only);
   * 'dequant' (default): every weight a float MatMul's.
   */
  weights?: 'nbits' | 'dequant';
  /**
   * With 'nbits': which kernels run the block products. 'onnxruntime' (default): MatMulNBits.
   * 'ragguard': ragguard's QMatMul8 (8 bits: Q8_0, Q5_0, Q6_K as stored here) and QMatMul4 (4 bits:
   * Q4_0, Q4_1, Q4_K) in domain 'ragguard' (src/backends/ort/ragguard-ops.c): the same values and int8
   * arithmetic, the weights 16 columns side by side; the graph then needs the ops library, which
   * ort-direct.ts registers on every session it makes.
   */
  ops?: CpuKernels;
  /**
   * Rotary scaling, computed into the cos/sin tables: positions divided by `linearFactor`, each
   * frequency i divided by `freqFactors[i]` (Llama 3's, as GGUF stores them in rope_freqs.weight).
   */
  rotary?: RotaryScaling;
  /**
   * The input embedding table's element type in a float32 graph: float32 (default), or float16, gathered
   * and cast to float32 (half the table's bytes; its values, dequantized from 4 to 8 bits a weight, keep
   * 11 bits of mantissa). gguf-decoder.ts asks for float16 only where float32 would not fit one ONNX file
   * (2 GiB): Qwen2.5-Coder-1.5B's 151936 x 1536 table is 0.9 GB in float32.
   */
  embedding?: 'float32' | 'float16';
}

/** The layer a projection belongs to (`model.layers.N` of `model.layers.N.self_attn.q_proj`): its LoRA gathers read that layer's row index. */
function layerOf(projection: string): string {
  const layer = /^model\.layers\.\d+/.exec(projection)?.[0];
  if (!layer) throw new Error(`LoRA projection ${projection} is not in a decoder layer`);
  return layer;
}

export function buildGqaDecoder(cfg: GqaSourceConfig, all: ReadonlyMap<string, Initializer> | WeightSource, opts: GqaOptions = {}): GqaGraph {
  const dtype = opts.dtype ?? 'float32';
  const lora = opts.lora ?? true;
  const w: WeightSource = all instanceof Map ? new Weights(all) : all as WeightSource;
  const nbits = opts.weights === 'nbits' && w.blocks !== undefined;
  if (nbits && dtype !== 'float32') throw new Error('MatMulNBits weights are built into float32 graphs only');
  const need = (name: string): Float32Array => {
    const v = w.floats(name);
    if (!v) throw new Error(`weight ${name} not found among the model's initializers`);
    return v;
  };
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
  /**
   * The block product of `x` by `b` into `out` (plus the blocks' min term where they have one), with
   * `bias` (an initializer's name) added inside the product where given: MatMulNBits, or with
   * `ops: 'ragguard'` QMatMul8 (8 bits) and QMatMul4 (4 bits), which also take the min term. With
   * `withLora`, projection `name`'s LoRA term too: inside the product where the op takes it, else added
   * after it (loraPath). With `glu` (ragguard's kernels only: gluTakes), `out` is the MLP's activation
   * silu(gate) up of the product's two halves, `glu` the activation's LoRA terms (GA, GB, UA, UB) or none.
   * `factors`: the LoRA term's x A and B to take inside (ragguard's kernels), where they are not
   * projection `name`'s own (a part of a fused projection takes its slot's, B sliced to its columns).
   */
  const nbitsMatMul = (name: string, x: string, out: string, b: BlockWeight, bias?: string, withLora = false, glu?: string[], factors?: [string, string]): void => {
    const blocks = b.k / b.blockSize;
    // ragguard's kernels: the same values, scales and zero points, 16 columns side by side (qmatmul-layout.ts says why).
    const ours = opts.ops === 'ragguard' && qmatmulTakes(b);
    if (glu && !(ours && gluTakes(b))) throw new Error(`${name}: the activation inside the product needs ragguard's kernels`);
    const attrs = { K: { int: b.k }, N: { int: b.n }, block_size: { int: b.blockSize }, ...(glu ? { activation: { int: 1 } } : {}) };
    if (ours) {
      // The optional inputs after the required ones, '' where absent, none after the last given. The
      // LoRA term is added inside the product to its columns while they are in cache, and at 4 bits a
      // block's min is in its offset: as nodes of their own each term wrote a [rows, n] tensor and an Add
      // read it back (at a 1,280-token prefill of Qwen2.5-Coder-1.5B, about a fifth of the prefill's
      // time, most of it the min term of the MLP's 17,920 columns).
      const [xa, bRows] = factors ?? (withLora ? loraFactors(name, x) : ['', '']);
      const optional = [bias ?? '', xa, bRows, ...(glu ?? [])];
      while (optional.at(-1) === '') optional.pop();
      if (b.bits === 8) {
        // (no 8-bit block form read here has a min; one would keep the min term's nodes)
        const product = b.mins ? `${out}_q` : out;
        const packed = qmatmul8Layout(b);
        inits.push({ name: `${name}.qweight`, dataType: ONNX_UINT8, dims: [packed.groups, b.k / 4, 64], data: packed.q });
        inits.push(tensor(`${name}.scales`, dtype, [packed.groups, blocks, 16], packed.scales));
        add('QMatMul8', [x, `${name}.qweight`, `${name}.scales`, ...optional], [product], { domain: 'ragguard', attrs });
        if (b.mins) minTerm(name, x, out, product, { ...b, mins: b.mins });
      } else {
        const packed = qmatmul4Layout(b);
        inits.push({ name: `${name}.qweight`, dataType: ONNX_UINT8, dims: [packed.groups, b.k / 8, 64], data: packed.q });
        inits.push(tensor(`${name}.scales`, dtype, [packed.groups, blocks, 16], packed.scales));
        inits.push(tensor(`${name}.offsets`, dtype, [packed.groups, blocks, 16], packed.offsets));
        add('QMatMul4', [x, `${name}.qweight`, `${name}.scales`, `${name}.offsets`, ...optional], [out], { domain: 'ragguard', attrs });
      }
      return;
    }
    const base = withLora ? `${out}_base` : out;
    const product = b.mins ? `${base}_q` : base;
    nbitsNode(name, x, product, b, bias);
    if (b.mins) minTerm(name, x, base, product, { ...b, mins: b.mins });
    if (withLora) loraPath(name, x, out);
  };
  /**
   * Whether QMatMul can take the MLP's activation over the gate-and-up blocks `b`: halves of whole
   * 16-column groups, and no min term left outside the product (an 8-bit form with a min; none here).
   */
  const gluTakes = (b: BlockWeight): boolean => b.n % 32 === 0 && !(b.bits === 8 && b.mins);
  /** MatMulNBits of `x` by `b` into `out`, with `bias` (an initializer's name) inside where given. */
  const nbitsNode = (name: string, x: string, out: string, b: BlockWeight, bias?: string) => {
    const blocks = b.k / b.blockSize;
    inits.push({ name: `${name}.qweight`, dataType: ONNX_UINT8, dims: [b.n, blocks, (b.blockSize * b.bits) / 8], data: b.data });
    inits.push(tensor(`${name}.scales`, dtype, [b.n, blocks], b.scales));
    const ins = [x, `${name}.qweight`, `${name}.scales`];
    // 4 bits: zero points always given (the default 8 where the blocks have none): measured at accuracy
    // level 4, a 4864 x 896 product took 0.25 ms at 1 row with them and 0.31 without (0.96 and 1.01 at 8).
    // 8 bits: none where the blocks have the default 128 (Q8_0, and Q5_0 and Q6_K as gguf-weights.ts
    // stores them): measured, the 8-bit kernel (accuracy level 4) ran a 4864 x 896 product 10-15 %
    // faster without them, and packs no zero-point term.
    if (b.bits === 4 || b.zeroPoints) {
      const zpBytes = b.n * Math.ceil((blocks * b.bits) / 8);
      inits.push({ name: `${name}.zero_points`, dataType: ONNX_UINT8, dims: [b.n, zpBytes / b.n], data: b.zeroPoints ?? new Uint8Array(zpBytes).fill(0x88) });
      ins.push(`${name}.zero_points`);
    }
    // The bias is MatMulNBits' sixth input (after the zero points and g_idx, absent here): one node
    // fewer per biased projection (qwen2's q/k/v) than a separate Add.
    if (bias) ins.push(...new Array<string>(5 - ins.length).fill(''), bias);
    const attrs = { K: { int: b.k }, N: { int: b.n }, bits: { int: b.bits }, block_size: { int: b.blockSize }, accuracy_level: { int: NBITS_ACCURACY } };
    add('MatMulNBits', ins, [out], { domain: 'com.microsoft', attrs });
  };
  /**
   * The blocks' min term beside their product `product`, into `out`: sum_k w[n][k] x[k] = sum_blocks
   * (scale * sum (q - zp) x + min * sum_block x): the block sums of x, [.., blocks], times the mins
   * transposed, [blocks, n].
   */
  const minTerm = (name: string, x: string, out: string, product: string, b: BlockWeight & { mins: Float32Array }) => {
    const blocks = b.k / b.blockSize;
    const minsT = new Float32Array(blocks * b.n);
    for (let r = 0; r < b.n; r++) for (let j = 0; j < blocks; j++) minsT[j * b.n + r] = b.mins[r * blocks + j]!;
    inits.push(tensor(`${name}.mins`, dtype, [blocks, b.n], minsT));
    if (!inits.some((t) => t.name === `block_shape_${b.k}_${b.blockSize}`)) inits.push(int64s(`block_shape_${b.k}_${b.blockSize}`, [0n, 0n, BigInt(blocks), BigInt(b.blockSize)]));
    add('Reshape', [x, `block_shape_${b.k}_${b.blockSize}`], [`${name}.x_blocks`]);
    if (!inits.some((t) => t.name === 'last')) inits.push(int64s('last', [-1n]));
    add('ReduceSum', [`${name}.x_blocks`, 'last'], [`${name}.x_block_sums`], { attrs: { keepdims: { int: 0 } } });
    add('MatMul', [`${name}.x_block_sums`, `${name}.mins`], [`${out}_min`]);
    add('Add', [product, `${out}_min`], [out]);
  };
  /**
   * x times the parts' weights side by side: one MatMulNBits where they share a block form, else one
   * node each and a Concat. `bias` (made on demand: an initializer's name) is added inside a single
   * MatMulNBits, else by an Add after the product. With `withLora`, projection `name`'s LoRA term as
   * nbitsMatMul adds it.
   */
  const projection = (name: string, x: string, out: string, parts: string[], bias?: () => string, withLora = false): void => {
    const qs = nbits ? parts.map((p) => w.blocks!(`${p}.weight`)) : [];
    if (nbits && qs.every((q) => q !== undefined) && qs.every((q) => sameBlockForm(q!, qs[0]!))) {
      nbitsMatMul(name, x, out, stackBlocks(qs as BlockWeight[]), bias?.(), withLora);
      return;
    }
    if (opts.ops === 'ragguard' && nbits && qs.every((q) => q !== undefined && qmatmulTakes(q))) {
      // Parts of other block forms (Q4_K_M's q and k in Q4_K beside v in Q6_K): each part's QMatMul takes its
      // own bias and its columns of the slot's LoRA term inside, and only the Concat is left. As nodes after
      // the Concat, the bias's Add, the LoRA term's MatMul (writing zeros at rank 0) and its Add each wrote a
      // [rows, q + k + v] tensor: 0.13 s of a 1,280-token prefill of the 1.5B.
      const [xa, bRows] = withLora ? loraFactors(name, x) : ['', ''];
      let col = 0;
      parts.forEach((part, i) => {
        const q = qs[i]!;
        const partBias = w.floats(`${part}.bias`);
        if (partBias) inits.push(tensor(`${name}.${i}.bias`, dtype, [q.n], partBias));
        let partFactors: [string, string] | undefined;
        if (withLora) {
          inits.push(int64s(`${name}.${i}.col0`, [BigInt(col)]), int64s(`${name}.${i}.col1`, [BigInt(col + q.n)]));
          if (!inits.some((t) => t.name === 'axis_2')) inits.push(int64s('axis_2', [2n]));
          add('Slice', [bRows, `${name}.${i}.col0`, `${name}.${i}.col1`, 'axis_2'], [`${bRows}.${i}`]);
          partFactors = [xa, `${bRows}.${i}`];
        }
        nbitsMatMul(`${name}.${i}`, x, `${out}.${i}`, q, partBias ? `${name}.${i}.bias` : undefined, false, undefined, partFactors);
        col += q.n;
      });
      add('Concat', parts.map((_p, i) => `${out}.${i}`), [out], { attrs: { axis: { int: -1 } } });
      return;
    }
    const base = withLora ? `${out}_base` : out;
    const product = bias ? `${base}_nobias` : base;
    if (nbits && qs.some((q) => q !== undefined)) {
      parts.forEach((p, i) => projection(`${name}.${i}`, x, `${product}.${i}`, [p]));
      add('Concat', parts.map((_p, i) => `${product}.${i}`), [product], { attrs: { axis: { int: -1 } } });
    } else {
      const inDim = inDimOf(parts[0]!);
      const { values, outDim } = stackTransposed(parts.map((p) => need(`${p}.weight`)), inDim);
      inits.push(tensor(`${name}.weight`, dtype, [inDim, outDim], values));
      add('MatMul', [x, `${name}.weight`], [product]);
    }
    if (bias) add('Add', [product, bias()], [base]);
    if (withLora) loraPath(name, x, out);
  };
  const linear = (name: string, x: string, out: string, parts: string[]) => {
    const bs = parts.map((p) => w.floats(`${p}.bias`));
    const hasBias = bs.some((b) => b !== undefined);
    // The parts' biases side by side, as one initializer (made when the projection takes it, or after).
    const biasInit = () => {
      const rowsOf = parts.map((p) => w.rows?.(`${p}.weight`) ?? need(`${p}.weight`).length / inDimOf(p));
      const bias = new Float32Array(rowsOf.reduce((a, b) => a + b, 0));
      let at = 0;
      parts.forEach((_p, i) => {
        if (bs[i]) bias.set(bs[i], at);
        at += rowsOf[i]!;
      });
      inits.push(tensor(`${name}.bias`, dtype, [bias.length], bias));
      return `${name}.bias`;
    };
    // The LoRA term inside the product where the product takes it (ragguard's ops), else added after it.
    projection(name, x, out, parts, hasBias ? biasInit : undefined, lora);
  };
  /**
   * The low-rank term of projection `name` on `x` into `${name}.lora_xab` (returned): each row's entry of
   * A and B ([b, in, r], [b, r, out], alive only for this projection), then [b, s, in] x [b, in, r] ->
   * [b, s, r] x [b, r, out]; zeros at rank 0.
   */
  const loraTerm = (name: string, x: string): string => {
    const [xa, bRows] = loraFactors(name, x);
    add('MatMul', [xa, bRows], [`${name}.lora_xab`]);
    return `${name}.lora_xab`;
  };
  /** The low-rank term's first product and its second factor: x A ([b, s, r]) and B ([b, r, out]), names returned. */
  const loraFactors = (name: string, x: string): [string, string] => {
    const index = `${layerOf(name)}.lora_index`;
    add('Gather', [`${name}.lora_A`, index], [`${name}.lora_a_rows`], { attrs: { axis: { int: 0 } } });
    add('Gather', [`${name}.lora_B`, index], [`${name}.lora_b_rows`], { attrs: { axis: { int: 0 } } });
    add('MatMul', [x, `${name}.lora_a_rows`], [`${name}.lora_xa`]);
    return [`${name}.lora_xa`, `${name}.lora_b_rows`];
  };
  /** The LoRA path of projection `name` on `x`, added to `${out}_base` into `out` (nothing without LoRA). */
  const loraPath = (name: string, x: string, out: string) => {
    if (lora) add('Add', [`${out}_base`, loraTerm(name, x)], [out]);
  };
  const norm = (weight: string, x: string, out: string) => {
    inits.push(tensor(weight, dtype, [H], need(weight)));
    add('SimplifiedLayerNormalization', [x, weight], [out], { attrs: { axis: { int: -1 }, epsilon: { float: eps }, stash_type: { int: 1 } } });
  };

  // Sequence lengths from the mask, as genai's graphs take them.
  inits.push(int64s('one', [1n], []), int64s('axis1', [1n]));
  add('ReduceSum', ['attention_mask', 'axis1'], ['mask_sum'], { attrs: { keepdims: { int: 0 } } });
  add('Sub', ['mask_sum', 'one'], ['seqlens_k_64']);
  add('Cast', ['seqlens_k_64'], ['seqlens_k'], { attrs: { to: { int: ONNX_INT32 } } });
  add('Shape', ['attention_mask'], ['mask_shape']);
  add('Gather', ['mask_shape', 'one'], ['total_64'], { attrs: { axis: { int: 0 } } });
  add('Cast', ['total_64'], ['total_sequence_length'], { attrs: { to: { int: ONNX_INT32 } } });

  // Rotary tables: cos/sin of position x inverse frequency, [positions, head_dim / 2], float32 as torch computes them.
  // The caller's rotary scaling (a GGUF's), else config.json's: never dropped silently.
  const fromConfig = opts.rotary ? undefined : rotaryFromConfig(cfg, D);
  const rotary = opts.rotary ?? fromConfig!.rotary;
  const theta = fromConfig?.theta ?? cfg.rope_theta ?? 10000;
  const linearFactor = rotary.linearFactor ?? 1;
  const freqFactors = rotary.freqFactors;
  if (freqFactors && freqFactors.length !== D / 2) throw new Error(`${freqFactors.length} rotary frequency factors for head_dim ${D}`);
  const invFreq = Float32Array.from({ length: D / 2 }, (_, i) => 1 / theta ** ((2 * i) / D) / (freqFactors?.[i] ?? 1) / linearFactor);
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

  const embed = need('model.embed_tokens.weight');
  if (opts.embedding === 'float16' && dtype === 'float32') {
    inits.push(tensor('model.embed_tokens.weight', 'float16', [V, H], embed));
    add('Gather', ['model.embed_tokens.weight', 'input_ids'], ['h0_half'], { attrs: { axis: { int: 0 } } });
    add('Cast', ['h0_half'], ['h0'], { attrs: { to: { int: ONNX_FLOAT } } });
  } else {
    inits.push(tensor('model.embed_tokens.weight', dtype, [V, H], embed));
    add('Gather', ['model.embed_tokens.weight', 'input_ids'], ['h0'], { attrs: { axis: { int: 0 } } });
  }
  let h = 'h0';
  for (let l = 0; l < L; l++) {
    const p = `model.layers.${l}`;
    if (lora) {
      // The layer's own copy of the row index, made from the layer's input (lora_index + 0, the 0 from its
      // shape), so that the layer's gathers of A and B cannot run before the layer does: on graph inputs
      // alone, ONNX Runtime's order ran many of them early and held them, about 28 MiB of gathered slots
      // at once on Qwen2.5-Coder-1.5B that the memory model's one-projection term (loraRows) did not hold.
      add('Shape', [h], [`${p}.rows_shape`], { attrs: { start: { int: 0 }, end: { int: 1 } } });
      add('Sub', [`${p}.rows_shape`, `${p}.rows_shape`], [`${p}.rows_zero`]);
      add('Add', [LORA_INDEX, `${p}.rows_zero`], [`${p}.lora_index`]);
    }
    norm(`${p}.input_layernorm.weight`, h, `${p}.attn_in`);
    linear(`${p}.self_attn.qkv_proj`, `${p}.attn_in`, `${p}.qkv`, [`${p}.self_attn.q_proj`, `${p}.self_attn.k_proj`, `${p}.self_attn.v_proj`]);
    // ragguard's GroupQueryAttention (ragguard-ops.c, attention.c): com.microsoft's for these inputs, the
    // causal half only and no score matrix; ONNX Runtime's CPU kernel multiplies every query by every key
    // of the buffer into a [heads, new, buffer] matrix (at a 2,048-token prefill of the 1.5B, 207 MB a
    // layer and 2.5 of its 9.4 s).
    add('GroupQueryAttention',
      [`${p}.qkv`, '', '', `past_key_values.${l}.key`, `past_key_values.${l}.value`, 'seqlens_k', 'total_sequence_length', 'cos_cache', 'sin_cache'],
      [`${p}.attn`, `present.${l}.key`, `present.${l}.value`],
      { domain: opts.ops === 'ragguard' && dtype === 'float32' ? 'ragguard' : 'com.microsoft', attrs: { num_heads: { int: nh }, kv_num_heads: { int: kvh }, do_rotary: { int: 1 }, rotary_interleaved: { int: 0 } } });
    linear(`${p}.self_attn.o_proj`, `${p}.attn`, `${p}.attn_out`, [`${p}.self_attn.o_proj`]);
    add('Add', [h, `${p}.attn_out`], [`${p}.h_attn`]);
    norm(`${p}.post_attention_layernorm.weight`, `${p}.h_attn`, `${p}.mlp_in`);
    const gateBlocks = nbits ? w.blocks!(`${p}.mlp.gate_proj.weight`) : undefined;
    const upBlocks = nbits ? w.blocks!(`${p}.mlp.up_proj.weight`) : undefined;
    const mlpBias = w.floats(`${p}.mlp.gate_proj.bias`) ?? w.floats(`${p}.mlp.up_proj.bias`);
    if (gateBlocks && upBlocks && sameBlockForm(gateBlocks, upBlocks) && !mlpBias) {
      // gate and up as one MatMulNBits (same input, same block form), split after: one product of
      // 2 x intermediate columns instead of two, which ONNX Runtime spreads over its threads better.
      const I = cfg.intermediate_size;
      const stacked = stackBlocks([gateBlocks, upBlocks]);
      if (opts.ops === 'ragguard' && qmatmulTakes(stacked) && gluTakes(stacked)) {
        // The activation inside the product (QMatMul's activation 1): on AMX-BF16 a prefill's gate and up
        // sums go straight into silu(gate) up, and the [rows, 2 I] product is never written (at 2,048
        // tokens of the 1.5B, 147 MB of fresh memory a layer, then read back by SwiGlu); elsewhere the op
        // runs the product and SwiGlu's pass itself.
        const terms = lora ? [...loraFactors(`${p}.mlp.gate_proj`, `${p}.mlp_in`), ...loraFactors(`${p}.mlp.up_proj`, `${p}.mlp_in`)] : [];
        nbitsMatMul(`${p}.mlp.gate_up_proj`, `${p}.mlp_in`, `${p}.act`, stacked, undefined, false, terms);
        linear(`${p}.mlp.down_proj`, `${p}.act`, `${p}.mlp_out`, [`${p}.mlp.down_proj`]);
        add('Add', [`${p}.h_attn`, `${p}.mlp_out`], [`${p}.h`]);
        h = `${p}.h`;
        continue;
      }
      nbitsMatMul(`${p}.mlp.gate_up_proj`, `${p}.mlp_in`, `${p}.gate_up`, stacked);
      if (opts.ops === 'ragguard') {
        // ragguard's SwiGlu (ragguard-ops.c): silu(gate + its LoRA term) x (up + its LoRA term) in one pass
        // over the product, the terms' second products (x A times B) taken inside it (none at rank 0), where
        // the Split, those MatMuls, the LoRA Adds, Sigmoid and the two Muls each wrote a tensor of their own
        // (at a 2,048-token prefill, 40 MB a layer each: most of the prefill's time outside the products
        // and the attention).
        const terms = lora ? [...loraFactors(`${p}.mlp.gate_proj`, `${p}.mlp_in`), ...loraFactors(`${p}.mlp.up_proj`, `${p}.mlp_in`)] : [];
        add('SwiGlu', [`${p}.gate_up`, ...terms], [`${p}.act`], { domain: 'ragguard' });
        linear(`${p}.mlp.down_proj`, `${p}.act`, `${p}.mlp_out`, [`${p}.mlp.down_proj`]);
        add('Add', [`${p}.h_attn`, `${p}.mlp_out`], [`${p}.h`]);
        h = `${p}.h`;
        continue;
      }
      if (!inits.some((t) => t.name === `split_${I}_${I}`)) inits.push(int64s(`split_${I}_${I}`, [BigInt(I), BigInt(I)]));
      add('Split', [`${p}.gate_up`, `split_${I}_${I}`], lora ? [`${p}.gate_base`, `${p}.up_base`] : [`${p}.gate`, `${p}.up`], { attrs: { axis: { int: -1 } } });
      loraPath(`${p}.mlp.gate_proj`, `${p}.mlp_in`, `${p}.gate`);
      loraPath(`${p}.mlp.up_proj`, `${p}.mlp_in`, `${p}.up`);
    } else {
      linear(`${p}.mlp.gate_proj`, `${p}.mlp_in`, `${p}.gate`, [`${p}.mlp.gate_proj`]);
      linear(`${p}.mlp.up_proj`, `${p}.mlp_in`, `${p}.up`, [`${p}.mlp.up_proj`]);
    }
    add('Sigmoid', [`${p}.gate`], [`${p}.gate_sig`]);
    add('Mul', [`${p}.gate`, `${p}.gate_sig`], [`${p}.gate_silu`]);
    add('Mul', [`${p}.gate_silu`, `${p}.up`], [`${p}.act`]);
    linear(`${p}.mlp.down_proj`, `${p}.act`, `${p}.mlp_out`, [`${p}.mlp.down_proj`]);
    add('Add', [`${p}.h_attn`, `${p}.mlp_out`], [`${p}.h`]);
    h = `${p}.h`;
  }
  // Only each row's last real position goes through the head: a sampler needs nothing else, and a
  // prompt's logits were most of a prefill's head cost (tokens x vocab x hidden). That position is
  // min(s - 1, mask_sum - 1): s - 1 for a decode step and for any row whose mask covers all s new
  // tokens, and len - 1 for a row of a batched prefill right-padded to s (past 0, mask over its len
  // real tokens), whose last position is a pad. The positions are an output too (LAST_POSITIONS):
  // DecoderModel batches padded prefills only on graphs that have it (an older graph sliced the last
  // position, a pad for such a row).
  add('Shape', ['input_ids'], ['ids_shape']);
  add('Gather', ['ids_shape', 'one'], ['new_tokens'], { attrs: { axis: { int: 0 } } });
  add('Sub', ['new_tokens', 'one'], ['new_last']);
  add('Min', ['seqlens_k_64', 'new_last'], [LAST_POSITIONS]);
  add('Unsqueeze', [LAST_POSITIONS, 'axis1'], ['last_index']);
  add('GatherND', [h, 'last_index'], ['h_last_rows'], { attrs: { batch_dims: { int: 1 } } });
  add('Unsqueeze', ['h_last_rows', 'axis1'], ['h_last']);
  norm('model.norm.weight', 'h_last', 'h_normed');
  // The head: lm_head, or the embedding where the model ties them.
  const headName = (w.rows?.('lm_head.weight') ?? w.floats('lm_head.weight')) !== undefined ? 'lm_head' : 'model.embed_tokens';
  const headBlocks = nbits ? w.blocks!(`${headName}.weight`) : undefined;
  if (headBlocks) nbitsMatMul('lm_head', 'h_normed', 'logits', headBlocks);
  else {
    const headT = stackTransposed([headName === 'lm_head' ? need('lm_head.weight') : embed], H);
    inits.push(tensor('lm_head.weight', dtype, [H, V], headT.values));
    add('MatMul', ['h_normed', 'lm_head.weight'], ['logits']);
  }
  // Each row's greedy token, taken in the graph: the same first index of the largest logit as the
  // sampler's argmax, on ONNX Runtime's threads instead of the event loop's, where a batch of 8 rows
  // scanning 152k logits each took 4-5 ms of every decode step (up to 5 % of it). float32 only: a float16
  // graph runs where the logits come back to the host as floats anyway.
  if (dtype === 'float32') add('ArgMax', ['logits'], [GREEDY_IDS], { attrs: { axis: { int: -1 }, keepdims: { int: 0 } } });

  const inputs: ValueSpec[] = [
    { name: 'input_ids', elemType: 7, dims: ['batch_size', 'sequence_length'] },
    { name: 'attention_mask', elemType: 7, dims: ['batch_size', 'total_sequence_length'] },
  ];
  const outputs: ValueSpec[] = [{ name: 'logits', elemType: elem, dims: ['batch_size', 1, V] }];
  if (dtype === 'float32') outputs.push({ name: GREEDY_IDS, elemType: ONNX_INT64, dims: ['batch_size', 1] });
  outputs.push({ name: LAST_POSITIONS, elemType: ONNX_INT64, dims: ['batch_size'] });
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
