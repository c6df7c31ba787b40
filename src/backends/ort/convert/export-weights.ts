/**
 * Finds a decoder export's weights by its graph's structure, not by their names, for the genai builder
 * (gqa-builder.ts WeightSource, which asks by transformers' module names).
 *
 * Why: constant folding (PyTorch's and Optimum's default export) renames the weights it touches
 * (`onnx::MatMul_1246`) and stores a Linear's weight as the MatMul reads it, [in, out], instead of
 * torch's [out, in] behind a Transpose; an unfolded export keeps module names and the Transpose. The
 * graph says the same thing either way:
 *
 *   embedding   the Gather whose indices are `input_ids`
 *   norms       RMSNorm: a Mul by a [hidden] constant after x * 1/sqrt(mean(x^2) + eps) (Pow or Mul,
 *               ReduceMean, Sqrt, Div or Reciprocal), or SimplifiedLayerNormalization,
 *               SkipSimplifiedLayerNormalization, RMSNormalization; in graph order: layer l's input norm
 *               is the (2l)th, its post-attention norm the (2l+1)th, the final norm the last
 *   q, k, v     the three projections reading layer l's input norm; k is the one whose output reaches a
 *               present key (or an attention op's key input), v a present value, q neither
 *   o_proj      the other projection between the two norms of the layer
 *   gate, up    the two projections reading the post-attention norm: gate's output goes through SiLU
 *               (Sigmoid and Mul, or QuickGelu at alpha 1), up's meets it in a Mul
 *   down_proj   the other projection before the next norm, reading that Mul's product
 *   lm_head     the projection reading the final norm (tied or not)
 *   biases      an Add of a [out] constant right after a projection (Gemm's C)
 *
 * A projection is a MatMul (or Gemm, FusedMatMul) whose right operand is a 2-D constant: an initializer
 * or Constant, possibly through Cast, Identity and Transpose, each Transpose flipping the layout. Names
 * serve only as a cross-check: a weight whose name is a module name must be the module the structure
 * says. Whatever the builder cannot represent is refused with a message naming it, never dropped: another
 * architecture or activation, LayerNorm, quantized weights, fused projections, a constant the graph
 * multiplies or adds that no mapped weight accounts for (a q/k norm, say).
 */
import { halfsToFloats } from '../../../runtime/float16.js';
import { ONNX_BFLOAT16, ONNX_FLOAT, ONNX_FLOAT16, type Initializer, type ReadGraph, type ReadNode } from '../../../runtime/onnx-proto.js';
import type { GqaSourceConfig, WeightSource } from './gqa-builder.js';
import { rotaryFromConfig } from './rope-scaling.js';
import { PASS, QUANTIZED, RESHAPE, traceGraph, walkWithin, type Held } from './export-graph.js';

/** Model types whose decoder layer is exactly the builder's (pre-norm RMSNorm, rotary GQA, SiLU-gated MLP). */
const MODEL_TYPES = new Set(['llama', 'mistral', 'qwen2']);

/** Attention ops and the input slot of their query, key and value. */
const ATTENTION: Record<string, readonly ['q', 'k', 'v']> = { GroupQueryAttention: ['q', 'k', 'v'], MultiHeadAttention: ['q', 'k', 'v'], Attention: ['q', 'k', 'v'] };

/** Refuses a config whose model the builder's graph is not (before any weight is looked at). */
export function refuseUnrepresentable(cfg: GqaSourceConfig & Record<string, unknown>, where: string): void {
  const type = cfg.model_type ?? 'llama';
  if (!MODEL_TYPES.has(type)) throw new Error(`${where}: model_type '${type}' is not converted (llama, mistral and qwen2 are)`);
  if (cfg['hidden_act'] !== undefined && cfg['hidden_act'] !== 'silu') throw new Error(`${where}: hidden_act '${String(cfg['hidden_act'])}' is not converted (silu is)`);
  const partial = cfg['partial_rotary_factor'];
  if (partial !== undefined && partial !== null && partial !== 1) throw new Error(`${where}: partial_rotary_factor ${String(partial)} is not converted (the rotary covers the whole head)`);
  for (const k of ['attn_logit_softcapping', 'final_logit_softcapping']) {
    if (cfg[k] !== undefined && cfg[k] !== null) throw new Error(`${where}: ${k} is not converted`);
  }
  const window = cfg['sliding_window'];
  const uses = cfg['use_sliding_window'] === true || (type === 'mistral' && cfg['use_sliding_window'] === undefined);
  if (uses && typeof window === 'number' && window < (cfg.max_position_embeddings ?? Infinity)) {
    throw new Error(`${where}: sliding_window ${window} attention is not converted (the attention here sees every position)`);
  }
}

interface Projection {
  node: number;
  /** The activation it reads and the product it writes. */
  x: string;
  out: string;
  weight: Held;
  /** The right operand is transposed by the op itself (Gemm's or FusedMatMul's transB). */
  transB: boolean;
  bias?: Held;
}

interface Norm {
  node: number;
  gamma: Held;
  out: string;
}

export interface ExportWeights extends WeightSource {
  /** The graph tensor each module weight came from (for the log and the tests). */
  readonly origin: ReadonlyMap<string, string>;
}

function floatsOf(t: Initializer, where: string): Float32Array {
  const bytes = new Uint8Array(t.data);
  if (t.dataType === ONNX_FLOAT) return new Float32Array(bytes.buffer);
  if (t.dataType === ONNX_FLOAT16) return halfsToFloats(new Uint16Array(bytes.buffer));
  if (t.dataType === ONNX_BFLOAT16) {
    const h = new Uint16Array(bytes.buffer);
    const out = new Uint32Array(h.length);
    for (let i = 0; i < h.length; i++) out[i] = h[i]! << 16;
    return new Float32Array(out.buffer);
  }
  throw new Error(`${where}: weight ${t.name} has element type ${t.dataType}; float32, float16 or bfloat16 expected`);
}

const isFloat = (t: Initializer) => t.dataType === ONNX_FLOAT || t.dataType === ONNX_FLOAT16 || t.dataType === ONNX_BFLOAT16;
const count = (t: Initializer) => t.dims.reduce((a, b) => a * b, 1);

/** A module name as an unfolded export writes it (wrapper prefix and '_fp16' suffix dropped), or undefined. */
function moduleName(name: string): string | undefined {
  const n = name.replace(/_fp16$/, '');
  const at = n.search(/(^|\.)(model\.|lm_head\.)/);
  if (at < 0) return undefined;
  const m = n.slice(n[at] === '.' ? at + 1 : at);
  return /^(model\.layers\.\d+\.(self_attn|mlp)\.\w+\.(weight|bias)|model\.layers\.\d+\.\w+norm\.weight|model\.(embed_tokens|norm)\.weight|lm_head\.weight)$/.test(m) ? m : undefined;
}

/** The weights of a Llama/Qwen2/Mistral decoder export, found by the structure of its graph. */
export function exportWeights(graph: ReadGraph, cfg: GqaSourceConfig, where = 'decoder export'): ExportWeights {
  refuseUnrepresentable(cfg as GqaSourceConfig & Record<string, unknown>, where);
  const branches = graph.nodes.filter((n) => n.op === 'If' || n.op === 'Loop' || n.op === 'Scan').map((n) => `${n.op} ${n.name}`);
  const refuse = (what: string): never => {
    // Where the structure may sit out of sight: in local functions, or subgraphs (Optimum's merged decoders).
    const fns = graph.functions.length > 0 ? ` (the graph calls local functions ${graph.functions.slice(0, 4).join(', ')}: inline them first)` : '';
    const subs = branches.length > 0 ? ` (the graph has subgraphs, ${branches.slice(0, 2).join(', ')}, as a merged decoder does: export it unmerged)` : '';
    throw new Error(`${where}: ${what}; not converted${fns}${subs}`);
  };
  const { nodes, producer, consumers, label, constOf, same, origin } = traceGraph(graph, refuse);
  const H = cfg.hidden_size;
  const nh = cfg.num_attention_heads;
  const kvh = cfg.num_key_value_heads ?? nh;
  const D = cfg.head_dim ?? H / nh;
  const I = cfg.intermediate_size;
  const L = cfg.num_hidden_layers;
  const V = cfg.vocab_size;

  // Projections: every MatMul-like node with a constant 2-D right operand.
  const projections: Projection[] = [];
  nodes.forEach((n, i) => {
    if (QUANTIZED.has(n.op)) refuse(`quantized op ${label(i)} is not read here`);
    if (n.op !== 'MatMul' && n.op !== 'Gemm' && n.op !== 'FusedMatMul') return;
    const held = constOf(n.inputs[1]!);
    if (!held || held.tensor.dims.length !== 2 || !isFloat(held.tensor)) return;
    const int = (k: string, d: number) => Number(n.attrs.get(k)?.int ?? BigInt(d));
    const flt = (k: string) => n.attrs.get(k)?.float ?? 1;
    if (n.op !== 'MatMul' && (int('transA', 0) !== 0 || flt('alpha') !== 1 || (n.op === 'Gemm' && flt('beta') !== 1))) {
      refuse(`${label(i)} scales or transposes its input (alpha, beta, transA), which the builder's projections do not`);
    }
    const p: Projection = { node: i, x: n.inputs[0]!, out: n.outputs[0]!, weight: held, transB: int('transB', 0) === 1 };
    if (n.op === 'Gemm' && n.inputs[2]) {
      p.bias = constOf(n.inputs[2]);
      if (!p.bias) refuse(`${label(i)} adds a bias that is not a constant`);
    }
    projections.push(p);
  });
  /** [out, in] of a projection's weight as torch holds it. */
  const outIn = (p: Projection): [number, number] => {
    const [a, b] = p.weight.tensor.dims as [number, number];
    return p.weight.transposed !== p.transB ? [a, b] : [b, a];
  };
  // Biases: an Add of a [out] constant right after the product.
  for (const p of projections) {
    if (p.bias) continue;
    for (const c of consumers.get(p.out) ?? []) {
      const n = nodes[c]!;
      if (n.op !== 'Add') continue;
      const other = n.inputs[0] === p.out ? n.inputs[1]! : n.inputs[0]!;
      const b = constOf(other);
      if (b && isFloat(b.tensor) && b.tensor.dims.length === 1 && b.tensor.dims[0] === outIn(p)[0]) p.bias = b;
    }
  }
  const byNode = new Map(projections.map((p) => [p.node, p]));
  /** Projections reading `name` (through pass-through ops and reshapes). */
  const readers = (name: string): Projection[] => {
    const found: Projection[] = [];
    const seen = new Set<string>();
    const todo = [name];
    while (todo.length) {
      const t = todo.pop()!;
      if (seen.has(t)) continue;
      seen.add(t);
      for (const c of consumers.get(t) ?? []) {
        const n = nodes[c]!;
        const p = byNode.get(c);
        if (p && p.x === t) found.push(p);
        // Through ops that copy or reshape their data input, or take some of its positions (a Slice as
        // transformers' logits_to_keep puts before the head), not through their shape or index inputs.
        else if (PASS.has(n.op) || ((RESHAPE.has(n.op) || n.op === 'Slice') && n.inputs[0] === t)) todo.push(n.outputs[0]!);
      }
    }
    return [...new Set(found)];
  };

  // RMSNorms, in graph order.
  const isRmsNormalized = (x: string): boolean => {
    // x * r with r = 1 / sqrt(mean(y^2) + eps) (Div, Reciprocal, or Pow -0.5), or x / sqrt(...).
    const i = producer.get(origin(x, false));
    if (i === undefined) return false;
    let rms = false;
    walkWithin(i, 6, (k) => {
      const n = nodes[k]!;
      if (n.op === 'ReduceMean') {
        const sq = producer.get(origin(n.inputs[0]!, false));
        const s = sq === undefined ? undefined : nodes[sq]!;
        if (s && (s.op === 'Pow' || (s.op === 'Mul' && s.inputs[0] === s.inputs[1]))) {
          const y = producer.get(origin(s.inputs[0]!, false));
          rms = y === undefined || nodes[y]!.op !== 'Sub'; // a mean subtracted first: LayerNorm
        }
        return null;
      }
      return n.inputs.map((inp) => producer.get(inp)).filter((j): j is number => j !== undefined);
    });
    return rms;
  };
  const norms: Norm[] = [];
  nodes.forEach((n, i) => {
    if (n.op === 'LayerNormalization' || n.op === 'SkipLayerNormalization') refuse(`${label(i)} is a LayerNorm (mean and bias), not the RMSNorm the builder has`);
    const gammaAt = n.op === 'SimplifiedLayerNormalization' || n.op === 'RMSNormalization' ? 1 : n.op === 'SkipSimplifiedLayerNormalization' ? 2 : -1;
    if (gammaAt >= 0) {
      const gamma = constOf(n.inputs[gammaAt]!);
      if (!gamma) refuse(`${label(i)}'s scale is not a constant`);
      // Another width is another norm (a per-head q/k norm): not one the builder has.
      if (count(gamma!.tensor) !== H) refuse(`${label(i)} scales ${count(gamma!.tensor)} values, not hidden_size ${H}`);
      norms.push({ node: i, gamma: gamma!, out: n.outputs[0]! });
      return;
    }
    if (n.op !== 'Mul') return;
    for (const [g, x] of [[0, 1], [1, 0]] as const) {
      const gamma = constOf(n.inputs[g]!);
      if (gamma && isFloat(gamma.tensor) && gamma.tensor.dims.length === 1 && gamma.tensor.dims[0] === H && isRmsNormalized(n.inputs[x]!)) {
        norms.push({ node: i, gamma, out: n.outputs[0]! });
        return;
      }
    }
  });
  if (norms.length !== 2 * L + 1) refuse(`found ${norms.length} RMSNorm weights of ${H} values, expected ${2 * L + 1} (2 per layer for ${L} layers, and the final norm)`);

  const weights = new Map<string, Held>();
  /** Weights stored transposed from torch's layout (a 2-D one's rows and columns swapped on the way out). */
  const flipped = new Set<string>();
  const put = (name: string, h: Held, flip = false) => {
    weights.set(name, h);
    if (flip) flipped.add(name);
  };
  const projection = (name: string, p: Projection, inDim: number, outDim: number) => {
    const [o, i] = outIn(p);
    if (o !== outDim || i !== inDim) refuse(`${name} (${label(p.node)}) is [${o}, ${i}] as [out, in], expected [${outDim}, ${inDim}] from config.json`);
    // A projection's weight is in torch's layout, [out, in], when the graph transposes it before the
    // product; stored as the product reads it, [in, out] (constant folding's way), it is flipped.
    put(`${name}.weight`, p.weight, p.weight.transposed === p.transB);
    if (p.bias) put(`${name}.bias`, p.bias);
  };
  const between = (from: number, to: number, except: readonly Projection[]) => projections.filter((p) => p.node > from && p.node < to && !except.includes(p));

  // Where a projection's output goes: a present key/value output or an attention op's input slot.
  const attentionRole = (p: Projection): 'q' | 'k' | 'v' | undefined => {
    const roles = new Set<string>();
    const seen = new Set<string>();
    const todo = [p.out];
    const outputs = new Set(graph.outputs);
    while (todo.length) {
      const t = todo.pop()!;
      if (seen.has(t)) continue;
      seen.add(t);
      if (outputs.has(t)) {
        if (/key/i.test(t)) roles.add('k');
        else if (/value/i.test(t)) roles.add('v');
      }
      for (const c of consumers.get(t) ?? []) {
        const n = nodes[c]!;
        const slots = ATTENTION[n.op];
        if (slots) {
          const at = n.inputs.indexOf(t);
          if (at >= 0 && at < 3) roles.add(slots[at]!);
          continue;
        }
        // Not past the attention's products, nor through shapes: a tensor's shape sizes other tensors
        // (repeated KV heads, masks) without being their data.
        if (['MatMul', 'Gemm', 'FusedMatMul', 'Softmax', 'Shape', 'Size'].includes(n.op)) continue;
        todo.push(...n.outputs);
      }
    }
    if (roles.size === 0) return 'q';
    return roles.size === 1 ? [...roles][0] as 'q' | 'k' | 'v' : undefined;
  };
  /** The SiLU of a projection's output (Sigmoid and Mul, or QuickGelu at alpha 1), or the activation found instead. */
  const silu = (p: Projection): { act?: string; other?: string } => {
    const xs = same(p.out);
    for (const x of xs) {
      for (const c of consumers.get(x) ?? []) {
        const n = nodes[c]!;
        if (n.op === 'QuickGelu' && Math.abs((n.attrs.get('alpha')?.float ?? 1.702) - 1) < 1e-6) return { act: n.outputs[0]! };
        if (n.op === 'Sigmoid') {
          const sig = same(n.outputs[0]!);
          for (const s of sig) {
            for (const m of consumers.get(s) ?? []) {
              const mul = nodes[m]!;
              if (mul.op === 'Mul' && mul.inputs.some((v) => xs.has(v)) && mul.inputs.some((v) => sig.has(v))) return { act: mul.outputs[0]! };
            }
          }
        }
        if (['Gelu', 'FastGelu', 'BiasGelu', 'QuickGelu', 'Tanh', 'Relu', 'Erf', 'Softplus', 'Elu', 'Selu', 'HardSigmoid'].includes(n.op)) return { other: n.op };
      }
    }
    return {};
  };

  for (let l = 0; l < L; l++) {
    const pre = `model.layers.${l}`;
    const [a, b, next] = [norms[2 * l]!, norms[2 * l + 1]!, norms[2 * l + 2]!];
    put(`${pre}.input_layernorm.weight`, a.gamma);
    put(`${pre}.post_attention_layernorm.weight`, b.gamma);
    const qkv = readers(a.out);
    if (qkv.length !== 3) refuse(`layer ${l}: ${qkv.length} projection(s) read the attention's input norm, q, k and v expected (a fused q/k/v projection is not read here)`);
    const roles = qkv.map(attentionRole);
    for (const r of ['q', 'k', 'v'] as const) {
      const at = roles.indexOf(r);
      if (at < 0 || roles.lastIndexOf(r) !== at) refuse(`layer ${l}: could not tell q, k and v apart by where they go (found ${roles.map((x) => x ?? '?').join(', ')})`);
      projection(`${pre}.self_attn.${r}_proj`, qkv[at]!, H, r === 'q' ? nh * D : kvh * D);
    }
    const o = between(Math.max(...qkv.map((p) => p.node)), b.node, qkv);
    if (o.length !== 1) refuse(`layer ${l}: ${o.length} projection(s) between attention and its residual, o_proj alone expected`);
    projection(`${pre}.self_attn.o_proj`, o[0]!, nh * D, H);
    const mlp = readers(b.out);
    if (mlp.length !== 2) refuse(`layer ${l}: ${mlp.length} projection(s) read the MLP's input norm, gate and up expected (a fused gate/up projection is not read here)`);
    const acts = mlp.map(silu);
    const other = acts.find((x) => x.other);
    if (other) refuse(`layer ${l}: the MLP's activation is ${other.other}, not SiLU`);
    const g = acts.findIndex((x) => x.act !== undefined);
    if (g < 0 || acts.filter((x) => x.act !== undefined).length !== 1) refuse(`layer ${l}: no SiLU-gated MLP found (gate through Sigmoid and Mul)`);
    const [gate, up] = [mlp[g]!, mlp[1 - g]!];
    projection(`${pre}.mlp.gate_proj`, gate, H, I);
    projection(`${pre}.mlp.up_proj`, up, H, I);
    const down = between(Math.max(gate.node, up.node), next.node, mlp);
    if (down.length !== 1) refuse(`layer ${l}: ${down.length} projection(s) after the MLP's gate and up, down_proj alone expected`);
    // down reads silu(gate) * up.
    const prod = producer.get(origin(down[0]!.x, true));
    const act = silu(gate).act!;
    const ups = same(up.out);
    if (prod === undefined || nodes[prod]!.op !== 'Mul' || !nodes[prod]!.inputs.some((v) => same(act).has(v)) || !nodes[prod]!.inputs.some((v) => ups.has(v))) {
      refuse(`layer ${l}: down_proj (${label(down[0]!.node)}) does not read silu(gate) x up`);
    }
    projection(`${pre}.mlp.down_proj`, down[0]!, I, H);
  }
  const final = norms[2 * L]!;
  put('model.norm.weight', final.gamma);
  const heads = readers(final.out);
  if (heads.length !== 1) refuse(`${heads.length} projection(s) read the final norm, lm_head alone expected`);
  projection('lm_head', heads[0]!, H, V);

  // The embedding: the Gather of input_ids.
  const embeds = nodes.flatMap((n, i) => (n.op === 'Gather' && origin(n.inputs[1]!, false) === 'input_ids' ? [i] : []));
  if (embeds.length !== 1) refuse(`${embeds.length} Gather(s) of input_ids, the embedding lookup alone expected`);
  const e = nodes[embeds[0]!]!;
  const table = constOf(e.inputs[0]!);
  if (!table || table.tensor.dims.length !== 2 || Number(e.attrs.get('axis')?.int ?? 0n) !== 0) refuse(`the embedding (${label(embeds[0]!)}) is not a constant table gathered by rows`);
  const [er, ec] = table!.tensor.dims as [number, number];
  const [vRows, hCols] = table!.transposed ? [ec, er] : [er, ec];
  if (vRows !== V || hCols !== H) refuse(`the embedding is [${vRows}, ${hCols}], expected [${V}, ${H}] from config.json`);
  put('model.embed_tokens.weight', table!, table!.transposed);

  // Nothing the graph computes with may be left out: a constant multiplied, added or projected that no
  // mapped weight accounts for would be a part of the model that the conversion drops.
  const used = new Set([...weights.values()].map((h) => h.tensor.name));
  const rotary = (t: string): boolean => {
    let hit = false;
    walkWithin(t, 6, (x) => {
      const outs: string[] = [];
      for (const c of consumers.get(x) ?? []) {
        if (nodes[c]!.op === 'Cos' || nodes[c]!.op === 'Sin') {
          hit = true;
          return null;
        }
        outs.push(...nodes[c]!.outputs);
      }
      return outs;
    });
    return hit;
  };
  nodes.forEach((n: ReadNode, i) => {
    if (!['Mul', 'Add', 'Sub', 'Div', 'MatMul', 'Gemm', 'FusedMatMul'].includes(n.op)) return;
    for (const x of n.inputs) {
      const h = x === '' ? undefined : constOf(x);
      if (!h || !isFloat(h.tensor) || count(h.tensor) <= 1 || used.has(h.tensor.name)) continue;
      if (rotary(n.outputs[0]!)) continue; // inverse frequencies of the rotary embedding: the builder computes its own
      refuse(`constant ${h.tensor.name} [${h.tensor.dims.join(', ')}] (read by ${label(i)}) is part of no weight the converted model has`);
    }
  });

  // The rotary frequencies, where the graph holds them as a constant ([head_dim / 2] values on the way to
  // Cos), must be the ones the builder computes from config.json (rope_theta and its scaling): a config
  // that does not say how the export rotates would otherwise convert into another model.
  const { rotary: scaling, theta } = rotaryFromConfig(cfg, D);
  const base = theta ?? cfg.rope_theta ?? 10000;
  const expected = Array.from({ length: D / 2 }, (_, i) => 1 / base ** ((2 * i) / D) / (scaling.freqFactors?.[i] ?? 1) / (scaling.linearFactor ?? 1));
  const found: { name: string; values: Float32Array }[] = [];
  const seen = new Set<number>();
  nodes.forEach((n, i) => {
    if (n.op !== 'Cos') return;
    walkWithin(i, 8, (k) => {
      const up: number[] = [];
      for (const x of nodes[k]!.inputs) {
        const j = producer.get(x);
        const t = graph.initializers.get(x) ?? (j !== undefined && nodes[j]!.op === 'Constant' ? constOf(x)?.tensor : undefined);
        if (t && isFloat(t) && count(t) === D / 2) found.push({ name: x, values: floatsOf(t, where) });
        else if (j !== undefined) up.push(j);
      }
      return up;
    }, seen);
  });
  const off = (v: Float32Array) => Math.max(...expected.map((e, i) => Math.abs(v[i]! - e) / e));
  if (found.length > 0 && found.every((f) => off(f.values) > 1e-4)) {
    const f = found[0]!;
    const i = expected.findIndex((e, k) => Math.abs(f.values[k]! - e) / e > 1e-4);
    refuse(`the graph's rotary frequencies (${f.name}) are not config.json's (rope_theta ${base}${scaling.linearFactor || scaling.freqFactors ? ' and its rope scaling' : ', no rope scaling'}): frequency ${i} is ${f.values[i]} in the graph, ${expected[i]!.toPrecision(8)} from the config`);
  }

  // Names as a cross-check: a weight named as a module must be that module.
  for (const [name, h] of weights) {
    const m = moduleName(h.tensor.name);
    if (m && m !== name && !(name === 'lm_head.weight' && m === 'model.embed_tokens.weight')) {
      refuse(`the graph uses ${h.tensor.name} as ${name}, but its name says ${m}`);
    }
  }

  const origins = new Map([...weights].map(([k, h]) => [k, h.tensor.name]));
  return {
    origin: origins,
    floats(name: string): Float32Array | undefined {
      const h = weights.get(name);
      if (!h) return undefined;
      const v = floatsOf(h.tensor, where);
      if (!flipped.has(name)) return v;
      const [r, c] = h.tensor.dims as [number, number];
      const t = new Float32Array(v.length);
      for (let i = 0; i < r; i++) for (let j = 0; j < c; j++) t[j * r + i] = v[i * c + j]!;
      return t;
    },
    rows(name: string): number | undefined {
      const h = weights.get(name);
      if (!h) return undefined;
      const d = h.tensor.dims;
      return d.length === 2 && flipped.has(name) ? d[1] : d[0];
    },
  };
}
