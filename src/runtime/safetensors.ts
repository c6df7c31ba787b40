/**
 * The safetensors format (Hugging Face's weights files, PEFT's adapter_model.safetensors): an
 * 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape and byte range
 * in the data that follows, then the data. The header alone says every tensor's size, so that an
 * adapter's bytes are known before it loads.
 */
import { open } from 'node:fs/promises';
import { halfsToFloats } from './float16.js';

export type SafetensorsDtype = 'F32' | 'F16' | 'BF16';

export interface TensorEntry {
  dtype: SafetensorsDtype;
  shape: number[];
  /** Byte range in the data section. */
  offsets: [number, number];
}

export interface SafetensorsHeader {
  tensors: Map<string, TensorEntry>;
  metadata: Record<string, string>;
  /** Where the data section starts in the file. */
  dataStart: number;
}

const DTYPE_BYTES: Record<SafetensorsDtype, number> = { F32: 4, F16: 2, BF16: 2 };
/** Larger headers are not weights files (the format's own reference caps them at 100 MB). */
const MAX_HEADER = 100_000_000;

export class SafetensorsError extends Error {}

/** Parses a header's JSON, checking each entry's dtype, shape and byte range. */
export function parseHeader(json: string, dataStart: number, dataBytes?: number): SafetensorsHeader {
  let raw: unknown;
  try {
    raw = JSON.parse(json);
  } catch {
    throw new SafetensorsError('header is not JSON');
  }
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw new SafetensorsError('header is not a JSON object');
  const tensors = new Map<string, TensorEntry>();
  let metadata: Record<string, string> = {};
  for (const [name, v] of Object.entries(raw as Record<string, unknown>)) {
    if (name === '__metadata__') {
      metadata = v as Record<string, string>;
      continue;
    }
    const e = v as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
    if (e.dtype !== 'F32' && e.dtype !== 'F16' && e.dtype !== 'BF16') throw new SafetensorsError(`tensor ${name}: dtype ${String(e.dtype)} (F32, F16 or BF16 expected)`);
    const shape = e.shape;
    const offsets = e.data_offsets;
    if (!Array.isArray(shape) || !shape.every((d) => Number.isInteger(d) && d >= 0)) throw new SafetensorsError(`tensor ${name}: bad shape`);
    if (!Array.isArray(offsets) || offsets.length !== 2 || !offsets.every((o) => Number.isInteger(o) && o >= 0)) {
      throw new SafetensorsError(`tensor ${name}: bad data_offsets`);
    }
    const [begin, end] = offsets as [number, number];
    const size = (shape as number[]).reduce((a, b) => a * b, 1) * DTYPE_BYTES[e.dtype];
    if (end - begin !== size) throw new SafetensorsError(`tensor ${name}: ${end - begin} bytes for shape [${shape.join(', ')}] ${e.dtype}`);
    if (dataBytes !== undefined && end > dataBytes) throw new SafetensorsError(`tensor ${name}: data past the end of the file`);
    tensors.set(name, { dtype: e.dtype, shape: shape as number[], offsets: [begin, end] });
  }
  return { tensors, metadata, dataStart };
}

/** Reads only a file's header. */
export async function readHeader(file: string): Promise<SafetensorsHeader> {
  const fh = await open(file, 'r');
  try {
    const { size } = await fh.stat();
    const len = Buffer.alloc(8);
    await fh.read(len, 0, 8, 0);
    const n = Number(len.readBigUInt64LE(0));
    if (size < 8 || n > MAX_HEADER || 8 + n > size) throw new SafetensorsError(`${file}: not a safetensors file`);
    const json = Buffer.alloc(n);
    await fh.read(json, 0, n, 8);
    return parseHeader(json.toString('utf8'), 8 + n, size - 8 - n);
  } finally {
    await fh.close();
  }
}

/** The header of a whole file's bytes. */
export function headerOf(file: Uint8Array): SafetensorsHeader {
  if (file.length < 8) throw new SafetensorsError('not a safetensors file');
  const n = Number(new DataView(file.buffer, file.byteOffset, 8).getBigUint64(0, true));
  if (n > MAX_HEADER || 8 + n > file.length) throw new SafetensorsError('not a safetensors file');
  return parseHeader(Buffer.from(file.buffer, file.byteOffset + 8, n).toString('utf8'), 8 + n, file.length - 8 - n);
}

/** Named tensors' values as float32 (F16 and BF16 widened), from the whole file's bytes. */
export function tensorValues(file: Uint8Array, header: SafetensorsHeader, names: readonly string[]): Map<string, Float32Array> {
  const out = new Map<string, Float32Array>();
  for (const name of names) {
    const e = header.tensors.get(name);
    if (!e) throw new SafetensorsError(`tensor ${name} not in the file`);
    const [begin, end] = e.offsets;
    out.set(name, toFloats(file.subarray(header.dataStart + begin, header.dataStart + end), e.dtype));
  }
  return out;
}

function toFloats(bytes: Uint8Array, dtype: SafetensorsDtype): Float32Array {
  // A fresh buffer: the file's bytes need not be aligned for a typed view.
  const aligned = new Uint8Array(bytes).buffer;
  if (dtype === 'F32') return new Float32Array(aligned);
  const words = new Uint16Array(aligned);
  if (dtype === 'F16') return halfsToFloats(words);
  // bfloat16 is float32's upper half.
  const u32 = new Uint32Array(words.length);
  for (let i = 0; i < words.length; i++) u32[i] = words[i]! << 16;
  return new Float32Array(u32.buffer);
}

/** A safetensors file of float32 tensors (the adapter build script and tests write adapters with it). */
export function writeSafetensors(tensors: ReadonlyMap<string, { shape: readonly number[]; values: Float32Array }>, metadata: Record<string, string> = {}): Uint8Array {
  const header: Record<string, unknown> = { __metadata__: metadata };
  let at = 0;
  for (const [name, t] of tensors) {
    header[name] = { dtype: 'F32', shape: t.shape, data_offsets: [at, at + t.values.byteLength] };
    at += t.values.byteLength;
  }
  // The format pads the header with spaces to a multiple of 8, so that the data is aligned.
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (Buffer.byteLength(json) % 8)) % 8);
  const head = Buffer.from(json, 'utf8');
  const out = new Uint8Array(8 + head.length + at);
  new DataView(out.buffer).setBigUint64(0, BigInt(head.length), true);
  out.set(head, 8);
  let o = 8 + head.length;
  for (const t of tensors.values()) {
    out.set(new Uint8Array(t.values.buffer, t.values.byteOffset, t.values.byteLength), o);
    o += t.values.byteLength;
  }
  return out;
}
