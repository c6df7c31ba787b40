/**
 * The export's graph traced for the converter (export-weights.ts): who produces and who reads each tensor,
 * and a tensor followed through the ops that pass it on unchanged (Cast, Identity, a 2-D Transpose, a
 * reshape) back to the constant or the tensor it is.
 */
import { readTensor, type Initializer, type ReadGraph } from '../../../runtime/onnx-proto.js';

/** Ops a value passes through unchanged (for a weight, or an activation on its way to a projection). */
export const PASS = new Set(['Cast', 'Identity']);
export const RESHAPE = new Set(['Reshape', 'Flatten', 'Squeeze', 'Unsqueeze']);
export const QUANTIZED = new Set(['DequantizeLinear', 'MatMulNBits', 'MatMulInteger', 'QLinearMatMul', 'DynamicQuantizeMatMul', 'MatMulIntegerToFloat', 'GatherBlockQuantized']);

/** A weight as the graph holds it, and whether the projection reads it transposed. */
export interface Held {
  tensor: Initializer;
  /** True when the graph transposes the stored tensor (an odd number of times) before using it. */
  transposed: boolean;
}

/**
 * Depth first from `start` along `next`, at most `maxDepth` steps away, each key once (a `seen` shared by
 * several walks visits each key once in all); `next` returns a key's neighbours, or null to end the walk
 * there (it found what it looked for). The converter's local searches of the graph are bounded so, since a
 * pattern it recognises lies a few nodes from where the search starts.
 */
export function walkWithin<K>(start: K, maxDepth: number, next: (k: K) => readonly K[] | null, seen = new Set<K>()): void {
  const todo: [K, number][] = [[start, 0]];
  while (todo.length) {
    const [k, depth] = todo.pop()!;
    if (seen.has(k) || depth > maxDepth) continue;
    seen.add(k);
    const more = next(k);
    if (more === null) return;
    for (const m of more) todo.push([m, depth + 1]);
  }
}

/** The graph's producers and consumers, and its tensors traced; `refuse` throws the converter's refusal (naming the graph). */
export function traceGraph(graph: ReadGraph, refuse: (what: string) => never) {
  const { nodes } = graph;
  const producer = new Map<string, number>();
  const consumers = new Map<string, number[]>();
  nodes.forEach((n, i) => {
    for (const o of n.outputs) producer.set(o, i);
    for (const x of n.inputs) {
      if (x === '') continue;
      const list = consumers.get(x);
      if (list) list.push(i);
      else consumers.set(x, [i]);
    }
  });
  const label = (i: number) => `${nodes[i]!.op} ${nodes[i]!.name || nodes[i]!.outputs[0]}`;

  /** The constant a tensor is, through Cast, Identity and 2-D Transposes; undefined where it is computed. */
  const constOf = (name: string): Held | undefined => {
    let transposed = false;
    for (let hops = 0; hops < 16; hops++) {
      const init = graph.initializers.get(name);
      if (init) return { tensor: init, transposed };
      const i = producer.get(name);
      if (i === undefined) return undefined;
      const n = nodes[i]!;
      if (PASS.has(n.op)) name = n.inputs[0]!;
      else if (n.op === 'Transpose') {
        const perm = n.attrs.get('perm')?.ints;
        if (perm && !(perm.length === 2 && perm[0] === 1n && perm[1] === 0n)) return undefined;
        transposed = !transposed;
        name = n.inputs[0]!;
      } else if (n.op === 'Constant') {
        const t = n.attrs.get('value')?.tensor;
        if (!t) return undefined;
        try {
          return { tensor: { ...readTensor(t), name: n.outputs[0]! }, transposed };
        } catch {
          return undefined; // a constant in a form not read here (strings, say) is no weight
        }
      } else if (QUANTIZED.has(n.op)) return refuse(`a weight is quantized (${label(i)}), which is not read here`);
      else return undefined;
    }
    return undefined;
  };
  /** A tensor and every name it has through pass-through ops (Cast, Identity). */
  const same = (name: string): Set<string> => {
    const out = new Set([name]);
    const todo = [name];
    while (todo.length) {
      for (const c of consumers.get(todo.pop()!) ?? []) {
        const n = nodes[c]!;
        if (PASS.has(n.op) && !out.has(n.outputs[0]!)) {
          out.add(n.outputs[0]!);
          todo.push(n.outputs[0]!);
        }
      }
    }
    return out;
  };
  /** The tensor a name is a pass-through (or reshaped) copy of, walking back. */
  const origin = (name: string, reshapes: boolean): string => {
    for (;;) {
      const i = producer.get(name);
      if (i === undefined) return name;
      const n = nodes[i]!;
      if (PASS.has(n.op) || (reshapes && RESHAPE.has(n.op))) name = n.inputs[0]!;
      else return name;
    }
  };
  return { nodes, producer, consumers, label, constOf, same, origin };
}
