/**
 * The CUDA encoder's device plan (encoder.cu): a BERT-family model's weights in one device allocation
 * (matrices and embedding tables in float16, biases, LayerNorm parameters and the pair head's scale in
 * float32) and the activations of the largest run the limits allow (rows x padded width tokens), both
 * allocated once at load. So an encoder run allocates nothing: the accountant's figures are these, and
 * rg_enc_plan must return the same numbers (the runner checks before it allocates), as step-pack.ts's
 * planDevice does for the decoder.
 */

/** What the model's last stage computes: a pooled sentence embedding, or the reranker's logits. */
export type EncoderHead = 'embedding' | 'classifier' | 'pair';

/** Pooling of an embedding head (1_Pooling/config.json's modes; the embedder detects which). */
export type EncoderPooling = 'mean' | 'cls' | 'max' | 'mean_sqrt_len' | 'lasttoken';

export const POOLINGS: readonly EncoderPooling[] = ['mean', 'cls', 'max', 'mean_sqrt_len', 'lasttoken'];
export const HEADS: readonly EncoderHead[] = ['embedding', 'classifier', 'pair'];

/** The model's dimensions and what its head computes. */
export interface EncoderShape {
  numLayers: number;
  hidden: number;
  numHeads: number;
  intermediate: number;
  vocab: number;
  maxPositions: number;
  typeVocab: number;
  /** The classifier's rows (1 for a one-logit reranker); 0 for an embedding head. */
  numLabels: number;
  head: EncoderHead;
  /** An embedding head's pooling (ignored by the others). */
  pooling: EncoderPooling;
  /** An embedding head's L2 normalization. */
  normalize: boolean;
  /** BERT's GELU (erf) or the tanh approximation (hidden_act gelu_new / gelu_pytorch_tanh). */
  act: 'gelu' | 'gelu_tanh';
  lnEps: number;
}

/** What one run may hold: sequences, and sequences x their padded width. */
export interface EncoderLimits {
  maxRows: number;
  maxTokens: number;
  cublasWorkspaceBytes: number;
}

export interface EncoderPlan {
  weights: number;
  activations: number;
  cublasWorkspace: number;
  /** Pinned host staging: the run's inputs and outputs. */
  hostPinned: number;
  /** Device bytes: weights + activations + cuBLAS workspace. */
  total: number;
}

/** rg_enc_upload's tensor kinds (encoder.cu's enum, same order). */
export enum EncoderTensor {
  Word, Position, TokenType, EmbNormWeight, EmbNormBias,
  QueryWeight, KeyWeight, ValueWeight, QueryBias, KeyBias, ValueBias,
  AttnOutWeight, AttnOutBias, AttnNormWeight, AttnNormBias,
  InterWeight, InterBias, OutWeight, OutBias, OutNormWeight, OutNormBias,
  PoolerWeight, PoolerBias, ClassifierWeight, ClassifierBias, Scale,
}

/** Head dimensions the attention kernel is built for (tensor-core tiles of 16). */
export const ENCODER_HEAD_DIMS: readonly number[] = [32, 64, 128];
/** LayerNorm runs a warp per row with 32 values a lane at most. */
export const ENCODER_MAX_HIDDEN = 1024;

const align = (n: number) => Math.ceil(n / 256) * 256;

/** Why the CUDA encoder cannot run this shape, or undefined (encoder.cu's checks, same words). */
export function encoderShapeProblem(s: EncoderShape): string | undefined {
  if (s.numLayers < 1 || s.hidden < 1 || s.numHeads < 1 || s.intermediate < 1 || s.vocab < 1 || s.maxPositions < 1 || s.typeVocab < 1) return 'a dimension is not positive';
  if (s.hidden % s.numHeads !== 0) return `hidden_size ${s.hidden} is not a multiple of num_attention_heads ${s.numHeads}`;
  const d = s.hidden / s.numHeads;
  if (!ENCODER_HEAD_DIMS.includes(d)) return `head dimension ${d} (the kernel takes ${ENCODER_HEAD_DIMS.join(', ')})`;
  if (s.hidden > ENCODER_MAX_HIDDEN) return `hidden_size ${s.hidden} above ${ENCODER_MAX_HIDDEN}`;
  if (s.intermediate % 2 !== 0) return `intermediate_size ${s.intermediate} is odd`;
  if (s.head !== 'embedding' && s.numLabels < 1) return 'a classifier head without labels';
  if (s.head === 'pair' && s.numLabels !== 1) return `a pair head scores one logit, not ${s.numLabels}`;
  return undefined;
}

/** Float16 tensors (2 bytes) and float32 ones (4), each placed at a 256-byte boundary. */
function weightRegions(s: EncoderShape): number[] {
  const { hidden: H, intermediate: I } = s;
  const h = (n: number) => align(2 * n);
  const f = (n: number) => align(4 * n);
  const global = h(s.vocab * H) + h(s.maxPositions * H) + h(s.typeVocab * H) + f(H) + f(H);
  const layer = h(3 * H * H) + f(3 * H) + h(H * H) + f(H) + f(H) + f(H) + h(I * H) + f(I) + h(H * I) + f(H) + f(H) + f(H);
  const head = s.head === 'embedding' ? 0 : h(H * H) + f(H) + h(s.numLabels * H) + f(s.numLabels) + (s.head === 'pair' ? f(1) : 0);
  return [global, s.numLayers * layer, head];
}

/** Floats a run writes per sequence: the embedding, or the logits. */
export function outWidth(s: EncoderShape): number {
  return s.head === 'embedding' ? s.hidden : s.numLabels;
}

export function planEncoder(s: EncoderShape, l: EncoderLimits): EncoderPlan {
  const weights = weightRegions(s).reduce((a, b) => a + b, 0);
  const M = l.maxTokens, R = l.maxRows, H = s.hidden;
  const inputs = align(4 * (2 * M + R));
  const out = align(4 * R * outWidth(s));
  const activations = inputs + align(2 * M * H) + align(2 * M * 3 * H) + align(2 * M * H) + align(2 * M * H) + align(2 * M * s.intermediate) + out;
  return { weights, activations, cublasWorkspace: l.cublasWorkspaceBytes, hostPinned: inputs + out, total: weights + activations + l.cublasWorkspaceBytes };
}
