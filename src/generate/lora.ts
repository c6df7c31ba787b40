/**
 * LoRA adapters in the decoder's graph, the way vLLM serves many at once (punica/S-LoRA): the weights
 * of every resident adapter sit in preallocated slots, and each row of a batch picks its own by index.
 *
 * The graph (gqa-builder.ts) adds to each projection y = x W the low-rank path (x A[i]) B[i], where A and
 * B are graph inputs holding every slot, [entries, in, capacity] and [entries, capacity, out], and i is
 * the row's entry in `lora_index` [rows] (a Gather inside the graph picks each row's A and B, one
 * projection at a time). Entry 0 is zeros: the base model's rows. A run where no row has an adapter feeds
 * rank-0 tensors ([1, in, 0], [1, 0, out]) instead, whose path costs next to nothing. So a batch that mixes
 * adapters and the base model decodes in one run, and the slots' memory is fixed at start-up
 * (RAGGUARD_MAX_LORAS x RAGGUARD_MAX_LORA_RANK), counted like the KV pool, whatever the requests do.
 *
 * PEFT's files (adapter_config.json, adapter_model.safetensors) convert here: lora_A [r, in] and
 * lora_B [out, r] per module, scaled by lora_alpha / r (or / sqrt(r) with use_rslora). The graph fuses
 * q, k and v into one projection, so their A's are concatenated along the rank and their B's placed
 * block-diagonally: (x [A_q A_k A_v]) diag(B_q, B_k, B_v) = [x A_q B_q, x A_k B_k, x A_v B_v]. A rank
 * below the slot's capacity is zero-padded, which adds nothing.
 */

import type { DecoderShape } from './decoder-shape.js';

export type LoraProjection = 'self_attn.qkv_proj' | 'self_attn.o_proj' | 'mlp.gate_proj' | 'mlp.up_proj' | 'mlp.down_proj';

/** The PEFT (transformers) modules each graph projection computes, in the order of its output columns. */
export const PROJECTION_MODULES: Readonly<Record<LoraProjection, readonly string[]>> = {
  'self_attn.qkv_proj': ['self_attn.q_proj', 'self_attn.k_proj', 'self_attn.v_proj'],
  'self_attn.o_proj': ['self_attn.o_proj'],
  'mlp.gate_proj': ['mlp.gate_proj'],
  'mlp.up_proj': ['mlp.up_proj'],
  'mlp.down_proj': ['mlp.down_proj'],
};

/** The decoder's dimensions the LoRA slots follow. */
export type LoraShape = Pick<DecoderShape, 'numLayers' | 'hiddenSize' | 'numHeads' | 'numKvHeads' | 'headDim' | 'intermediateSize'>;

/** One projection's pair of graph inputs. */
export interface LoraSlot {
  layer: number;
  projection: LoraProjection;
  /** Graph input names: A [rows, in, rank], B [rows, rank, out]. */
  a: string;
  b: string;
  inDim: number;
  /** Output width of each fused module (PROJECTION_MODULES order). */
  outDims: readonly number[];
  /** B's width: the fused modules' outputs side by side. */
  outDim: number;
}

/** The graph input naming each row's slot entry, [rows] int64 (0: the base model). */
export const LORA_INDEX = 'lora_index';

/** Rank capacity of a slot: the fused modules' ranks side by side, each at most `maxRank`. */
export function slotCapacity(slot: LoraSlot, maxRank: number): number {
  return slot.outDims.length * maxRank;
}

export function loraInputName(layer: number, projection: LoraProjection, which: 'A' | 'B'): string {
  return `model.layers.${layer}.${projection}.lora_${which}`;
}

/** Every projection's slot, in graph order. */
export function loraSlots(s: LoraShape): LoraSlot[] {
  const q = s.numHeads * s.headDim;
  const kv = s.numKvHeads * s.headDim;
  const dims: Record<LoraProjection, [number, number[]]> = {
    'self_attn.qkv_proj': [s.hiddenSize, [q, kv, kv]],
    'self_attn.o_proj': [q, [s.hiddenSize]],
    'mlp.gate_proj': [s.hiddenSize, [s.intermediateSize]],
    'mlp.up_proj': [s.hiddenSize, [s.intermediateSize]],
    'mlp.down_proj': [s.intermediateSize, [s.hiddenSize]],
  };
  const slots: LoraSlot[] = [];
  for (let layer = 0; layer < s.numLayers; layer++) {
    for (const projection of Object.keys(PROJECTION_MODULES) as LoraProjection[]) {
      const [inDim, outDims] = dims[projection];
      const outDim = outDims.reduce((x, y) => x + y, 0);
      slots.push({ layer, projection, a: loraInputName(layer, projection, 'A'), b: loraInputName(layer, projection, 'B'), inDim, outDims, outDim });
    }
  }
  return slots;
}

/** adapter_config.json as PEFT writes it (the fields read here). */
export interface PeftConfig {
  peft_type?: string;
  r?: number;
  lora_alpha?: number;
  use_rslora?: boolean;
  use_dora?: boolean;
  fan_in_fan_out?: boolean;
  alpha_pattern?: Record<string, number>;
  base_model_name_or_path?: string | null;
  target_modules?: string[] | string | null;
  /** Variants that change what a LoRA computes; refused where set. */
  lora_bias?: boolean;
  use_qalora?: boolean;
  alora_invocation_tokens?: unknown;
  layer_replication?: unknown;
  trainable_token_indices?: unknown;
}

export class AdapterInvalidError extends Error {}

/** One PEFT module's pair inside a slot: its tensors' names, rank and scale. */
export interface ModulePlan {
  module: string;
  /** Position among the slot's fused modules (column block of B). */
  part: number;
  keyA: string;
  keyB: string;
  rank: number;
  scale: number;
}

export interface SlotPlan {
  slot: LoraSlot;
  modules: ModulePlan[];
  /** The slot's rank: its modules' ranks summed. */
  rank: number;
}

/** What an adapter adds to the graph, known from its config and its file's header alone. */
export interface AdapterPlan {
  slots: SlotPlan[];
  /** The largest slot rank (a run's low-rank activations are [tokens, rank] per projection). */
  maxRank: number;
  /** Elements of all its A and B inputs (x the decoder's element bytes = its bytes in the graph). */
  elements: number;
}

const KEY = /(?:^|\.)layers\.(\d+)\.((?:self_attn|mlp)\.\w+)\.lora_(A|B)(?:\.[\w-]+)?\.weight$/;

/** PEFT's pattern match: a key matches a module name that is it or ends with '.key' (keys are regexes). */
function patternValue(patterns: Record<string, number> | undefined, module: string): number | undefined {
  for (const [k, v] of Object.entries(patterns ?? {})) if (new RegExp(`(.*\\.)?${k}$`).test(module)) return v;
  return undefined;
}

/**
 * Maps a PEFT adapter's tensors (names and shapes from the safetensors header) onto the graph's slots,
 * checking that each fits the base model: unknown modules, DoRA, biases or shapes of another model
 * are refused with why.
 */
export function planAdapter(cfg: PeftConfig, tensors: ReadonlyMap<string, { shape: readonly number[] }>, shape: LoraShape, maxRank = Infinity): AdapterPlan {
  if (cfg.peft_type !== undefined && cfg.peft_type !== 'LORA') throw new AdapterInvalidError(`peft_type ${cfg.peft_type}: only LORA adapters run here`);
  if (cfg.use_dora) throw new AdapterInvalidError('DoRA adapters (use_dora) are not supported');
  if (cfg.fan_in_fan_out) throw new AdapterInvalidError('fan_in_fan_out adapters (Conv1D bases) are not supported');
  for (const k of ['lora_bias', 'use_qalora', 'alora_invocation_tokens', 'layer_replication', 'trainable_token_indices'] as const) {
    const v = cfg[k];
    if (v !== undefined && v !== null && v !== false) throw new AdapterInvalidError(`${k} adapters are not supported (it changes what the LoRA computes)`);
  }
  const slots = loraSlots(shape);
  const bySlot = new Map<string, LoraSlot>(slots.map((s) => [`${s.layer}.${s.projection}`, s]));
  const pairs = new Map<string, { layer: number; module: string; A?: string; B?: string }>();
  for (const name of tensors.keys()) {
    const m = KEY.exec(name);
    if (!m) throw new AdapterInvalidError(`tensor ${name} is not a LoRA A/B weight of a decoder layer's projection (biases, embeddings and modules_to_save are not supported)`);
    const key = `${m[1]}.${m[2]}`;
    const p = pairs.get(key) ?? { layer: Number(m[1]), module: m[2]! };
    p[m[3] as 'A' | 'B'] = name;
    pairs.set(key, p);
  }
  if (pairs.size === 0) throw new AdapterInvalidError('the adapter has no LoRA weights');
  const plans = new Map<LoraSlot, ModulePlan[]>();
  for (const p of pairs.values()) {
    if (!p.A || !p.B) throw new AdapterInvalidError(`layer ${p.layer} ${p.module}: lora_A and lora_B come in pairs`);
    const projection = (Object.keys(PROJECTION_MODULES) as LoraProjection[]).find((pr) => PROJECTION_MODULES[pr].includes(p.module));
    const slot = projection && bySlot.get(`${p.layer}.${projection}`);
    if (!slot) throw new AdapterInvalidError(`layer ${p.layer} ${p.module}: no such projection in this decoder (${shape.numLayers} layers)`);
    const part = PROJECTION_MODULES[slot.projection].indexOf(p.module);
    const [rank, inDim] = tensors.get(p.A)!.shape as [number, number];
    const [outDim, rankB] = tensors.get(p.B)!.shape as [number, number];
    const want = `[r, ${slot.inDim}] and [${slot.outDims[part]}, r]`;
    if (tensors.get(p.A)!.shape.length !== 2 || tensors.get(p.B)!.shape.length !== 2 || inDim !== slot.inDim || outDim !== slot.outDims[part] || rankB !== rank || rank < 1) {
      throw new AdapterInvalidError(`layer ${p.layer} ${p.module}: lora_A [${tensors.get(p.A)!.shape.join(', ')}] and lora_B [${tensors.get(p.B)!.shape.join(', ')}]; this decoder takes ${want}: an adapter trained for another base model`);
    }
    if (rank > maxRank) throw new AdapterInvalidError(`layer ${p.layer} ${p.module}: rank ${rank} exceeds the slots' ${maxRank} (RAGGUARD_MAX_LORA_RANK)`);
    const fullName = `model.layers.${p.layer}.${p.module}`;
    const alpha = patternValue(cfg.alpha_pattern, fullName) ?? cfg.lora_alpha ?? cfg.r ?? rank;
    const scale = alpha / (cfg.use_rslora ? Math.sqrt(rank) : rank);
    const list = plans.get(slot) ?? [];
    list.push({ module: p.module, part, keyA: p.A, keyB: p.B, rank, scale });
    plans.set(slot, list);
  }
  const planned: SlotPlan[] = slots.filter((s) => plans.has(s)).map((slot) => {
    const modules = plans.get(slot)!.sort((x, y) => x.part - y.part);
    return { slot, modules, rank: modules.reduce((t, m) => t + m.rank, 0) };
  });
  const sum = (xs: readonly number[]) => xs.reduce((a, b) => a + b, 0);
  return {
    slots: planned,
    maxRank: Math.max(...planned.map((p) => p.rank)),
    elements: sum(planned.map((p) => p.rank * (p.slot.inDim + p.slot.outDim))),
  };
}

/** A slot's graph tensors: A [1, in, rank], B [1, rank, out] (scale folded into B), float32. */
export interface SlotTensors {
  slot: LoraSlot;
  rank: number;
  a: Float32Array;
  b: Float32Array;
}

/** The graph tensors of a planned adapter, from its PEFT tensors' values. */
export function slotTensors(plan: AdapterPlan, values: ReadonlyMap<string, Float32Array>): SlotTensors[] {
  return plan.slots.map(({ slot, modules, rank: R }) => {
    const inDim = slot.inDim;
    const outTotal = slot.outDim;
    const a = new Float32Array(inDim * R);
    const b = new Float32Array(R * outTotal);
    let r0 = 0;
    for (const m of modules) {
      const A = values.get(m.keyA)!; // [r, in]
      const B = values.get(m.keyB)!; // [out_part, r]
      const col0 = slot.outDims.slice(0, m.part).reduce((x, y) => x + y, 0);
      const out = slot.outDims[m.part]!;
      for (let r = 0; r < m.rank; r++) {
        for (let i = 0; i < inDim; i++) a[i * R + r0 + r] = A[r * inDim + i]!;
        for (let o = 0; o < out; o++) b[(r0 + r) * outTotal + col0 + o] = m.scale * B[o * m.rank + r]!;
      }
      r0 += m.rank;
    }
    return { slot, rank: R, a, b };
  });
}

type Elements = Float32Array | Uint16Array;

/**
 * Writes one entry of a slot's A ([entries, in, capacity]) or B ([entries, capacity, out]) input: `data`
 * ([in, rank] or [rank, out]) with its rank zero-padded to the capacity; no data: zeros.
 */
export function writeEntry<T extends Elements>(out: T, entry: number, which: 'A' | 'B', dim: number, capacity: number, data?: T, rank = 0): void {
  const size = dim * capacity;
  const region = out.subarray(entry * size, (entry + 1) * size);
  region.fill(0);
  if (!data || rank === 0) return;
  if (which === 'B') {
    region.set(data); // [rank, out] is the top of [capacity, out]
    return;
  }
  for (let k = 0; k < dim; k++) region.set(data.subarray(k * rank, (k + 1) * rank), k * capacity);
}
