/**
 * ONNX models as protobuf, read and written here (there is no onnx package in Node): just the parts of
 * ModelProto that the server's own graphs need (onnx-graph.ts, gqa-builder.ts) and the initializers
 * they take from an exported model.
 *
 * Field numbers are onnx.proto3's: ModelProto{ir_version 1, producer_name 2, graph 7, opset_import 8},
 * GraphProto{node 1, name 2, initializer 5, input 11, output 12}, NodeProto{input 1, output 2, name 3,
 * op_type 4, attribute 5, domain 7}, TensorProto{dims 1, data_type 2, float_data 4, int32_data 5,
 * int64_data 7, name 8, raw_data 9, external_data 13, data_location 14}.
 */

/** ONNX TensorProto.DataType values used here. */
export const ONNX_FLOAT = 1;
export const ONNX_UINT8 = 2;
export const ONNX_INT32 = 6;
export const ONNX_INT64 = 7;
export const ONNX_FLOAT16 = 10;

/** Protobuf wire encoding: varints, fixed32 floats, length-delimited fields. Large byte fields are not copied until finish(). */
export class Writer {
  private readonly chunks: Uint8Array[] = [];
  private small: number[] = [];

  private flush(): void {
    if (this.small.length === 0) return;
    this.chunks.push(Uint8Array.from(this.small));
    this.small = [];
  }

  varint(v: number | bigint): this {
    let x = BigInt.asUintN(64, BigInt(v));
    do {
      let byte = Number(x & 0x7fn);
      x >>= 7n;
      if (x !== 0n) byte |= 0x80;
      this.small.push(byte);
    } while (x !== 0n);
    return this;
  }

  /** A varint field (wire type 0). */
  int(field: number, v: number | bigint): this {
    return this.varint((field << 3) | 0).varint(v);
  }

  /** A float field (wire type 5, little-endian fixed32). */
  float(field: number, v: number): this {
    this.varint((field << 3) | 5);
    const b = new Uint8Array(4);
    new DataView(b.buffer).setFloat32(0, v, true);
    for (const x of b) this.small.push(x);
    return this;
  }

  /** A length-delimited field (wire type 2): bytes, a string or a nested message. */
  bytes(field: number, b: Uint8Array): this {
    this.varint((field << 3) | 2).varint(b.length);
    this.flush();
    this.chunks.push(b);
    return this;
  }

  str(field: number, s: string): this {
    return this.bytes(field, new TextEncoder().encode(s));
  }

  msg(field: number, build: (w: Writer) => void): this {
    const w = new Writer();
    build(w);
    return this.bytes(field, w.finish());
  }

  finish(): Uint8Array {
    this.flush();
    return this.chunks.length === 1 ? this.chunks[0]! : concat(this.chunks) ?? new Uint8Array(0);
  }
}

/** One field as the reader meets it: a varint's value, or a length-delimited field's bytes. */
export interface Field {
  no: number;
  wire: number;
  value: bigint;
  bytes: Uint8Array;
}

/** Iterates the fields of one protobuf message (exported for tests that rewrite a model's bytes). */
export function* fields(buf: Uint8Array): Generator<Field> {
  let at = 0;
  const varint = (): bigint => {
    let x = 0n;
    let shift = 0n;
    for (;;) {
      const b = buf[at++];
      if (b === undefined) throw new Error('truncated protobuf');
      x |= BigInt(b & 0x7f) << shift;
      if ((b & 0x80) === 0) return x;
      shift += 7n;
    }
  };
  const empty = new Uint8Array(0);
  while (at < buf.length) {
    const key = Number(varint());
    const no = key >>> 3;
    const wire = key & 7;
    if (wire === 0) yield { no, wire, value: varint(), bytes: empty };
    else if (wire === 2) {
      const len = Number(varint());
      yield { no, wire, value: 0n, bytes: buf.subarray(at, at + len) };
      at += len;
    } else if (wire === 5) {
      yield { no, wire, value: 0n, bytes: buf.subarray(at, at + 4) };
      at += 4;
    } else if (wire === 1) {
      yield { no, wire, value: 0n, bytes: buf.subarray(at, at + 8) };
      at += 8;
    } else throw new Error(`protobuf wire type ${wire} is not supported`);
  }
}

/** Packed or repeated varints of one field. */
function varints(f: Field): bigint[] {
  if (f.wire === 0) return [f.value];
  const out: bigint[] = [];
  for (const g of fields(prefixPacked(f.bytes))) out.push(g.value);
  return out;
}

/** Packed varints carry no keys: give each one the key of field 1, wire type 0, so `fields` can read them. */
function prefixPacked(b: Uint8Array): Uint8Array {
  const out: number[] = [];
  let fresh = true;
  for (const x of b) {
    if (fresh) out.push(0x08);
    out.push(x);
    fresh = (x & 0x80) === 0;
  }
  return Uint8Array.from(out);
}

/** An initializer of an ONNX model: its element type, dims and little-endian bytes. */
export interface Initializer {
  name: string;
  dataType: number;
  dims: number[];
  data: Uint8Array;
}

export const ONNX_BFLOAT16 = 16;

// The fixed-width types (int8 3, uint16 4, int16 5, bool 9, double 11, uint32 12, uint64 13 too: a real
// export holds some beside its weights, and reading its graph must not stop at them).
const ELEMENT_BYTES: Record<number, number> = {
  [ONNX_FLOAT]: 4, [ONNX_UINT8]: 1, [ONNX_INT32]: 4, [ONNX_INT64]: 8, [ONNX_FLOAT16]: 2, [ONNX_BFLOAT16]: 2,
  3: 1, 4: 2, 5: 2, 9: 1, 11: 8, 12: 4, 13: 8,
};

/**
 * Reads `length` bytes (all to the end where undefined) at `offset` of an external data file named by
 * a tensor's `location` (relative to the model's directory).
 */
export type ExternalDataReader = (location: string, offset: number, length: number | undefined) => Uint8Array;

export function readTensor(buf: Uint8Array, external?: ExternalDataReader): Initializer {
  let name = '';
  let dataType = 0;
  const dims: number[] = [];
  let raw: Uint8Array | undefined;
  const floats: Uint8Array[] = [];
  const int32s: bigint[] = [];
  const int64s: bigint[] = [];
  let isExternal = false;
  const ext: Record<string, string> = {};
  for (const f of fields(buf)) {
    if (f.no === 1) dims.push(...varints(f).map(Number));
    else if (f.no === 2) dataType = Number(f.value);
    else if (f.no === 8) name = new TextDecoder().decode(f.bytes);
    else if (f.no === 9) raw = f.bytes;
    else if (f.no === 4) floats.push(f.bytes);
    else if (f.no === 5) int32s.push(...varints(f));
    else if (f.no === 7) int64s.push(...varints(f));
    else if (f.no === 14) isExternal = f.value === 1n;
    else if (f.no === 13) {
      let key = '';
      let value = '';
      for (const e of fields(f.bytes)) {
        if (e.no === 1) key = new TextDecoder().decode(e.bytes);
        else if (e.no === 2) value = new TextDecoder().decode(e.bytes);
      }
      ext[key] = value;
    }
  }
  if (isExternal) {
    if (!external) throw new Error(`initializer ${name}: external data is not supported here (no directory to read it from)`);
    if (!ext['location']) throw new Error(`initializer ${name}: external data without a location`);
    raw = external(ext['location'], Number(ext['offset'] ?? 0), ext['length'] === undefined ? undefined : Number(ext['length']));
  }
  const count = dims.reduce((a, b) => a * b, 1);
  let data = raw;
  if (!data && dataType === ONNX_FLOAT) data = concat(floats); // packed fixed32, already little-endian
  if (!data && (dataType === ONNX_FLOAT16 || dataType === ONNX_BFLOAT16)) data = new Uint8Array(Uint16Array.from(int32s, Number).buffer); // 16-bit words in int32_data
  if (!data && dataType === ONNX_INT64 && int64s.length === count) data = new Uint8Array(BigInt64Array.from(int64s, (v) => BigInt.asIntN(64, v)).buffer);
  if (!data && dataType === ONNX_INT32 && int32s.length === count) data = new Uint8Array(Int32Array.from(int32s, (v) => Number(BigInt.asIntN(32, v))).buffer);
  if (!data && count === 0) data = new Uint8Array(0);
  if (!data) throw new Error(`initializer ${name}: no data in a form read here`);
  if (data.length !== count * (ELEMENT_BYTES[dataType] ?? 0)) throw new Error(`initializer ${name}: ${data.length} bytes for dims [${dims}] of type ${dataType}`);
  // A copy: the tensor's own aligned buffer, not a view into the file's (Node's Buffer.slice does not copy).
  return { name, dataType, dims, data: new Uint8Array(data) };
}

function concat(parts: Uint8Array[]): Uint8Array | undefined {
  if (parts.length === 0) return undefined;
  const out = new Uint8Array(parts.reduce((s, p) => s + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** Files an ONNX model keeps initializers in (external data 'location's), relative to the model's directory. */
export function externalDataFiles(model: Uint8Array): string[] {
  const files = new Set<string>();
  for (const f of fields(model)) {
    if (f.no !== 7) continue;
    for (const g of fields(f.bytes)) {
      if (g.no !== 5) continue;
      for (const t of fields(g.bytes)) {
        if (t.no !== 13) continue; // external_data: StringStringEntryProto{key 1, value 2}
        let key = '';
        let value = '';
        for (const e of fields(t.bytes)) {
          if (e.no === 1) key = new TextDecoder().decode(e.bytes);
          else if (e.no === 2) value = new TextDecoder().decode(e.bytes);
        }
        if (key === 'location') files.add(value);
      }
    }
  }
  return [...files];
}

/** Every initializer of a serialized ModelProto's graph, by name; external data through `external`. */
export function readInitializers(model: Uint8Array, external?: ExternalDataReader): Map<string, Initializer> {
  const out = new Map<string, Initializer>();
  for (const f of fields(model)) {
    if (f.no !== 7) continue;
    for (const g of fields(f.bytes)) {
      if (g.no !== 5) continue;
      const t = readTensor(g.bytes, external);
      out.set(t.name, t);
    }
  }
  return out;
}

export type Dim = number | string;

export type Attribute =
  | { int: number }
  | { float: number }
  | { ints: readonly number[] };

export interface NodeSpec {
  op: string;
  inputs: readonly string[];
  outputs: readonly string[];
  domain?: string;
  attrs?: Readonly<Record<string, Attribute>>;
}

export interface ValueSpec {
  name: string;
  elemType: number;
  dims: readonly Dim[];
}

export interface GraphSpec {
  name: string;
  nodes: readonly NodeSpec[];
  initializers: readonly Initializer[];
  inputs: readonly ValueSpec[];
  outputs: readonly ValueSpec[];
  /** Opset per domain ('' is ai.onnx). */
  opsets: Readonly<Record<string, number>>;
}

/** ValueInfoProto: a tensor of `elemType` with the given dims (numbers fixed, strings symbolic). */
function valueInfo(w: Writer, field: number, v: ValueSpec): void {
  w.msg(field, (info) => {
    info.str(1, v.name);
    info.msg(2, (type) => type.msg(1, (tensor) => {
      tensor.int(1, v.elemType);
      tensor.msg(2, (shape) => {
        for (const d of v.dims) shape.msg(1, (dim) => (typeof d === 'number' ? dim.int(1, d) : dim.str(2, d)));
      });
    }));
  });
}

function attribute(w: Writer, name: string, a: Attribute): void {
  // AttributeProto{name 1, f 2, i 3, ints 8, type 20}; AttributeType FLOAT 1, INT 2, INTS 7.
  w.msg(5, (m) => {
    m.str(1, name);
    if ('int' in a) m.int(3, a.int).int(20, 2);
    else if ('float' in a) m.float(2, a.float).int(20, 1);
    else {
      for (const v of a.ints) m.int(8, v);
      m.int(20, 7);
    }
  });
}

/**
 * Where writeModel puts large initializers instead of the graph file (one protobuf holds 2 GiB at most):
 * each of `minBytes` or more is handed to `place`, which stores it and says at what offset of the file
 * named `location` (beside the graph) it lies.
 */
export interface ExternalDataSink {
  location: string;
  minBytes: number;
  place: (data: Uint8Array) => number;
}

/** A serialized ModelProto (IR version 8); large initializers into `external` where given. */
export function writeModel(g: GraphSpec, external?: ExternalDataSink): Uint8Array {
  const model = new Writer();
  model.int(1, 8);
  model.str(2, 'ragguard');
  model.msg(7, (graph) => {
    g.nodes.forEach((n, i) => graph.msg(1, (node) => {
      for (const x of n.inputs) node.str(1, x);
      for (const y of n.outputs) node.str(2, y);
      node.str(3, `${n.op}_${i}`);
      node.str(4, n.op);
      for (const [k, a] of Object.entries(n.attrs ?? {})) attribute(node, k, a);
      if (n.domain) node.str(7, n.domain);
    }));
    graph.str(2, g.name);
    for (const t of g.initializers) {
      graph.msg(5, (m) => {
        for (const d of t.dims) m.int(1, d);
        m.int(2, t.dataType);
        m.str(8, t.name);
        if (!external || t.data.length < external.minBytes) {
          m.bytes(9, t.data);
          return;
        }
        // TensorProto.external_data (13): location, offset, length; data_location (14) EXTERNAL.
        const offset = external.place(t.data);
        m.msg(13, (e) => e.str(1, 'location').str(2, external.location));
        m.msg(13, (e) => e.str(1, 'offset').str(2, String(offset)));
        m.msg(13, (e) => e.str(1, 'length').str(2, String(t.data.length)));
        m.int(14, 1);
      });
    }
    for (const v of g.inputs) valueInfo(graph, 11, v);
    for (const v of g.outputs) valueInfo(graph, 12, v);
  });
  for (const [domain, version] of Object.entries(g.opsets)) model.msg(8, (o) => o.str(1, domain).int(2, version));
  return model.finish();
}

/** An int64 initializer. */
export function int64s(name: string, values: readonly bigint[], dims: readonly number[] = [values.length]): Initializer {
  return { name, dataType: ONNX_INT64, dims: [...dims], data: new Uint8Array(BigInt64Array.from(values).buffer) };
}

/**
 * A node attribute as read: the scalar and list forms, and a tensor's TensorProto bytes (a Constant's
 * value), parsed only when asked for (readTensor), since most are shape constants of no interest.
 */
export interface ReadAttribute {
  int?: bigint;
  float?: number;
  str?: string;
  ints?: bigint[];
  tensor?: Uint8Array;
}

export interface ReadNode {
  op: string;
  domain: string;
  name: string;
  inputs: string[];
  outputs: string[];
  attrs: Map<string, ReadAttribute>;
}

/** A model's main graph as read: nodes in file (topological) order, initializers, input and output names. */
export interface ReadGraph {
  nodes: ReadNode[];
  initializers: Map<string, Initializer>;
  inputs: string[];
  outputs: string[];
  /** Names of the model's local functions (ModelProto.functions): nodes calling them are opaque here. */
  functions: string[];
}

function readAttribute(buf: Uint8Array): [string, ReadAttribute] {
  // AttributeProto{name 1, f 2, i 3, s 4, t 5, ints 8}.
  let name = '';
  const a: ReadAttribute = {};
  for (const f of fields(buf)) {
    if (f.no === 1) name = new TextDecoder().decode(f.bytes);
    else if (f.no === 2 && f.wire === 5) a.float = new DataView(f.bytes.buffer, f.bytes.byteOffset, 4).getFloat32(0, true);
    else if (f.no === 3) a.int = BigInt.asIntN(64, f.value);
    else if (f.no === 4) a.str = new TextDecoder().decode(f.bytes);
    else if (f.no === 5) a.tensor = f.bytes;
    else if (f.no === 8) a.ints = [...(a.ints ?? []), ...varints(f).map((v) => BigInt.asIntN(64, v))];
  }
  return [name, a];
}

function nameOf(buf: Uint8Array): string {
  for (const f of fields(buf)) if (f.no === 1) return new TextDecoder().decode(f.bytes);
  return '';
}

/** The main graph of a serialized ModelProto: nodes, initializers (external data through `external`), inputs and outputs. */
export function readGraph(model: Uint8Array, external?: ExternalDataReader): ReadGraph {
  const g: ReadGraph = { nodes: [], initializers: new Map(), inputs: [], outputs: [], functions: [] };
  for (const f of fields(model)) {
    if (f.no === 25) {
      // FunctionProto{name 1, domain 10}.
      for (const h of fields(f.bytes)) if (h.no === 1) g.functions.push(new TextDecoder().decode(h.bytes));
    }
    if (f.no !== 7) continue;
    for (const h of fields(f.bytes)) {
      if (h.no === 1) {
        const n: ReadNode = { op: '', domain: '', name: '', inputs: [], outputs: [], attrs: new Map() };
        for (const k of fields(h.bytes)) {
          if (k.no === 1) n.inputs.push(new TextDecoder().decode(k.bytes));
          else if (k.no === 2) n.outputs.push(new TextDecoder().decode(k.bytes));
          else if (k.no === 3) n.name = new TextDecoder().decode(k.bytes);
          else if (k.no === 4) n.op = new TextDecoder().decode(k.bytes);
          else if (k.no === 7) n.domain = new TextDecoder().decode(k.bytes);
          else if (k.no === 5) {
            const [name, a] = readAttribute(k.bytes);
            n.attrs.set(name, a);
          }
        }
        g.nodes.push(n);
      } else if (h.no === 5) {
        const t = readTensor(h.bytes, external);
        g.initializers.set(t.name, t);
      } else if (h.no === 11) g.inputs.push(nameOf(h.bytes));
      else if (h.no === 12) g.outputs.push(nameOf(h.bytes));
    }
  }
  return g;
}
