/**
 * RAGGUARD_CUDA_WEIGHTS=fp8: a float16/bfloat16 checkpoint's matrices (embedding, head, q|k|v, o, gate|up,
 * down) kept as FP8 E4M3 on the device, a float16 scale for each block of 32 weights of a row (the block's
 * largest |value| / 448, rounded up: nothing saturates), made by the native side as each tensor is loaded
 * (ragguard_cuda.cu load_fp8), so the host never holds a converted copy. The products are the quantized
 * ones of GGUF decoders (quant_kernels.cuh: a GEMV for decode-sized steps, tiles dequantized for cuBLAS
 * above), so FP8 halves the bytes a decode step reads against bfloat16. Norms and biases stay dense.
 *
 * `rowScales` (the runner option fp8Gemm 'cublaslt'): one scale a row instead (every unit of a row holds it),
 * and the row's scale also as float after the segment's planes, where cuBLASLt's FP8 GEMM reads it as its
 * outer-vector scale; those bytes are part of the segment (quant.bytes counts them).
 */
import { FP8_E4M3, planeOffsets } from './gguf-blocks.js';
import { quantTileBytes } from './gguf-checkpoint.js';
import { CheckpointError, WeightKind, type Checkpoint, type QuantSegment, type WeightKindId } from './hf-checkpoint.js';

const align256 = (n: number) => Math.ceil(n / 256) * 256;

/** The checkpoint with its matrices planned as FP8 segments (one per fused weight, filled at load). */
export function withFp8(ck: Checkpoint, opts: { rowScales?: boolean } = {}): Checkpoint {
  if (ck.quant) throw new CheckpointError(`${ck.dir}: RAGGUARD_CUDA_WEIGHTS=fp8 converts float16/bfloat16 checkpoints; a GGUF file keeps its own block types`);
  const c = ck.config;
  const H = c.hiddenSize, q = c.numHeads * c.headDim, kv = c.numKvHeads * c.headDim, I = c.intermediateSize;
  if (H % 32 || q % 32 || I % 32) throw new CheckpointError(`${ck.dir}: FP8 weights need hidden, q and intermediate widths that are multiples of 32`);
  const segments: QuantSegment[] = [];
  let offset = 0;
  const add = (kind: WeightKindId, layer: number, rows: number, cols: number, name: string) => {
    const packedBytes = planeOffsets(FP8_E4M3, rows, cols).bytes + (opts.rowScales ? align256(rows * 4) : 0);
    segments.push({ name, kind, layer, row0: 0, rows, cols, ggmlType: FP8_E4M3, deviceType: FP8_E4M3, file: '', fileOffset: 0, fileBytes: 0, offset, packedBytes });
    offset += align256(packedBytes);
  };
  add(WeightKind.embed, -1, c.vocabSize, H, 'model.embed_tokens.weight');
  if (!c.tieEmbeddings) add(WeightKind.lmHead, -1, c.vocabSize, H, 'lm_head.weight');
  for (let l = 0; l < c.numLayers; l++) {
    add(WeightKind.qkv, l, q + 2 * kv, H, `model.layers.${l}.self_attn.qkv`);
    add(WeightKind.o, l, H, q, `model.layers.${l}.self_attn.o_proj.weight`);
    add(WeightKind.gateUp, l, 2 * I, H, `model.layers.${l}.mlp.gate_up`);
    add(WeightKind.down, l, H, I, `model.layers.${l}.mlp.down_proj.weight`);
  }
  return { ...ck, quant: { mode: 'fp8', segments, bytes: offset, tileBytes: quantTileBytes(Math.max(H, q, I)) } };
}
