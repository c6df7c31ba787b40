/** A decoder's transformers config.json and generation_config.json, as the ONNX decoder (decoder-model.ts) reads them. */
import type { DecoderShape, KvDtype } from '../../generate/decoder-shape.js';

export interface DecoderConfig {
  model_type?: string;
  vocab_size: number;
  hidden_size: number;
  intermediate_size?: number;
  num_hidden_layers: number;
  num_attention_heads: number;
  num_key_value_heads?: number;
  head_dim?: number;
  max_position_embeddings?: number;
  bos_token_id?: number | null;
  eos_token_id?: number | number[] | null;
  pad_token_id?: number | null;
}

/** A decoder's layer dimensions from its transformers config (transformers' defaults where a field is absent). */
export function configDims(cfg: Pick<DecoderConfig, 'hidden_size' | 'intermediate_size' | 'num_hidden_layers' | 'num_attention_heads' | 'num_key_value_heads' | 'head_dim'>):
  Pick<DecoderShape, 'numLayers' | 'hiddenSize' | 'numHeads' | 'numKvHeads' | 'headDim' | 'intermediateSize'> {
  const heads = cfg.num_attention_heads;
  return {
    numLayers: cfg.num_hidden_layers,
    hiddenSize: cfg.hidden_size,
    numHeads: heads,
    intermediateSize: cfg.intermediate_size ?? 4 * cfg.hidden_size,
    numKvHeads: cfg.num_key_value_heads ?? heads,
    headDim: cfg.head_dim ?? cfg.hidden_size / heads,
  };
}

export interface GenerationConfig {
  eos_token_id?: number | number[];
  bos_token_id?: number;
}

/** The decoder's shape: its config's facts, and the KV type its graph takes. */
export function decoderShape(cfg: DecoderConfig, kvDtype: KvDtype): DecoderShape {
  return {
    ...configDims(cfg),
    vocabSize: cfg.vocab_size,
    maxPositions: cfg.max_position_embeddings ?? 2048,
    kvDtype,
  };
}
