/**
 * GGUF files (llama.cpp's and Ollama's model format), read here without ggml: the header, every
 * metadata key/value type, the tensor infos and the aligned data section, after ggml's spec
 * (docs/gguf.md). Tensors are read from the file on demand (a multi-GiB model is not held whole).
 *
 *   header   magic "GGUF", version u32 (2 or 3), tensor_count u64, kv_count u64
 *   kv       key (string), value type u32, value; an array is element type u32, count u64, elements
 *   tensors  name (string), n_dims u32, dims u64[n_dims] (dims[0] the fastest-varying: a [out, in]
 *            torch weight is [in, out] here), ggml type u32, offset u64 (from the data section)
 *   data     at the end of the tensor infos rounded up to general.alignment (default 32)
 * Strings are a u64 byte length and UTF-8 bytes; everything is little-endian.
 */
import { closeSync, fstatSync, openSync, readSync } from 'node:fs';

export type GgufValue = number | bigint | boolean | string | GgufValue[];

/** ggml tensor types that this reader dequantizes (ggml.h's enum ggml_type values). */
export const GGML = {
  F32: 0, F16: 1, Q4_0: 2, Q4_1: 3, Q5_0: 6, Q8_0: 8, Q4_K: 12, Q6_K: 14, BF16: 30,
} as const;

const TYPE_NAMES: Record<number, string> = {
  0: 'F32', 1: 'F16', 2: 'Q4_0', 3: 'Q4_1', 6: 'Q5_0', 7: 'Q5_1', 8: 'Q8_0', 9: 'Q8_1', 10: 'Q2_K', 11: 'Q3_K',
  12: 'Q4_K', 13: 'Q5_K', 14: 'Q6_K', 15: 'Q8_K', 16: 'IQ2_XXS', 17: 'IQ2_XS', 18: 'IQ3_XXS', 19: 'IQ1_S', 20: 'IQ4_NL',
  21: 'IQ3_S', 22: 'IQ2_S', 23: 'IQ4_XS', 24: 'I8', 25: 'I16', 26: 'I32', 27: 'I64', 28: 'F64', 29: 'IQ1_M', 30: 'BF16',
  34: 'TQ1_0', 35: 'TQ2_0', 39: 'MXFP4',
};

export function ggmlTypeName(t: number): string {
  return TYPE_NAMES[t] ?? `type ${t}`;
}

/** Elements per block and bytes per block of each type read here. */
const BLOCKS: Record<number, { elems: number; bytes: number }> = {
  [GGML.F32]: { elems: 1, bytes: 4 },
  [GGML.F16]: { elems: 1, bytes: 2 },
  [GGML.BF16]: { elems: 1, bytes: 2 },
  [GGML.Q4_0]: { elems: 32, bytes: 18 }, // d f16, 16 bytes of nibbles
  [GGML.Q4_1]: { elems: 32, bytes: 20 }, // d f16, m f16, 16 bytes of nibbles
  [GGML.Q5_0]: { elems: 32, bytes: 22 }, // d f16, qh u32 (the 5th bits), 16 bytes of nibbles
  [GGML.Q8_0]: { elems: 32, bytes: 34 }, // d f16, 32 int8
  [GGML.Q4_K]: { elems: 256, bytes: 144 }, // d f16, dmin f16, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
  [GGML.Q6_K]: { elems: 256, bytes: 210 }, // 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 int8 scales, d f16
};

export interface GgufTensorInfo {
  name: string;
  /** ggml order: dims[0] varies fastest (the row length). */
  dims: number[];
  type: number;
  /** Absolute byte offset in the file. */
  offset: number;
  bytes: number;
}

export class GgufFile {
  private constructor(
    readonly path: string,
    private readonly fd: number,
    readonly version: number,
    readonly metadata: ReadonlyMap<string, GgufValue>,
    /** Each key's GGUF value type, and an array's element type (what a writer needs to copy it). */
    readonly metadataTypes: ReadonlyMap<string, GgufValueType>,
    readonly tensors: ReadonlyMap<string, GgufTensorInfo>,
    readonly alignment: number,
    readonly dataOffset: number,
  ) {}

  static open(path: string): GgufFile {
    const fd = openSync(path, 'r');
    try {
      const size = fstatSync(fd).size;
      // Metadata (a vocabulary of 150k tokens and merges is some MB) is read from a prefix that doubles
      // until it holds the header, the key/values and the tensor infos.
      for (let prefix = Math.min(size, 8 * 2 ** 20); ; prefix = Math.min(size, prefix * 2)) {
        const buf = Buffer.alloc(prefix);
        readSync(fd, buf, 0, prefix, 0);
        try {
          const h = parseHeader(buf, size, path);
          return new GgufFile(path, fd, h.version, h.metadata, h.metadataTypes, h.tensors, h.alignment, h.dataOffset);
        } catch (e) {
          if (!(e instanceof Truncated) || prefix >= size) throw e instanceof Truncated ? new Error(`${path}: truncated GGUF file`) : e;
        }
      }
    } catch (e) {
      closeSync(fd);
      throw e;
    }
  }

  close(): void {
    closeSync(this.fd);
  }

  get(key: string): GgufValue | undefined {
    return this.metadata.get(key);
  }

  /** A metadata number (any integer or float type), or `fallback` where absent. */
  num(key: string, fallback?: number): number {
    const v = this.metadata.get(key);
    if (v === undefined) {
      if (fallback === undefined) throw new Error(`${this.path}: metadata ${key} is missing`);
      return fallback;
    }
    if (typeof v === 'number') return v;
    if (typeof v === 'bigint') return Number(v);
    if (typeof v === 'boolean') return v ? 1 : 0;
    throw new Error(`${this.path}: metadata ${key} is not a number`);
  }

  str(key: string): string | undefined {
    const v = this.metadata.get(key);
    if (v === undefined) return undefined;
    if (typeof v !== 'string') throw new Error(`${this.path}: metadata ${key} is not a string`);
    return v;
  }

  tensor(name: string): GgufTensorInfo | undefined {
    return this.tensors.get(name);
  }

  need(name: string): GgufTensorInfo {
    const t = this.tensors.get(name);
    if (!t) throw new Error(`${this.path}: tensor ${name} is missing`);
    return t;
  }

  /** The tensor's stored bytes (quantized blocks as they are). */
  raw(t: GgufTensorInfo): Uint8Array {
    const buf = Buffer.alloc(t.bytes);
    let at = 0;
    while (at < t.bytes) {
      const n = readSync(this.fd, buf, at, t.bytes - at, t.offset + at);
      if (n <= 0) throw new Error(`${this.path}: tensor ${t.name} runs past the end of the file`);
      at += n;
    }
    return new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
  }

  /** The tensor dequantized to float32, in its stored order (rows of dims[0]). */
  floats(t: GgufTensorInfo): Float32Array {
    return dequantize(t.type, this.raw(t), elementCount(t.dims), t.name);
  }
}

export function elementCount(dims: readonly number[]): number {
  return dims.reduce((a, b) => a * b, 1);
}

class Truncated extends Error {}

export interface GgufValueType {
  type: number;
  elemType?: number;
}

/** GGUF value types (gguf_type). */
export const GGUF_TYPE = { U8: 0, I8: 1, U16: 2, I16: 3, U32: 4, I32: 5, F32: 6, BOOL: 7, STRING: 8, ARRAY: 9, U64: 10, I64: 11, F64: 12 } as const;

const T = GGUF_TYPE;

function parseHeader(buf: Buffer, fileSize: number, path: string) {
  let at = 0;
  const need = (n: number) => {
    if (at + n > buf.length) throw new Truncated();
  };
  const u32 = () => { need(4); const v = buf.readUInt32LE(at); at += 4; return v; };
  const u64 = () => { need(8); const v = buf.readBigUInt64LE(at); at += 8; return v; };
  const size = () => {
    const v = u64();
    if (v > BigInt(fileSize)) throw new Error(`${path}: a length of ${v} bytes exceeds the file`);
    return Number(v);
  };
  const str = () => { const n = size(); need(n); const s = buf.toString('utf8', at, at + n); at += n; return s; };
  const value = (type: number): GgufValue => {
    switch (type) {
      case T.U8: need(1); return buf.readUInt8(at++);
      case T.I8: need(1); return buf.readInt8(at++);
      case T.U16: { need(2); const v = buf.readUInt16LE(at); at += 2; return v; }
      case T.I16: { need(2); const v = buf.readInt16LE(at); at += 2; return v; }
      case T.U32: return u32();
      case T.I32: { need(4); const v = buf.readInt32LE(at); at += 4; return v; }
      case T.F32: { need(4); const v = buf.readFloatLE(at); at += 4; return v; }
      case T.BOOL: { need(1); const v = buf.readUInt8(at++); return v !== 0; }
      case T.STRING: return str();
      case T.U64: { const v = u64(); return v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v; }
      case T.I64: { need(8); const v = buf.readBigInt64LE(at); at += 8; return v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v; }
      case T.F64: { need(8); const v = buf.readDoubleLE(at); at += 8; return v; }
      case T.ARRAY: {
        const elem = u32();
        const n = size();
        const out: GgufValue[] = new Array(n);
        for (let i = 0; i < n; i++) out[i] = value(elem);
        return out;
      }
      default: throw new Error(`${path}: unknown GGUF value type ${type}`);
    }
  };
  need(4);
  if (buf.toString('latin1', 0, 4) !== 'GGUF') throw new Error(`${path}: not a GGUF file (magic ${JSON.stringify(buf.toString('latin1', 0, 4))})`);
  at = 4;
  const version = u32();
  if (version !== 2 && version !== 3) throw new Error(`${path}: GGUF version ${version} is not supported (2 or 3)`);
  const tensorCount = Number(u64());
  const kvCount = Number(u64());
  const metadata = new Map<string, GgufValue>();
  const metadataTypes = new Map<string, GgufValueType>();
  for (let i = 0; i < kvCount; i++) {
    const key = str();
    const type = u32();
    metadataTypes.set(key, type === T.ARRAY ? { type, elemType: buf.readUInt32LE(at) } : { type });
    metadata.set(key, value(type));
  }
  const alignment = typeof metadata.get('general.alignment') === 'number' ? metadata.get('general.alignment') as number : 32;
  if (alignment <= 0 || (alignment & (alignment - 1)) !== 0) throw new Error(`${path}: general.alignment ${alignment} is not a power of two`);
  const infos: { name: string; dims: number[]; type: number; rel: bigint }[] = [];
  for (let i = 0; i < tensorCount; i++) {
    const name = str();
    const nd = u32();
    if (nd > 8) throw new Error(`${path}: tensor ${name} has ${nd} dimensions`);
    const dims = Array.from({ length: nd }, () => Number(u64()));
    const type = u32();
    infos.push({ name, dims, type, rel: u64() });
  }
  const dataOffset = Math.ceil(at / alignment) * alignment;
  const tensors = new Map<string, GgufTensorInfo>();
  for (const t of infos) {
    const offset = dataOffset + Number(t.rel);
    const b = BLOCKS[t.type];
    const n = elementCount(t.dims);
    // Types not read here still get a placeholder size of 0: they are refused when used, by name.
    const bytes = b ? (n / b.elems) * b.bytes : 0;
    if (b && n % b.elems !== 0) throw new Error(`${path}: tensor ${t.name} of ${n} elements is not whole ${ggmlTypeName(t.type)} blocks`);
    if (offset % alignment !== 0) throw new Error(`${path}: tensor ${t.name} is not aligned to ${alignment}`);
    if (offset + bytes > fileSize) throw new Error(`${path}: tensor ${t.name} runs past the end of the file`);
    tensors.set(t.name, { name: t.name, dims: t.dims, type: t.type, offset, bytes });
  }
  return { version, metadata, metadataTypes, tensors, alignment, dataOffset };
}

/** IEEE half to float. */
export function halfToFloat(h: number): number {
  const s = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m ? NaN : s * Infinity;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}

const HALF = new Float32Array(65536).map((_, h) => halfToFloat(h));

function f16(b: Uint8Array, at: number): number {
  return HALF[b[at]! | (b[at + 1]! << 8)]!;
}

/** Q4_K's 6-bit scale and min of sub-block j (0..7) from its 12 packed bytes at `s`. */
export function q4kScaleMin(b: Uint8Array, s: number, j: number): [number, number] {
  if (j < 4) return [b[s + j]! & 63, b[s + j + 4]! & 63];
  return [(b[s + j + 4]! & 0x0f) | ((b[s + j - 4]! >> 6) << 4), (b[s + j + 4]! >> 4) | ((b[s + j]! >> 6) << 4)];
}

/**
 * Element j (0..31) of the Q5_0 block at `at`, unsigned (0..31; the value is (q - 16) d): its low 4 bits
 * are nibbles as Q4_0's (j < 16 low, else high, of byte j mod 16), its 5th bit is bit j of qh.
 */
export function q5Value(b: Uint8Array, at: number, j: number): number {
  const qh = (b[at + 2]! | (b[at + 3]! << 8) | (b[at + 4]! << 16) | (b[at + 5]! << 24)) >>> 0;
  const nibble = j < 16 ? b[at + 6 + j]! & 0x0f : b[at + 6 + j - 16]! >> 4;
  return nibble | (((qh >>> j) & 1) << 4);
}

/** `n` float32 values of a tensor of ggml type `type` from its stored bytes. */
export function dequantize(type: number, b: Uint8Array, n: number, name = 'tensor'): Float32Array {
  const out = new Float32Array(n);
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  switch (type) {
    case GGML.F32:
      for (let i = 0; i < n; i++) out[i] = dv.getFloat32(i * 4, true);
      return out;
    case GGML.F16:
      for (let i = 0; i < n; i++) out[i] = f16(b, i * 2);
      return out;
    case GGML.BF16:
      for (let i = 0; i < n; i++) out[i] = new Float32Array(Uint32Array.of(dv.getUint16(i * 2, true) << 16).buffer)[0]!;
      return out;
    case GGML.Q4_0:
      for (let blk = 0; blk < n / 32; blk++) {
        const at = blk * 18;
        const d = f16(b, at);
        for (let j = 0; j < 16; j++) {
          const q = b[at + 2 + j]!;
          out[blk * 32 + j] = ((q & 0x0f) - 8) * d;
          out[blk * 32 + j + 16] = ((q >> 4) - 8) * d;
        }
      }
      return out;
    case GGML.Q4_1:
      for (let blk = 0; blk < n / 32; blk++) {
        const at = blk * 20;
        const d = f16(b, at);
        const m = f16(b, at + 2);
        for (let j = 0; j < 16; j++) {
          const q = b[at + 4 + j]!;
          out[blk * 32 + j] = (q & 0x0f) * d + m;
          out[blk * 32 + j + 16] = (q >> 4) * d + m;
        }
      }
      return out;
    case GGML.Q5_0:
      for (let blk = 0; blk < n / 32; blk++) {
        const at = blk * 22;
        const d = f16(b, at);
        for (let j = 0; j < 32; j++) out[blk * 32 + j] = (q5Value(b, at, j) - 16) * d;
      }
      return out;
    case GGML.Q8_0:
      for (let blk = 0; blk < n / 32; blk++) {
        const at = blk * 34;
        const d = f16(b, at);
        for (let j = 0; j < 32; j++) out[blk * 32 + j] = dv.getInt8(at + 2 + j) * d;
      }
      return out;
    case GGML.Q4_K:
      for (let blk = 0; blk < n / 256; blk++) {
        const at = blk * 144;
        const d = f16(b, at);
        const dmin = f16(b, at + 2);
        // 4 chunks of 64: sub-block 2c from the low nibbles of 32 bytes, 2c + 1 from their high nibbles.
        for (let c = 0; c < 4; c++) {
          const [s1, m1] = q4kScaleMin(b, at + 4, 2 * c);
          const [s2, m2] = q4kScaleMin(b, at + 4, 2 * c + 1);
          const q = at + 16 + 32 * c;
          const y = blk * 256 + 64 * c;
          for (let l = 0; l < 32; l++) {
            out[y + l] = d * s1 * (b[q + l]! & 0x0f) - dmin * m1;
            out[y + 32 + l] = d * s2 * (b[q + l]! >> 4) - dmin * m2;
          }
        }
      }
      return out;
    case GGML.Q6_K:
      for (let blk = 0; blk < n / 256; blk++) {
        const at = blk * 210;
        const d = f16(b, at + 208);
        // Two halves of 128: 64 bytes of low nibbles, 32 bytes of high bit pairs, 8 scales each.
        for (let half = 0; half < 2; half++) {
          const ql = at + 64 * half;
          const qh = at + 128 + 32 * half;
          const sc = at + 192 + 8 * half;
          const y = blk * 256 + 128 * half;
          for (let l = 0; l < 32; l++) {
            const is = l >> 4;
            const h = b[qh + l]!;
            const q1 = ((b[ql + l]! & 0x0f) | ((h & 3) << 4)) - 32;
            const q2 = ((b[ql + l + 32]! & 0x0f) | (((h >> 2) & 3) << 4)) - 32;
            const q3 = ((b[ql + l]! >> 4) | (((h >> 4) & 3) << 4)) - 32;
            const q4 = ((b[ql + l + 32]! >> 4) | (((h >> 6) & 3) << 4)) - 32;
            out[y + l] = d * dv.getInt8(sc + is) * q1;
            out[y + l + 32] = d * dv.getInt8(sc + is + 2) * q2;
            out[y + l + 64] = d * dv.getInt8(sc + is + 4) * q3;
            out[y + l + 96] = d * dv.getInt8(sc + is + 6) * q4;
          }
        }
      }
      return out;
    default:
      throw new Error(`${name}: ggml type ${ggmlTypeName(type)} is not supported (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K are)`);
  }
}

/** Bytes of one row of `rowLength` elements of a type read here. */
export function rowBytes(type: number, rowLength: number): number {
  const b = BLOCKS[type];
  if (!b) throw new Error(`ggml type ${ggmlTypeName(type)} is not supported`);
  return (rowLength / b.elems) * b.bytes;
}

export interface GgufTensorOut {
  name: string;
  /** ggml order (dims[0] the row length). */
  dims: number[];
  type: number;
  data: Uint8Array;
}

/**
 * A GGUF file (version 3) as bytes: metadata with their value types, tensors aligned to
 * `general.alignment` (32 where absent). For tests and reference files (an F32 copy of a quantized
 * model), not for models of GiBs.
 */
export function writeGguf(metadata: readonly [string, GgufValueType, GgufValue][], tensors: readonly GgufTensorOut[]): Uint8Array {
  const parts: Buffer[] = [];
  const u32 = (v: number) => { const b = Buffer.alloc(4); b.writeUInt32LE(v); parts.push(b); };
  const u64 = (v: number | bigint) => { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(v)); parts.push(b); };
  const str = (s: string) => { const b = Buffer.from(s, 'utf8'); u64(b.length); parts.push(b); };
  const value = (type: number, v: GgufValue, elemType?: number) => {
    const b = Buffer.alloc(8);
    switch (type) {
      case T.U8: b.writeUInt8(Number(v)); parts.push(b.subarray(0, 1)); return;
      case T.I8: b.writeInt8(Number(v)); parts.push(b.subarray(0, 1)); return;
      case T.U16: b.writeUInt16LE(Number(v)); parts.push(b.subarray(0, 2)); return;
      case T.I16: b.writeInt16LE(Number(v)); parts.push(b.subarray(0, 2)); return;
      case T.U32: b.writeUInt32LE(Number(v)); parts.push(b.subarray(0, 4)); return;
      case T.I32: b.writeInt32LE(Number(v)); parts.push(b.subarray(0, 4)); return;
      case T.F32: b.writeFloatLE(Number(v)); parts.push(b.subarray(0, 4)); return;
      case T.BOOL: b.writeUInt8(v ? 1 : 0); parts.push(b.subarray(0, 1)); return;
      case T.STRING: str(String(v)); return;
      case T.U64: b.writeBigUInt64LE(BigInt(v as number | bigint)); parts.push(b); return;
      case T.I64: b.writeBigInt64LE(BigInt(v as number | bigint)); parts.push(b); return;
      case T.F64: b.writeDoubleLE(Number(v)); parts.push(b); return;
      case T.ARRAY: {
        if (elemType === undefined || !Array.isArray(v)) throw new Error('a GGUF array needs its element type and an array');
        u32(elemType);
        u64(v.length);
        for (const x of v) value(elemType, x);
        return;
      }
      default: throw new Error(`GGUF value type ${type} cannot be written`);
    }
  };
  const alignment = Number(metadata.find(([k]) => k === 'general.alignment')?.[2] ?? 32);
  parts.push(Buffer.from('GGUF', 'latin1'));
  u32(3);
  u64(tensors.length);
  u64(metadata.length);
  for (const [key, t, v] of metadata) {
    str(key);
    u32(t.type);
    value(t.type, v, t.elemType);
  }
  let offset = 0;
  const offsets: number[] = [];
  for (const t of tensors) {
    str(t.name);
    u32(t.dims.length);
    for (const d of t.dims) u64(d);
    u32(t.type);
    offsets.push(offset);
    u64(offset);
    offset += Math.ceil(t.data.length / alignment) * alignment;
  }
  const head = Buffer.concat(parts);
  const start = Math.ceil(head.length / alignment) * alignment;
  const out = new Uint8Array(start + offset);
  out.set(head, 0);
  tensors.forEach((t, i) => out.set(t.data, start + offsets[i]!));
  return out;
}
