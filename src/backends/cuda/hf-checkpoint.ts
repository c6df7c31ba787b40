/**
 * A Hugging Face checkpoint as the CUDA backend loads it: config.json (Llama or Qwen2 architecture)
 * and model.safetensors, or shards listed in model.safetensors.index.json. Every tensor is mapped to
 * where the backend keeps it (q|k|v fused into one projection, gate|up into another) with its file,
 * byte offset and dtype, so that the native side reads it straight from the file once. Anything the
 * backend cannot run as the checkpoint means it (another architecture, attention or MLP biases it has
 * no place for, sliding windows, an unknown rope scaling, a missing or misshapen tensor) is refused by
 * name: never loaded into a different model.
 */
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import type { DecoderShape } from '../../generate/decoder-shape.js';
import { readHeader, type SafetensorsDtype } from '../../runtime/safetensors.js';
import type { DeviceQuantType } from './gguf-blocks.js';
import { ropeInvFreq, ropeType, type RopeScaling } from './rope.js';

/** The weight kinds of the native ABI (ragguard_cuda.cu, enum W_*). */
export const WeightKind = {
  embed: 0, lmHead: 1, finalNorm: 2, inputNorm: 3, qkv: 4, qkvBias: 5, o: 6, postNorm: 7, gateUp: 8, down: 9,
} as const;
export type WeightKindId = (typeof WeightKind)[keyof typeof WeightKind];

export type ModelDtype = 'float16' | 'bfloat16';

/** The decoder's dimensions (as the ONNX decoder's shape names them), and what the CUDA kernels need besides. */
export interface CudaModelConfig extends Omit<DecoderShape, 'kvDtype'> {
  architecture: 'llama' | 'qwen2';
  rmsEps: number;
  tieEmbeddings: boolean;
  qkvBias: boolean;
  ropeTheta: number;
  ropeScaling: RopeScaling | null;
  /** The checkpoint's own dtype (torch_dtype / dtype), when it says. */
  checkpointDtype: string | undefined;
  bosId: number | undefined;
  eosIds: number[];
}

/** One tensor's bytes and where they go. */
export interface TensorLoad {
  name: string;
  kind: WeightKindId;
  /** -1 for the model-wide weights. */
  layer: number;
  /** Element offset inside the fused weight. */
  dstOffset: number;
  file: string;
  /** Absolute byte offset in the file. */
  fileOffset: number;
  count: number;
  dtype: SafetensorsDtype;
}

export class CheckpointError extends Error {}

interface RawConfig {
  model_type?: string;
  architectures?: string[];
  vocab_size?: number;
  hidden_size?: number;
  intermediate_size?: number;
  num_hidden_layers?: number;
  num_attention_heads?: number;
  num_key_value_heads?: number;
  head_dim?: number;
  max_position_embeddings?: number;
  rms_norm_eps?: number;
  tie_word_embeddings?: boolean;
  rope_theta?: number;
  rope_scaling?: RopeScaling | null;
  rope_parameters?: RopeScaling | null;
  hidden_act?: string;
  attention_bias?: boolean;
  mlp_bias?: boolean;
  use_sliding_window?: boolean;
  torch_dtype?: string;
  dtype?: string;
  bos_token_id?: number | null;
  eos_token_id?: number | number[] | null;
  quantization_config?: { quant_method?: string; format?: string } | null;
}

function positiveInt(v: unknown, field: string): number {
  if (!Number.isInteger(v) || (v as number) <= 0) throw new CheckpointError(`config.json: ${field} must be a positive integer`);
  return v as number;
}

/** The checkpoint's config, validated for what the CUDA backend runs. */
export function parseConfig(raw: RawConfig): CudaModelConfig {
  const type = raw.model_type;
  if (type !== 'llama' && type !== 'qwen2') {
    throw new CheckpointError(`model_type '${String(type)}' is not supported by the CUDA backend (llama and qwen2 are)`);
  }
  if (raw.quantization_config) {
    const q = raw.quantization_config;
    throw new CheckpointError(`quantization_config (${q.quant_method ?? 'unknown method'}${q.format ? `, ${q.format}` : ''}): quantized checkpoints are not read by the CUDA backend; ` +
      'serve the float16/bfloat16 checkpoint (RAGGUARD_CUDA_WEIGHTS=fp8 makes FP8 weights from it at load) or a GGUF file');
  }
  if ((raw.hidden_act ?? 'silu') !== 'silu') throw new CheckpointError(`hidden_act '${raw.hidden_act}' (the CUDA backend runs silu)`);
  if (raw.mlp_bias) throw new CheckpointError('mlp_bias: MLP biases are not supported by the CUDA backend');
  if (type === 'llama' && raw.attention_bias) throw new CheckpointError('attention_bias: Llama attention biases (o_proj too) are not supported by the CUDA backend');
  if (type === 'qwen2' && raw.use_sliding_window) throw new CheckpointError('use_sliding_window: sliding-window attention is not supported by the CUDA backend');
  const hiddenSize = positiveInt(raw.hidden_size, 'hidden_size');
  const numHeads = positiveInt(raw.num_attention_heads, 'num_attention_heads');
  const numKvHeads = positiveInt(raw.num_key_value_heads ?? numHeads, 'num_key_value_heads');
  if (numHeads % numKvHeads !== 0) throw new CheckpointError('num_attention_heads must be a multiple of num_key_value_heads');
  if (numHeads / numKvHeads > 16) throw new CheckpointError('more than 16 query heads per kv head (the attention kernel holds at most 16)');
  const headDim = positiveInt(raw.head_dim ?? hiddenSize / numHeads, 'head_dim');
  if (headDim % 2 !== 0 || headDim > 256) throw new CheckpointError(`head_dim ${headDim}: even and at most 256`);
  // transformers 5 moved rope_theta and the scaling into rope_parameters.
  const params = raw.rope_parameters ?? undefined;
  const scaling = raw.rope_scaling ?? (params && ropeType(params) !== 'default' ? params : null);
  const ropeTheta = raw.rope_theta ?? params?.rope_theta ?? 10000;
  ropeInvFreq(headDim, ropeTheta, scaling); // refuses a scaling it cannot express, here rather than at load
  const eos = raw.eos_token_id;
  return {
    architecture: type,
    numLayers: positiveInt(raw.num_hidden_layers, 'num_hidden_layers'),
    hiddenSize, numHeads, numKvHeads, headDim,
    intermediateSize: positiveInt(raw.intermediate_size, 'intermediate_size'),
    vocabSize: positiveInt(raw.vocab_size, 'vocab_size'),
    maxPositions: positiveInt(raw.max_position_embeddings ?? 4096, 'max_position_embeddings'),
    rmsEps: raw.rms_norm_eps ?? 1e-6,
    tieEmbeddings: raw.tie_word_embeddings ?? false,
    qkvBias: type === 'qwen2',
    ropeTheta,
    ropeScaling: scaling ?? null,
    checkpointDtype: raw.torch_dtype ?? raw.dtype,
    bosId: raw.bos_token_id ?? undefined,
    eosIds: eos === null || eos === undefined ? [] : Array.isArray(eos) ? eos : [eos],
  };
}

/** Elements of each weight kind (ragguard_cuda.cu weight_elems). */
export function weightElems(c: CudaModelConfig, kind: WeightKindId): number {
  const H = c.hiddenSize, q = c.numHeads * c.headDim, kv = c.numKvHeads * c.headDim;
  switch (kind) {
    case WeightKind.embed: case WeightKind.lmHead: return c.vocabSize * H;
    case WeightKind.finalNorm: case WeightKind.inputNorm: case WeightKind.postNorm: return H;
    case WeightKind.qkv: return (q + 2 * kv) * H;
    case WeightKind.qkvBias: return q + 2 * kv;
    case WeightKind.o: return H * q;
    case WeightKind.gateUp: return 2 * c.intermediateSize * H;
    case WeightKind.down: return H * c.intermediateSize;
  }
  return 0;
}

interface Placement {
  kind: WeightKindId;
  layer: number;
  dstOffset: number;
  shape: number[];
}

/** Where a checkpoint tensor goes, or null for tensors that carry nothing the backend needs (rotary caches). */
export function placeTensor(c: CudaModelConfig, name: string): Placement | null {
  const H = c.hiddenSize, q = c.numHeads * c.headDim, kv = c.numKvHeads * c.headDim, I = c.intermediateSize;
  if (name === 'model.embed_tokens.weight') return { kind: WeightKind.embed, layer: -1, dstOffset: 0, shape: [c.vocabSize, H] };
  if (name === 'lm_head.weight') return c.tieEmbeddings ? null : { kind: WeightKind.lmHead, layer: -1, dstOffset: 0, shape: [c.vocabSize, H] };
  if (name === 'model.norm.weight') return { kind: WeightKind.finalNorm, layer: -1, dstOffset: 0, shape: [H] };
  const m = /^model\.layers\.(\d+)\.(.+)$/.exec(name);
  if (!m) {
    if (name.endsWith('rotary_emb.inv_freq')) return null;
    throw new CheckpointError(`tensor '${name}' is not part of a ${c.architecture} decoder the CUDA backend runs`);
  }
  const layer = Number(m[1]);
  const part = m[2]!;
  if (layer >= c.numLayers) throw new CheckpointError(`tensor '${name}': layer ${layer} past num_hidden_layers ${c.numLayers}`);
  const at = (kind: WeightKindId, dstOffset: number, shape: number[]): Placement => ({ kind, layer, dstOffset, shape });
  switch (part) {
    case 'input_layernorm.weight': return at(WeightKind.inputNorm, 0, [H]);
    case 'post_attention_layernorm.weight': return at(WeightKind.postNorm, 0, [H]);
    case 'self_attn.q_proj.weight': return at(WeightKind.qkv, 0, [q, H]);
    case 'self_attn.k_proj.weight': return at(WeightKind.qkv, q * H, [kv, H]);
    case 'self_attn.v_proj.weight': return at(WeightKind.qkv, (q + kv) * H, [kv, H]);
    case 'self_attn.o_proj.weight': return at(WeightKind.o, 0, [H, q]);
    case 'mlp.gate_proj.weight': return at(WeightKind.gateUp, 0, [I, H]);
    case 'mlp.up_proj.weight': return at(WeightKind.gateUp, I * H, [I, H]);
    case 'mlp.down_proj.weight': return at(WeightKind.down, 0, [H, I]);
  }
  if (c.qkvBias) {
    switch (part) {
      case 'self_attn.q_proj.bias': return at(WeightKind.qkvBias, 0, [q]);
      case 'self_attn.k_proj.bias': return at(WeightKind.qkvBias, q, [kv]);
      case 'self_attn.v_proj.bias': return at(WeightKind.qkvBias, q + kv, [kv]);
    }
  }
  if (part.endsWith('rotary_emb.inv_freq')) return null;
  throw new CheckpointError(`tensor '${name}' has no place in the CUDA backend's ${c.architecture} decoder (it would change the computation)`);
}

/** The names every checkpoint of this config must hold. */
function requiredTensors(c: CudaModelConfig): string[] {
  const names = ['model.embed_tokens.weight', 'model.norm.weight'];
  if (!c.tieEmbeddings) names.push('lm_head.weight');
  const per = ['input_layernorm.weight', 'post_attention_layernorm.weight', 'self_attn.q_proj.weight', 'self_attn.k_proj.weight',
    'self_attn.v_proj.weight', 'self_attn.o_proj.weight', 'mlp.gate_proj.weight', 'mlp.up_proj.weight', 'mlp.down_proj.weight'];
  if (c.qkvBias) per.push('self_attn.q_proj.bias', 'self_attn.k_proj.bias', 'self_attn.v_proj.bias');
  for (let l = 0; l < c.numLayers; l++) for (const p of per) names.push(`model.layers.${l}.${p}`);
  return names;
}

/** One matrix (or a part of a fused one) of a GGUF decoder, kept quantized on the device (gguf-checkpoint.ts). */
export interface QuantSegment {
  name: string;
  kind: WeightKindId;
  /** -1 for the embedding and the head. */
  layer: number;
  /** Its first output row in the fused weight (k after q in q|k|v, up after gate in gate|up). */
  row0: number;
  rows: number;
  cols: number;
  ggmlType: number;
  deviceType: DeviceQuantType;
  file: string;
  fileOffset: number;
  fileBytes: number;
  /** llama's q and k: rows to put back in rotate-half order (gguf-blocks.ts llamaUnpermutation). */
  unpermuteHeadDim?: number;
  /** Byte offset in the device's quantized area (256-aligned) and packed size. */
  offset: number;
  packedBytes: number;
}

export interface QuantWeights {
  /** gguf: a GGUF file's blocks, packed on the host; fp8: E4M3 made on the device from the checkpoint's tensors. */
  mode: 'gguf' | 'fp8';
  segments: QuantSegment[];
  /** The quantized area's bytes (rg_config.quant_bytes). */
  bytes: number;
  /** The dequantization scratch of the larger products (rg_config.quant_tile_bytes). */
  tileBytes: number;
}

export interface Checkpoint {
  /** The checkpoint's directory, or the GGUF file. */
  dir: string;
  config: CudaModelConfig;
  /** Dense loads (every weight of a Hugging Face checkpoint; a GGUF decoder's norms and biases). */
  loads: TensorLoad[];
  /** Bytes of the tensors on disk. */
  fileBytes: number;
  invFreq: Float32Array;
  /** A GGUF decoder's quantized matrices. */
  quant?: QuantWeights;
}

/** Reads config.json and the safetensors headers (one file or shards) and plans every tensor's load. */
export async function openCheckpoint(dir: string): Promise<Checkpoint> {
  const configPath = path.join(dir, 'config.json');
  if (!existsSync(configPath)) throw new CheckpointError(`${dir}: no config.json (a Hugging Face checkpoint directory is expected)`);
  const config = parseConfig(JSON.parse(await readFile(configPath, 'utf8')) as RawConfig);
  let generation: { eos_token_id?: number | number[]; bos_token_id?: number } = {};
  if (existsSync(path.join(dir, 'generation_config.json'))) {
    generation = JSON.parse(await readFile(path.join(dir, 'generation_config.json'), 'utf8')) as typeof generation;
  }
  if (generation.eos_token_id !== undefined) {
    config.eosIds = Array.isArray(generation.eos_token_id) ? generation.eos_token_id : [generation.eos_token_id];
  }
  let files: string[];
  const index = path.join(dir, 'model.safetensors.index.json');
  if (existsSync(index)) {
    const map = (JSON.parse(await readFile(index, 'utf8')) as { weight_map?: Record<string, string> }).weight_map;
    if (!map) throw new CheckpointError(`${index}: no weight_map`);
    files = [...new Set(Object.values(map))].map((f) => path.join(dir, f));
  } else if (existsSync(path.join(dir, 'model.safetensors'))) {
    files = [path.join(dir, 'model.safetensors')];
  } else {
    throw new CheckpointError(`${dir}: neither model.safetensors nor model.safetensors.index.json`);
  }
  const loads: TensorLoad[] = [];
  const seen = new Set<string>();
  let fileBytes = 0;
  for (const file of files) {
    const header = await readHeader(file);
    for (const [name, e] of header.tensors) {
      const place = placeTensor(config, name);
      if (!place) continue;
      if (e.shape.join(',') !== place.shape.join(',')) {
        throw new CheckpointError(`tensor '${name}': shape [${e.shape.join(', ')}], expected [${place.shape.join(', ')}] from config.json`);
      }
      if (seen.has(name)) throw new CheckpointError(`tensor '${name}' appears twice among the shards`);
      seen.add(name);
      const count = place.shape.reduce((a, b) => a * b, 1);
      loads.push({ name, kind: place.kind, layer: place.layer, dstOffset: place.dstOffset, file, fileOffset: header.dataStart + e.offsets[0], count, dtype: e.dtype });
      fileBytes += e.offsets[1] - e.offsets[0];
    }
  }
  const missing = requiredTensors(config).filter((n) => !seen.has(n));
  if (missing.length > 0) throw new CheckpointError(`checkpoint lacks ${missing.length} tensors, e.g. '${missing[0]}'`);
  return { dir, config, loads, fileBytes, invFreq: ropeInvFreq(config.headDim, config.ropeTheta, config.ropeScaling) };
}
