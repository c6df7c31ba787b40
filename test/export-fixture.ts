/**
 * Test fixtures made from the shipped decoder export (models/decoder, an unfolded PyTorch export: module
 * names, fp16 weights behind Cast and Transpose) by rewriting its graph's protobuf: what constant folding
 * (PyTorch's and Optimum's default) makes of the same model, and graphs the converter must refuse.
 * Nodes and initializers are edited; every other field of the model is carried over byte for byte.
 */
import { copyFile, mkdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { halfsToFloats } from '../src/runtime/float16.js';
import { fields, ONNX_FLOAT, ONNX_FLOAT16, readTensor, Writer, type Field, type Initializer } from '../src/runtime/onnx-proto.js';
import { ROOT, tempDir } from './helpers.js';

export const SOURCE = path.join(ROOT, 'models', 'decoder');

export interface EditNode {
  op: string;
  inputs: string[];
  outputs: string[];
  /** The node's other fields (name, attributes, domain) as read; absent for a node made here. */
  rest: Field[];
}

export interface EditGraph {
  nodes: EditNode[];
  initializers: Initializer[];
}

const text = (b: Uint8Array) => new TextDecoder().decode(b);

function copy(w: Writer, f: Field): void {
  if (f.wire === 0) w.int(f.no, f.value);
  else if (f.wire === 2) w.bytes(f.no, f.bytes);
  else throw new Error(`field ${f.no}: wire type ${f.wire} is not copied here`);
}

export interface ExportOptions {
  /** Edits config.json. */
  config?: (c: Record<string, unknown>) => void;
  /** Initializers of more than 1 KiB go into this external data file beside the graph (as exports over 2 GiB keep them). */
  externalData?: string;
}

/** The shipped export with its graph edited by `edit`, written with its config and tokenizer into a new directory. */
export async function editedExport(edit: (g: EditGraph) => void, opts: ExportOptions = {}): Promise<string> {
  const model = await readFile(path.join(SOURCE, 'onnx', 'model.onnx'));
  const out = new Writer();
  const external: Uint8Array[] = [];
  let offset = 0;
  for (const f of fields(model)) {
    if (f.no !== 7) {
      copy(out, f);
      continue;
    }
    const g: EditGraph = { nodes: [], initializers: [] };
    const other: Field[] = [];
    for (const h of fields(f.bytes)) {
      if (h.no === 1) {
        const n: EditNode = { op: '', inputs: [], outputs: [], rest: [] };
        for (const k of fields(h.bytes)) {
          if (k.no === 1) n.inputs.push(text(k.bytes));
          else if (k.no === 2) n.outputs.push(text(k.bytes));
          else if (k.no === 4) n.op = text(k.bytes);
          else n.rest.push(k);
        }
        g.nodes.push(n);
      } else if (h.no === 5) g.initializers.push(readTensor(h.bytes));
      else other.push(h);
    }
    edit(g);
    out.msg(7, (gw) => {
      for (const n of g.nodes) {
        gw.msg(1, (nw) => {
          for (const x of n.inputs) nw.str(1, x);
          for (const y of n.outputs) nw.str(2, y);
          nw.str(4, n.op);
          for (const k of n.rest) copy(nw, k);
        });
      }
      for (const t of g.initializers) {
        gw.msg(5, (m) => {
          for (const d of t.dims) m.int(1, d);
          m.int(2, t.dataType).str(8, t.name);
          if (!opts.externalData || t.data.length <= 1024) {
            m.bytes(9, t.data);
            return;
          }
          // TensorProto.external_data (13): location, offset, length; data_location (14) EXTERNAL.
          m.msg(13, (e) => e.str(1, 'location').str(2, opts.externalData!));
          m.msg(13, (e) => e.str(1, 'offset').str(2, String(offset)));
          m.msg(13, (e) => e.str(1, 'length').str(2, String(t.data.length)));
          m.int(14, 1);
          external.push(t.data);
          offset += t.data.length;
        });
      }
      for (const h of other) copy(gw, h);
    });
  }
  const dir = await tempDir('ragguard-export-');
  await mkdir(path.join(dir, 'onnx'));
  await writeFile(path.join(dir, 'onnx', 'model.onnx'), out.finish());
  if (opts.externalData) await writeFile(path.join(dir, 'onnx', opts.externalData), Buffer.concat(external));
  const cfg = JSON.parse(await readFile(path.join(SOURCE, 'config.json'), 'utf8')) as Record<string, unknown>;
  opts.config?.(cfg);
  await writeFile(path.join(dir, 'config.json'), JSON.stringify(cfg, null, 2));
  for (const f of ['generation_config.json', 'tokenizer.json', 'tokenizer_config.json']) await copyFile(path.join(SOURCE, f), path.join(dir, f));
  return dir;
}

function transposedFloats(t: Initializer): Float32Array {
  const v = t.dataType === ONNX_FLOAT16 ? halfsToFloats(new Uint16Array(new Uint8Array(t.data).buffer)) : new Float32Array(new Uint8Array(t.data).buffer);
  const [r, c] = t.dims as [number, number];
  const out = new Float32Array(v.length);
  for (let i = 0; i < r; i++) for (let j = 0; j < c; j++) out[j * r + i] = v[i * c + j]!;
  return out;
}

/**
 * What constant folding makes of the shipped export: every weight renamed (`onnx::MatMul_1000`, ...);
 * in layers 0 and 2 each projection's Cast and Transpose folded into a float32 [in, out] initializer
 * that the MatMul reads directly, in layers 1 and 3 the fp16 [out, in] tensor kept behind them under
 * its new name; the tied head folded into its own [hidden, vocab] initializer.
 */
export function fold(g: EditGraph): void {
  let serial = 1000;
  const renamed = new Map<string, string>();
  const byName = new Map(g.initializers.map((t) => [t.name, t]));
  const producer = (name: string) => g.nodes.find((n) => n.outputs.includes(name));
  const drop = new Set<EditNode>();
  const added: Initializer[] = [];
  for (const n of g.nodes) {
    if (n.op !== 'MatMul') continue;
    const tr = producer(n.inputs[1]!);
    if (tr?.op !== 'Transpose') continue;
    const cast = producer(tr.inputs[0]!);
    const init = cast?.op === 'Cast' ? byName.get(cast.inputs[0]!) : undefined;
    if (!cast || !init) continue;
    const layer = /layers\.(\d+)\./.exec(init.name)?.[1];
    if (layer === undefined || Number(layer) % 2 === 0) {
      // Folded: the product reads a float32 [in, out] initializer; the head gets its own copy of the embedding.
      const name = `onnx::MatMul_${serial++}`;
      const values = transposedFloats(init);
      added.push({ name, dataType: ONNX_FLOAT, dims: [init.dims[1]!, init.dims[0]!], data: new Uint8Array(values.buffer) });
      n.inputs[1] = name;
      drop.add(tr);
      // The Cast stays where something else reads it (the embedding's, read by the Gather too).
      if (!g.nodes.some((m) => m !== tr && m.inputs.includes(cast.outputs[0]!))) drop.add(cast);
    } else if (!renamed.has(init.name)) renamed.set(init.name, `onnx::Cast_${serial++}`);
  }
  for (const t of g.initializers) if (!renamed.has(t.name)) renamed.set(t.name, t.name.includes('norm') ? `onnx::Mul_${serial++}` : `onnx::Gather_${serial++}`);
  g.nodes = g.nodes.filter((n) => !drop.has(n));
  for (const n of g.nodes) n.inputs = n.inputs.map((x) => renamed.get(x) ?? x);
  g.initializers = [...g.initializers.filter((t) => g.nodes.some((n) => n.inputs.includes(renamed.get(t.name)!))).map((t) => ({ ...t, name: renamed.get(t.name)! })), ...added];
}

/** A node of `op` whose output name contains `part`. */
export function nodeOf(g: EditGraph, op: string, part: string): EditNode {
  const n = g.nodes.find((m) => m.op === op && m.outputs.some((o) => o.includes(part)));
  if (!n) throw new Error(`no ${op} node writing ${part}`);
  return n;
}

/** An attribute field of a node (AttributeProto: name, i, type INT), for `rest`. */
export function intAttribute(name: string, value: number): Field {
  return { no: 5, wire: 2, value: 0n, bytes: new Writer().str(1, name).int(3, value).int(20, 2).finish() };
}

/**
 * Qwen2's q/k/v biases: an Add of a [out] constant after each of layer `l`'s q, k and v products, each
 * with its own values (so that a bias given to the wrong projection changes the model).
 */
export function addQkvBiases(g: EditGraph, seed = 7): void {
  let x = seed;
  const rand = () => ((x = (x * 1103515245 + 12345) % 2 ** 31) / 2 ** 31 - 0.5) * 0.5;
  for (const n of [...g.nodes]) {
    const m = /^\/layers\.(\d+)\/self_attn\/([qkv])_proj\/MatMul_output_0$/.exec(n.outputs[0] ?? '');
    if (n.op !== 'MatMul' || !m) continue;
    const width = m[2] === 'q' ? 256 : 64;
    const name = `model.layers.${m[1]}.self_attn.${m[2]}_proj.bias`;
    g.initializers.push({ name, dataType: ONNX_FLOAT, dims: [width], data: new Uint8Array(Float32Array.from({ length: width }, rand).buffer) });
    const raw = n.outputs[0]!;
    n.outputs[0] = `${raw}_nobias`;
    g.nodes.splice(g.nodes.indexOf(n) + 1, 0, { op: 'Add', inputs: [`${raw}_nobias`, name], outputs: [raw], rest: [] });
  }
}
