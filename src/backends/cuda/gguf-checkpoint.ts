/**
 * A GGUF file (llama.cpp's and Ollama's format) as the CUDA backend loads it: the decoder's shape from the
 * metadata (architectures llama and qwen2, read as the CPU path reads them), the norms and biases as dense
 * loads (float32 in the file, converted on the device as a checkpoint's are), and every matrix (embedding,
 * head, q/k/v, o, gate/up, down) as a quantized segment kept in its own type on the device (gguf-blocks.ts
 * lays the blocks out; ragguard_cuda.cu's products dequantize them). q, k and v are three segments of the
 * fused q|k|v, gate and up two of gate|up: a Q4_K_M file mixes types inside a layer.
 *
 * llama.cpp's converter permutes a llama model's q and k rows to adjacent rotary pairs; they are put back
 * (whole rows) where they are packed, since the kernels rotate (i, i + d/2) as transformers does. Anything
 * the backend cannot run as the file means it (another architecture, partial rotary, soft-capping, sliding
 * windows, a rope scaling other than linear, tensors it has no place for) is refused by name.
 */
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { closeSync, openSync, readSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { GGML, GgufFile, ggmlTypeName, rowBytes, type GgufTensorInfo } from '../../runtime/gguf.js';
import { ggufTokenizer } from '../../runtime/gguf-tokenizer.js';
import { TextTokenizer } from '../../runtime/tokenizer.js';
import { checkShape, deviceType, llamaUnpermutation, packMatrix, permuteRowBytes, planeOffsets, type DeviceQuantType } from './gguf-blocks.js';
import { CheckpointError, parseConfig, WeightKind, type Checkpoint, type QuantSegment, type TensorLoad, type WeightKindId } from './hf-checkpoint.js';
import { ropeInvFreq, type RopeScaling } from './rope.js';

export const GGUF_CUDA_ARCHITECTURES = ['llama', 'qwen2'] as const;

/**
 * The scratch a prefill's product dequantizes a tile of rows into: small enough to stay in the H200's L2
 * (50 MB) between the dequantization's write and cuBLAS's read, and at least 64 rows of the widest input.
 */
export const QUANT_TILE_BYTES = 16 * 2 ** 20;

export function quantTileBytes(widest: number): number {
  return Math.max(QUANT_TILE_BYTES, Math.ceil((64 * widest * 2) / 256) * 256);
}

const align256 = (n: number) => Math.ceil(n / 256) * 256;

/** The GGUF's decoder config as config.json would say it (then validated by hf-checkpoint.ts parseConfig). */
function rawConfig(f: GgufFile): { raw: Parameters<typeof parseConfig>[0]; arch: (typeof GGUF_CUDA_ARCHITECTURES)[number]; freqFactors?: Float32Array } {
  const arch = f.str('general.architecture');
  if (!GGUF_CUDA_ARCHITECTURES.includes(arch as (typeof GGUF_CUDA_ARCHITECTURES)[number])) {
    throw new CheckpointError(`${f.path}: architecture '${arch}' is not supported by the CUDA backend (${GGUF_CUDA_ARCHITECTURES.join(', ')} are)`);
  }
  const a = arch as (typeof GGUF_CUDA_ARCHITECTURES)[number];
  const k = (key: string) => `${a}.${key}`;
  const hidden = f.num(k('embedding_length'));
  const heads = f.num(k('attention.head_count'));
  const headDim = f.num(k('attention.key_length'), hidden / heads);
  if (f.num(k('attention.value_length'), headDim) !== headDim) throw new CheckpointError(`${f.path}: ${k('attention.value_length')} differs from the key length`);
  const ropeDim = f.num(k('rope.dimension_count'), headDim);
  if (ropeDim !== headDim) throw new CheckpointError(`${f.path}: ${k('rope.dimension_count')} ${ropeDim} rotates part of a head of ${headDim}: partial rotary is not supported`);
  for (const key of [k('attn_logit_softcapping'), k('final_logit_softcapping'), k('attention.sliding_window')]) {
    if (f.get(key) !== undefined) throw new CheckpointError(`${f.path}: ${key} is not supported by the CUDA backend`);
  }
  const scalingType = f.str(k('rope.scaling.type')) ?? 'none';
  let scaling: RopeScaling | null = null;
  if (scalingType === 'linear') scaling = { rope_type: 'linear', factor: f.num(k('rope.scaling.factor')) };
  else if (scalingType !== 'none') throw new CheckpointError(`${f.path}: ${k('rope.scaling.type')} '${scalingType}' is not supported (none and linear are)`);
  const freqs = f.tensor('rope_freqs.weight');
  const embd = f.tensor('token_embd.weight');
  if (!embd) throw new CheckpointError(`${f.path}: no token_embd.weight`);
  return {
    arch: a,
    raw: {
      model_type: a,
      vocab_size: f.num(k('vocab_size'), embd.dims[1]),
      hidden_size: hidden,
      intermediate_size: f.num(k('feed_forward_length')),
      num_hidden_layers: f.num(k('block_count')),
      num_attention_heads: heads,
      num_key_value_heads: f.num(k('attention.head_count_kv'), heads),
      head_dim: headDim,
      rms_norm_eps: f.num(k('attention.layer_norm_rms_epsilon')),
      rope_theta: f.num(k('rope.freq_base'), 10000),
      rope_scaling: scaling,
      max_position_embeddings: f.num(k('context_length')),
      tie_word_embeddings: f.tensor('output.weight') === undefined,
    },
    ...(freqs ? { freqFactors: f.floats(freqs) } : {}),
  };
}

const LAYER_PARTS: Record<string, { kind: WeightKindId; dense?: true }> = {
  'attn_norm.weight': { kind: WeightKind.inputNorm, dense: true },
  'ffn_norm.weight': { kind: WeightKind.postNorm, dense: true },
  'attn_q.weight': { kind: WeightKind.qkv }, 'attn_k.weight': { kind: WeightKind.qkv }, 'attn_v.weight': { kind: WeightKind.qkv },
  'attn_q.bias': { kind: WeightKind.qkvBias, dense: true }, 'attn_k.bias': { kind: WeightKind.qkvBias, dense: true }, 'attn_v.bias': { kind: WeightKind.qkvBias, dense: true },
  'attn_output.weight': { kind: WeightKind.o },
  'ffn_gate.weight': { kind: WeightKind.gateUp }, 'ffn_up.weight': { kind: WeightKind.gateUp },
  'ffn_down.weight': { kind: WeightKind.down },
};

const DENSE_DTYPE: Record<number, TensorLoad['dtype']> = { [GGML.F32]: 'F32', [GGML.F16]: 'F16', [GGML.BF16]: 'BF16' };

/**
 * Reads a GGUF file's metadata and tensor infos and plans every tensor's load: dense loads for norms and
 * biases, quantized segments (with their place in the device's quantized area) for the matrices.
 */
export function planGguf(f: GgufFile): Checkpoint {
  const { raw, arch, freqFactors } = rawConfig(f);
  const config = parseConfig(raw);
  const tokenId = (key: string) => (f.get(key) === undefined ? undefined : f.num(key));
  config.bosId = tokenId('tokenizer.ggml.bos_token_id');
  config.eosIds = [...new Set([tokenId('tokenizer.ggml.eos_token_id'), tokenId('tokenizer.ggml.eot_token_id')].filter((x): x is number => x !== undefined))];
  const H = config.hiddenSize, D = config.headDim, q = config.numHeads * D, kv = config.numKvHeads * D, I = config.intermediateSize;
  const loads: TensorLoad[] = [];
  const segments: QuantSegment[] = [];
  let offset = 0;
  let fileBytes = 0;
  const expectDims = (t: GgufTensorInfo, dims: number[]) => {
    if (t.dims.join(',') !== dims.join(',')) throw new CheckpointError(`${f.path}: tensor ${t.name} has dims [${t.dims.join(', ')}], expected [${dims.join(', ')}] from the metadata`);
  };
  const dense = (t: GgufTensorInfo, kind: WeightKindId, layer: number, dstOffset: number, n: number) => {
    expectDims(t, [n]);
    const dtype = DENSE_DTYPE[t.type];
    if (!dtype) throw new CheckpointError(`${f.path}: tensor ${t.name} is ${ggmlTypeName(t.type)}; a norm or bias must be F32, F16 or BF16`);
    loads.push({ name: t.name, kind, layer, dstOffset, file: f.path, fileOffset: t.offset, count: n, dtype });
  };
  const matrix = (t: GgufTensorInfo, kind: WeightKindId, layer: number, row0: number, rows: number, cols: number, unpermute = false) => {
    expectDims(t, [cols, rows]);
    let type: DeviceQuantType;
    try {
      type = deviceType(t.type, t.name);
      checkShape(type, rows, cols, t.name);
    } catch (e) {
      throw new CheckpointError(`${f.path}: ${(e as Error).message}`);
    }
    const packed = planeOffsets(type, rows, cols).bytes;
    segments.push({
      name: t.name, kind, layer, row0, rows, cols, ggmlType: t.type, deviceType: type, file: f.path, fileOffset: t.offset,
      fileBytes: rowBytes(t.type, cols) * rows, ...(unpermute ? { unpermuteHeadDim: D } : {}), offset, packedBytes: packed,
    });
    offset += align256(packed);
  };
  const seen = new Set<string>();
  for (const t of f.tensors.values()) {
    seen.add(t.name);
    fileBytes += t.bytes;
    if (t.name === 'token_embd.weight') { matrix(t, WeightKind.embed, -1, 0, config.vocabSize, H); continue; }
    if (t.name === 'output.weight') { matrix(t, WeightKind.lmHead, -1, 0, config.vocabSize, H); continue; }
    if (t.name === 'output_norm.weight') { dense(t, WeightKind.finalNorm, -1, 0, H); continue; }
    if (t.name === 'rope_freqs.weight') continue; // folded into the rotary table below
    const m = /^blk\.(\d+)\.(.+)$/.exec(t.name);
    const part = m && LAYER_PARTS[m[2]!];
    if (!m || !part) throw new CheckpointError(`${f.path}: tensor ${t.name} has no place in the CUDA backend's ${arch} decoder (it would change the computation)`);
    const layer = Number(m[1]);
    if (layer >= config.numLayers) throw new CheckpointError(`${f.path}: tensor ${t.name} past block_count ${config.numLayers}`);
    const name = m[2]!;
    if (part.kind === WeightKind.qkvBias && !config.qkvBias) throw new CheckpointError(`${f.path}: tensor ${t.name}: ${arch} attention biases are not supported by the CUDA backend`);
    switch (name) {
      case 'attn_norm.weight': case 'ffn_norm.weight': dense(t, part.kind, layer, 0, H); break;
      case 'attn_q.bias': dense(t, part.kind, layer, 0, q); break;
      case 'attn_k.bias': dense(t, part.kind, layer, q, kv); break;
      case 'attn_v.bias': dense(t, part.kind, layer, q + kv, kv); break;
      case 'attn_q.weight': matrix(t, part.kind, layer, 0, q, H, arch === 'llama'); break;
      case 'attn_k.weight': matrix(t, part.kind, layer, q, kv, H, arch === 'llama'); break;
      case 'attn_v.weight': matrix(t, part.kind, layer, q + kv, kv, H); break;
      case 'attn_output.weight': matrix(t, part.kind, layer, 0, H, q); break;
      case 'ffn_gate.weight': matrix(t, part.kind, layer, 0, I, H); break;
      case 'ffn_up.weight': matrix(t, part.kind, layer, I, I, H); break;
      case 'ffn_down.weight': matrix(t, part.kind, layer, 0, H, I); break;
    }
  }
  const per = ['attn_norm.weight', 'ffn_norm.weight', 'attn_q.weight', 'attn_k.weight', 'attn_v.weight', 'attn_output.weight', 'ffn_gate.weight', 'ffn_up.weight', 'ffn_down.weight'];
  if (config.qkvBias) per.push('attn_q.bias', 'attn_k.bias', 'attn_v.bias');
  const required = ['token_embd.weight', 'output_norm.weight'];
  for (let l = 0; l < config.numLayers; l++) for (const p of per) required.push(`blk.${l}.${p}`);
  const missing = required.filter((n) => !seen.has(n));
  if (missing.length > 0) throw new CheckpointError(`${f.path}: lacks ${missing.length} tensors, e.g. ${missing[0]}`);
  let invFreq = ropeInvFreq(D, config.ropeTheta, config.ropeScaling);
  if (freqFactors) {
    if (freqFactors.length !== D / 2) throw new CheckpointError(`${f.path}: rope_freqs.weight has ${freqFactors.length} factors for ${D / 2} frequencies`);
    // llama.cpp divides each frequency by its factor (Llama 3's long-context scaling, stored as a tensor).
    invFreq = invFreq.map((x, i) => x / freqFactors[i]!);
  }
  return {
    dir: f.path, config, loads, fileBytes, invFreq,
    quant: { mode: 'gguf', segments, bytes: offset, tileBytes: quantTileBytes(Math.max(H, q, I)) },
  };
}

/** A segment's bytes from its file, its rows put back where llama.cpp permuted them, packed for the device. */
export function packSegment(s: QuantSegment): { type: DeviceQuantType; bytes: Uint8Array } {
  const fd = openSync(s.file, 'r');
  let raw: Uint8Array = new Uint8Array(s.fileBytes);
  try {
    for (let at = 0; at < s.fileBytes;) {
      const n = readSync(fd, raw, at, s.fileBytes - at, s.fileOffset + at);
      if (n <= 0) throw new CheckpointError(`${s.file}: tensor ${s.name} runs past the end of the file`);
      at += n;
    }
  } finally {
    closeSync(fd);
  }
  if (s.unpermuteHeadDim) raw = permuteRowBytes(raw, rowBytes(s.ggmlType, s.cols), llamaUnpermutation(s.rows, s.unpermuteHeadDim));
  const packed = packMatrix(s.ggmlType, raw, s.rows, s.cols, s.name);
  if (packed.bytes.length !== s.packedBytes) throw new Error(`${s.name}: packed ${packed.bytes.length} bytes, planned ${s.packedBytes}`);
  return packed;
}

/** The file's tokenizer and chat template (runtime/gguf-tokenizer.ts, as the CPU path builds them). */
export async function ggufTextTokenizer(f: GgufFile, contextLength: number): Promise<TextTokenizer> {
  const tok = ggufTokenizer(f, contextLength);
  // TextTokenizer reads a directory: the two files are written to a temporary one and read back.
  const dir = await mkdtemp(path.join(tmpdir(), 'ragguard-gguf-tok-'));
  try {
    await writeFile(path.join(dir, 'tokenizer.json'), JSON.stringify(tok.tokenizer));
    await writeFile(path.join(dir, 'tokenizer_config.json'), JSON.stringify(tok.config));
    return await TextTokenizer.load(dir);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** Opens a GGUF decoder for the CUDA backend: its plan and its tokenizer; nothing is read of the weights yet. */
export async function openGguf(file: string): Promise<{ checkpoint: Checkpoint; tokenizer: TextTokenizer }> {
  let f: GgufFile;
  try {
    f = GgufFile.open(file);
  } catch (e) {
    throw new CheckpointError(`${file}: ${(e as Error).message}`);
  }
  try {
    const checkpoint = planGguf(f);
    return { checkpoint, tokenizer: await ggufTextTokenizer(f, checkpoint.config.maxPositions) };
  } finally {
    f.close();
  }
}
