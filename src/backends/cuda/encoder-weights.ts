/**
 * A BERT-family encoder's parameters read from the ONNX graph the CPU path runs (the model directory's
 * onnx/model.onnx), so that the CUDA encoder serves the same model from the same directory.
 *
 * Exports name and store weights in several ways, so the graph is followed rather than the initializer
 * names trusted: a weight is whatever constant expression feeds the product. A constant is an initializer
 * (float32, float16, bfloat16, int8, uint8) through Cast, Identity, Mul by a scale (weight-only int8:
 * all-MiniLM-L6-v2's graph is `Cast(weight_q) * weight_scale`), DequantizeLinear, and Transpose. Then:
 *  - a MatMul by a constant whose product an Add of a constant named `<module>.bias` follows is that
 *    module's Linear: `<module>.weight`, its [in, out] operand transposed to torch's [out, in] (the anonymous
 *    `val_49` initializers of an int8 export are found so);
 *  - a Gemm (transB or not) names its weight by its bias the same way;
 *  - Gather tables (embeddings) and LayerNormalization's scale and bias keep their constants' names;
 *  - the pair head's `scale` is a named scalar initializer.
 * Names lose their module prefix (`bert.`, `m.`, `inner.`, `0.auto_model.`): `encoder.layer.3.output.dense.weight`.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { halfsToFloats } from '../../runtime/float16.js';
import { externalDataReader } from '../../runtime/model-dir.js';
import { ONNX_BFLOAT16, ONNX_FLOAT, ONNX_FLOAT16, ONNX_UINT8, readGraph, type Initializer, type ReadGraph, type ReadNode } from '../../runtime/onnx-proto.js';
import { EncoderTensor, type EncoderHead, type EncoderShape } from './encoder-plan.js';

const ONNX_INT8 = 3;

export class EncoderCheckpointError extends Error {}

/** A constant of the graph: its values as float32, its dims, and the parameter name it carries, if any. */
export interface GraphConstant {
  values: Float32Array;
  dims: number[];
  name?: string;
}

/** config.json's fields the encoder reads. */
export interface BertConfig {
  model_type?: string;
  vocab_size: number;
  hidden_size: number;
  num_hidden_layers: number;
  num_attention_heads: number;
  intermediate_size: number;
  max_position_embeddings?: number;
  type_vocab_size?: number;
  layer_norm_eps?: number;
  hidden_act?: string;
  position_embedding_type?: string;
}

const TANH_GELUS = ['gelu_new', 'gelu_pytorch_tanh', 'gelu_fast'];

/** The model's dimensions from config.json; refuses, by name, what the CUDA encoder does not compute. */
export function bertDimensions(cfg: BertConfig, where: string): Pick<EncoderShape, 'numLayers' | 'hidden' | 'numHeads' | 'intermediate' | 'vocab' | 'maxPositions' | 'typeVocab' | 'act' | 'lnEps'> {
  if (cfg.model_type !== undefined && cfg.model_type !== 'bert') {
    throw new EncoderCheckpointError(`${where}: model_type '${cfg.model_type}': the CUDA encoder runs BERT (model_type bert); run this model on ONNX Runtime (RAGGUARD_*_EP=cpu or auto)`);
  }
  if (cfg.position_embedding_type !== undefined && cfg.position_embedding_type !== 'absolute') {
    throw new EncoderCheckpointError(`${where}: position_embedding_type '${cfg.position_embedding_type}': the CUDA encoder takes absolute positions`);
  }
  const act = cfg.hidden_act ?? 'gelu';
  if (act !== 'gelu' && !TANH_GELUS.includes(act)) throw new EncoderCheckpointError(`${where}: hidden_act '${act}': the CUDA encoder computes gelu (erf) or ${TANH_GELUS.join(', ')}`);
  for (const k of ['vocab_size', 'hidden_size', 'num_hidden_layers', 'num_attention_heads', 'intermediate_size'] as const) {
    if (!Number.isInteger(cfg[k]) || cfg[k] < 1) throw new EncoderCheckpointError(`${where}: config.json's ${k} is ${String(cfg[k])}`);
  }
  return {
    numLayers: cfg.num_hidden_layers, hidden: cfg.hidden_size, numHeads: cfg.num_attention_heads, intermediate: cfg.intermediate_size,
    vocab: cfg.vocab_size, maxPositions: cfg.max_position_embeddings ?? 512, typeVocab: cfg.type_vocab_size ?? 2,
    act: act === 'gelu' ? 'gelu' : 'gelu_tanh', lnEps: cfg.layer_norm_eps ?? 1e-12,
  };
}

/** The parameter name a value carries: its name without the module prefix, where it names a parameter. */
export function canonicalName(name: string): string | undefined {
  return /(?:^|\.)((?:embeddings|encoder|pooler|classifier)(?:\.[^/]+)?\.(?:weight|bias)|scale)$/.exec(name)?.[1];
}

function floatsOf(t: Initializer): Float32Array | undefined {
  const { buffer, byteOffset, length } = t.data;
  switch (t.dataType) {
    case ONNX_FLOAT: return new Float32Array(buffer.slice(byteOffset, byteOffset + length));
    case ONNX_FLOAT16: return halfsToFloats(new Uint16Array(buffer, byteOffset, length / 2));
    case ONNX_BFLOAT16: {
      const w = new Uint16Array(buffer, byteOffset, length / 2);
      const bits = new Uint32Array(w.length);
      for (let i = 0; i < w.length; i++) bits[i] = w[i]! << 16;
      return new Float32Array(bits.buffer);
    }
    case ONNX_INT8: return Float32Array.from(new Int8Array(buffer, byteOffset, length));
    case ONNX_UINT8: return Float32Array.from(new Uint8Array(buffer, byteOffset, length));
    default: return undefined;
  }
}

/** [rows, cols] -> [cols, rows]. */
export function transpose2d(c: GraphConstant): GraphConstant {
  const [r, k] = c.dims as [number, number];
  const out = new Float32Array(r * k);
  for (let i = 0; i < r; i++) for (let j = 0; j < k; j++) out[j * r + i] = c.values[i * k + j]!;
  return { values: out, dims: [k, r] };
}

/** a * b with numpy broadcasting (rank 2 at most). */
function broadcastMul(a: GraphConstant, b: GraphConstant): GraphConstant | undefined {
  if (a.dims.length > 2 || b.dims.length > 2) return undefined;
  const pad = (d: number[]) => [...Array(2 - d.length).fill(1), ...d] as [number, number];
  const [ar, ac] = pad(a.dims), [br, bc] = pad(b.dims);
  const rows = Math.max(ar, br), cols = Math.max(ac, bc);
  if ((ar !== rows && ar !== 1) || (br !== rows && br !== 1) || (ac !== cols && ac !== 1) || (bc !== cols && bc !== 1)) return undefined;
  const out = new Float32Array(rows * cols);
  for (let i = 0; i < rows; i++) {
    for (let j = 0; j < cols; j++) out[i * cols + j] = a.values[(ar === 1 ? 0 : i) * ac + (ac === 1 ? 0 : j)]! * b.values[(br === 1 ? 0 : i) * bc + (bc === 1 ? 0 : j)]!;
  }
  return { values: out, dims: Math.max(a.dims.length, b.dims.length) === 1 ? [cols] : [rows, cols] };
}

/** The graph's constant values, computed on demand from the initializers through weight-only ops. */
export class GraphConstants {
  private readonly producer = new Map<string, ReadNode>();
  private readonly users = new Map<string, ReadNode[]>();
  private readonly memo = new Map<string, GraphConstant | null>();

  constructor(readonly graph: ReadGraph) {
    for (const n of graph.nodes) {
      for (const o of n.outputs) this.producer.set(o, n);
      for (const i of n.inputs) this.users.set(i, [...(this.users.get(i) ?? []), n]);
    }
  }

  consumers(value: string): readonly ReadNode[] {
    return this.users.get(value) ?? [];
  }

  get(value: string): GraphConstant | undefined {
    if (value === '') return undefined;
    const seen = this.memo.get(value);
    if (seen !== undefined) return seen ?? undefined;
    this.memo.set(value, null); // a cycle resolves to nothing
    const init = this.graph.initializers.get(value);
    let c: GraphConstant | undefined;
    if (init) {
      const values = floatsOf(init);
      c = values && { values, dims: init.dims, ...named(value) };
    } else {
      const n = this.producer.get(value);
      c = n && this.derive(n, value);
    }
    this.memo.set(value, c ?? null);
    return c;
  }

  private derive(n: ReadNode, out: string): GraphConstant | undefined {
    const keep = (c: GraphConstant | undefined): GraphConstant | undefined => c && { values: c.values, dims: c.dims, ...(named(out) ?? (c.name ? { name: c.name } : {})) };
    switch (n.op) {
      case 'Cast':
      case 'Identity':
        return keep(this.get(n.inputs[0]!));
      case 'Mul': {
        const a = this.get(n.inputs[0]!), b = a && this.get(n.inputs[1]!);
        const m = a && b ? broadcastMul(a, b) : undefined;
        return m && { ...m, ...named(out) };
      }
      case 'DequantizeLinear': {
        const x = this.get(n.inputs[0]!), s = x && this.get(n.inputs[1]!);
        if (!x || !s) return undefined;
        const zp = n.inputs[2] ? this.get(n.inputs[2]) : undefined;
        const axis = Number(n.attrs.get('axis')?.int ?? 1n);
        const values = new Float32Array(x.values.length);
        const cols = x.dims.length === 2 ? x.dims[1]! : 1;
        for (let i = 0; i < values.length; i++) {
          const k = s.values.length === 1 ? 0 : axis === 0 ? Math.floor(i / cols) : i % cols;
          values[i] = (x.values[i]! - (zp ? zp.values[zp.values.length === 1 ? 0 : k]! : 0)) * s.values[k]!;
        }
        return { values, dims: x.dims, ...named(out) };
      }
      case 'Transpose': {
        const a = this.get(n.inputs[0]!);
        const perm = n.attrs.get('perm')?.ints;
        if (!a || a.dims.length !== 2 || (perm && !(perm[0] === 1n && perm[1] === 0n))) return undefined;
        // The transposed operand is not the parameter's own layout: it carries no name.
        return { ...transpose2d(a), ...named(out) };
      }
      default:
        return undefined;
    }
  }
}

function named(value: string): { name: string } | undefined {
  const n = canonicalName(value);
  return n ? { name: n } : undefined;
}

/** The parameters found in the graph (torch layout: Linear weights [out, in]), the LayerNorm epsilon and the ops present. */
export interface GraphParameters {
  params: Map<string, GraphConstant>;
  lnEps?: number;
  ops: Set<string>;
  outputs: string[];
}

export function graphParameters(graph: ReadGraph): GraphParameters {
  const k = new GraphConstants(graph);
  const params = new Map<string, GraphConstant>();
  const put = (name: string | undefined, c: GraphConstant) => {
    const n = name === undefined ? undefined : canonicalName(name);
    if (n && !params.has(n)) params.set(n, { values: c.values, dims: c.dims, name: n });
  };
  let lnEps: number | undefined;
  for (const n of graph.nodes) {
    if (n.op === 'Gather') {
      const c = k.get(n.inputs[0]!);
      if (c?.name) put(c.name, c);
    } else if (n.op === 'LayerNormalization') {
      for (const i of [1, 2]) {
        const c = k.get(n.inputs[i] ?? '');
        if (c?.name) put(c.name, c);
      }
      lnEps ??= n.attrs.get('epsilon')?.float;
    } else if (n.op === 'MatMul') {
      const w = k.get(n.inputs[1]!);
      if (!w || w.dims.length !== 2) continue;
      for (const add of k.consumers(n.outputs[0]!)) {
        if (add.op !== 'Add') continue;
        const b = k.get(add.inputs.find((i) => i !== n.outputs[0]) ?? '');
        if (!b?.name?.endsWith('.bias')) continue;
        put(b.name, b);
        put(b.name.replace(/bias$/, 'weight'), transpose2d(w));
        break;
      }
    } else if (n.op === 'Gemm') {
      const attr = (a: string, d: number) => n.attrs.get(a)?.int !== undefined ? Number(n.attrs.get(a)!.int) : n.attrs.get(a)?.float ?? d;
      if (attr('transA', 0) !== 0 || attr('alpha', 1) !== 1 || attr('beta', 1) !== 1) continue;
      const w = k.get(n.inputs[1]!);
      if (!w || w.dims.length !== 2) continue;
      const b = n.inputs[2] ? k.get(n.inputs[2]) : undefined;
      const torch = attr('transB', 0) === 1 ? w : transpose2d(w);
      const name = b?.name?.endsWith('.bias') ? b.name.replace(/bias$/, 'weight') : attr('transB', 0) === 1 ? w.name : undefined;
      put(name, torch);
      if (b?.name) put(b.name, b);
    }
  }
  // A scalar the head multiplies by (the pair scorer's scale) is used by no node above.
  for (const name of graph.initializers.keys()) {
    if (canonicalName(name) === 'scale' && !params.has('scale')) {
      const c = k.get(name);
      if (c) put(name, c);
    }
  }
  return { params, ...(lnEps !== undefined ? { lnEps } : {}), ops: new Set(graph.nodes.map((n) => n.op)), outputs: graph.outputs };
}

/** A tensor the device takes: its parameter name, torch shape, and where it goes (kind, layer). */
export interface TensorSpec {
  name: string;
  dims: number[];
  kind: EncoderTensor;
  layer: number;
}

/** Every parameter the shape needs, in upload order. */
export function tensorSpecs(s: EncoderShape): TensorSpec[] {
  const { hidden: H, intermediate: I } = s;
  const T = EncoderTensor;
  const specs: TensorSpec[] = [
    { name: 'embeddings.word_embeddings.weight', dims: [s.vocab, H], kind: T.Word, layer: 0 },
    { name: 'embeddings.position_embeddings.weight', dims: [s.maxPositions, H], kind: T.Position, layer: 0 },
    { name: 'embeddings.token_type_embeddings.weight', dims: [s.typeVocab, H], kind: T.TokenType, layer: 0 },
    { name: 'embeddings.LayerNorm.weight', dims: [H], kind: T.EmbNormWeight, layer: 0 },
    { name: 'embeddings.LayerNorm.bias', dims: [H], kind: T.EmbNormBias, layer: 0 },
  ];
  for (let l = 0; l < s.numLayers; l++) {
    const p = `encoder.layer.${l}.`;
    const add = (name: string, dims: number[], kind: EncoderTensor) => specs.push({ name: p + name, dims, kind, layer: l });
    add('attention.self.query.weight', [H, H], T.QueryWeight);
    add('attention.self.key.weight', [H, H], T.KeyWeight);
    add('attention.self.value.weight', [H, H], T.ValueWeight);
    add('attention.self.query.bias', [H], T.QueryBias);
    add('attention.self.key.bias', [H], T.KeyBias);
    add('attention.self.value.bias', [H], T.ValueBias);
    add('attention.output.dense.weight', [H, H], T.AttnOutWeight);
    add('attention.output.dense.bias', [H], T.AttnOutBias);
    add('attention.output.LayerNorm.weight', [H], T.AttnNormWeight);
    add('attention.output.LayerNorm.bias', [H], T.AttnNormBias);
    add('intermediate.dense.weight', [I, H], T.InterWeight);
    add('intermediate.dense.bias', [I], T.InterBias);
    add('output.dense.weight', [H, I], T.OutWeight);
    add('output.dense.bias', [H], T.OutBias);
    add('output.LayerNorm.weight', [H], T.OutNormWeight);
    add('output.LayerNorm.bias', [H], T.OutNormBias);
  }
  if (s.head !== 'embedding') {
    specs.push(
      { name: 'pooler.dense.weight', dims: [H, H], kind: T.PoolerWeight, layer: 0 },
      { name: 'pooler.dense.bias', dims: [H], kind: T.PoolerBias, layer: 0 },
      { name: 'classifier.weight', dims: [s.numLabels, H], kind: T.ClassifierWeight, layer: 0 },
      { name: 'classifier.bias', dims: [s.numLabels], kind: T.ClassifierBias, layer: 0 },
    );
  }
  if (s.head === 'pair') specs.push({ name: 'scale', dims: [], kind: T.Scale, layer: 0 });
  return specs;
}

/** What the reranker's graph computes after the encoder: the pair scorer's head, or BertForSequenceClassification's. */
export function rerankHead(p: GraphParameters, where: string): { head: Exclude<EncoderHead, 'embedding'>; numLabels: number } {
  const cls = p.params.get('classifier.weight');
  if (!cls || cls.dims.length !== 2) throw new EncoderCheckpointError(`${where}: no classifier.weight [labels, hidden] in the graph: not a BERT cross-encoder the CUDA encoder runs`);
  if (!p.params.has('pooler.dense.weight')) {
    throw new EncoderCheckpointError(`${where}: a classifier without BERT's pooler (pooler.dense): the CUDA encoder runs BertForSequenceClassification's head and the pair scorer's`);
  }
  // The pair scorer: scale x cos(segment means, each L2-normalized) + the classifier (scripts/build_models.py PairScorer).
  const pair = p.params.has('scale') && p.ops.has('ReduceL2');
  return { head: pair ? 'pair' : 'classifier', numLabels: cls.dims[0]! };
}

/** The tensors for `shape` from the graph's parameters, each checked against the shape; throws naming what is missing or mis-shaped. */
export function encoderTensors(p: GraphParameters, shape: EncoderShape, where: string): { spec: TensorSpec; values: Float32Array }[] {
  const specs = tensorSpecs(shape);
  const missing = specs.filter((s) => !p.params.has(s.name)).map((s) => s.name);
  if (missing.length > 0) {
    throw new EncoderCheckpointError(`${where}: the graph has no ${missing.slice(0, 4).join(', ')}${missing.length > 4 ? ` (and ${missing.length - 4} more)` : ''}; ` +
      `found ${[...p.params.keys()].slice(0, 6).join(', ')}${p.params.size > 6 ? ', ...' : ''}`);
  }
  return specs.map((spec) => {
    const c = p.params.get(spec.name)!;
    const count = spec.dims.reduce((a, b) => a * b, 1);
    const same = c.dims.length === spec.dims.length ? c.dims.every((d, i) => d === spec.dims[i]) : c.values.length === 1 && count === 1;
    if (!same || c.values.length !== count) throw new EncoderCheckpointError(`${where}: ${spec.name} is [${c.dims.join(', ')}], expected [${spec.dims.join(', ')}]`);
    return { spec, values: c.values };
  });
}

/** The graph of a model directory's ONNX file, external data included. */
export function readEncoderGraph(onnxFile: string): ReadGraph {
  const ext = externalDataReader(path.dirname(onnxFile));
  try {
    return readGraph(readFileSync(onnxFile), ext.read);
  } finally {
    ext.close();
  }
}
