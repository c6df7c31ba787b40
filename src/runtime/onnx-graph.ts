/**
 * Small ONNX graphs the server builds itself, written straight as protobuf (no onnx package in Node).
 *
 * kvTailModel: takes the last `n` positions of each present-KV tensor [batch, kv_heads, positions,
 * head_dim] (inputs x0..xK-1, plus `starts` = [-n]) and returns them as y0..yK-1. Run on the device
 * that holds the present KV, with outputs in host memory, it is how the engine writes the device's new
 * tokens back to the host pool: ONNX Runtime's own copy brings back only the tail, a few tokens per row
 * (onnxruntime-node 1.30 cannot download a 'gpu-buffer' tensor through Tensor.getData: it aborts).
 */

/** ONNX TensorProto.DataType values used here. */
export const ONNX_FLOAT = 1;
export const ONNX_INT64 = 7;
export const ONNX_FLOAT16 = 10;

/** Protobuf wire encoding, only what ModelProto needs: varints, length-delimited fields. */
class Writer {
  private readonly parts: number[] = [];

  varint(v: number | bigint): this {
    let x = BigInt.asUintN(64, BigInt(v));
    do {
      let byte = Number(x & 0x7fn);
      x >>= 7n;
      if (x !== 0n) byte |= 0x80;
      this.parts.push(byte);
    } while (x !== 0n);
    return this;
  }

  /** A varint field (wire type 0). */
  int(field: number, v: number | bigint): this {
    return this.varint((field << 3) | 0).varint(v);
  }

  /** A length-delimited field (wire type 2): bytes, a string or a nested message. */
  bytes(field: number, b: Uint8Array): this {
    this.varint((field << 3) | 2).varint(b.length);
    for (const x of b) this.parts.push(x);
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
    return Uint8Array.from(this.parts);
  }
}

type Dim = number | string;

/** ValueInfoProto: a tensor of `elemType` with the given dims (numbers fixed, strings symbolic). */
function valueInfo(w: Writer, field: number, name: string, elemType: number, dims: readonly Dim[]): void {
  w.msg(field, (v) => {
    v.str(1, name);
    v.msg(2, (type) => type.msg(1, (tensor) => {
      tensor.int(1, elemType);
      tensor.msg(2, (shape) => {
        for (const d of dims) shape.msg(1, (dim) => (typeof d === 'number' ? dim.int(1, d) : dim.str(2, d)));
      });
    }));
  });
}

/** An int64 initializer (TensorProto with int64_data). */
function int64Initializer(w: Writer, name: string, values: readonly bigint[]): void {
  w.msg(5, (t) => {
    t.int(1, values.length); // dims: [n]
    t.int(2, ONNX_INT64);
    for (const v of values) t.int(7, v);
    t.str(8, name);
  });
}

export function kvTailModel(count: number, elemType: number): Uint8Array {
  const dims: Dim[] = ['batch', 'kv_heads', 'positions', 'head_dim'];
  const model = new Writer();
  model.int(1, 8); // ir_version
  model.str(2, 'ragguard');
  model.msg(7, (g) => {
    for (let i = 0; i < count; i++) {
      g.msg(1, (n) => {
        n.str(1, `x${i}`).str(1, 'starts').str(1, 'ends').str(1, 'axes');
        n.str(2, `y${i}`);
        n.str(3, `tail${i}`);
        n.str(4, 'Slice');
      });
    }
    g.str(2, 'kv_tail');
    int64Initializer(g, 'ends', [2n ** 62n]);
    int64Initializer(g, 'axes', [2n]);
    for (let i = 0; i < count; i++) valueInfo(g, 11, `x${i}`, elemType, dims);
    valueInfo(g, 11, 'starts', ONNX_INT64, [1]);
    for (let i = 0; i < count; i++) valueInfo(g, 12, `y${i}`, elemType, ['batch', 'kv_heads', 'tail', 'head_dim']);
  });
  model.msg(8, (o) => o.str(1, '').int(2, 17)); // opset_import: default domain, opset 17
  return model.finish();
}
