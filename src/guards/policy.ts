/**
 * The admission decision for one request, from its predicted memory and what is free:
 *   admit    it fits what is free now;
 *   queue    it fits the whole capacity, just not now: wait for running requests to finish;
 *   reshape  as asked it can never fit: shrink it, in the configured order (smaller reranker batches,
 *            fewer reranked candidates, a shorter context, fewer new tokens), each step halving one
 *            dimension down to its floor, until it fits the capacity; then admit or queue the reshaped
 *            request;
 *   reject   even at every floor it cannot fit: 413, with the predicted and available bytes.
 * Pure: capacity and the model come in, a decision goes out; the caller says what was reshaped.
 */
import type { MemoryModel, Prediction, RequestShape } from './memory-model.js';

import type { ReshapeStep } from '../config/config.js';

export interface Capacity {
  /** Workspace bytes not reserved by admitted requests, and the total the budget gives workspace. */
  workspaceFree: number;
  workspaceTotal: number;
  kvFreeBlocks: number;
  kvTotalBlocks: number;
}

export interface Floors {
  minPromptTokens: number;
  minNewTokens: number;
}

export interface Reshape {
  field: 'rerank_batch' | 'top_k' | 'prompt_tokens' | 'max_new_tokens';
  from: number;
  to: number;
}

export type Decision =
  | { action: 'admit' | 'queue'; shape: RequestShape; prediction: Prediction; reshaped: Reshape[] }
  | { action: 'reject'; shape: RequestShape; prediction: Prediction; reason: string };

const FIELD: Record<ReshapeStep, Reshape['field']> = { batch: 'rerank_batch', rerank: 'top_k', context: 'prompt_tokens', new_tokens: 'max_new_tokens' };

function shrink(s: RequestShape, step: ReshapeStep, floors: Floors, defaultBatch: number): RequestShape | undefined {
  const half = (v: number, floor: number) => (v > floor ? Math.max(floor, Math.floor(v / 2)) : undefined);
  if (step === 'batch') {
    // Fewer pairs per reranker run: the same scores, only slower; no use below the pairs there are.
    const rerankBatch = half(Math.min(s.rerankBatch ?? defaultBatch, s.topK), 1);
    return rerankBatch === undefined ? undefined : { ...s, rerankBatch };
  }
  if (step === 'rerank') {
    const topK = half(s.topK, s.rerankTopN);
    return topK === undefined ? undefined : { ...s, topK };
  }
  if (step === 'context') {
    const promptTokens = half(s.promptTokens, floors.minPromptTokens);
    return promptTokens === undefined ? undefined : { ...s, promptTokens };
  }
  const maxNewTokens = half(s.maxNewTokens, floors.minNewTokens);
  return maxNewTokens === undefined ? undefined : { ...s, maxNewTokens };
}

function shapeValue(s: RequestShape, f: Reshape['field'], defaultBatch: number): number {
  if (f === 'rerank_batch') return s.rerankBatch ?? defaultBatch;
  return f === 'top_k' ? s.topK : f === 'prompt_tokens' ? s.promptTokens : s.maxNewTokens;
}

export function decide(model: MemoryModel, asked: RequestShape, cap: Capacity, order: readonly ReshapeStep[], floors: Floors): Decision {
  const fits = (p: Prediction, whole: boolean) =>
    p.reserveBytes <= (whole ? cap.workspaceTotal : cap.workspaceFree) && p.kvBlocks <= (whole ? cap.kvTotalBlocks : cap.kvFreeBlocks);
  let shape = asked;
  let prediction = model.predict(shape);
  if (!fits(prediction, true)) {
    for (const step of order) {
      let next: RequestShape | undefined;
      while (!fits(prediction, true) && (next = shrink(shape, step, floors, model.rerankBatch))) {
        shape = next;
        prediction = model.predict(shape);
      }
      if (fits(prediction, true)) break;
    }
  }
  if (!fits(prediction, true)) {
    return {
      action: 'reject', shape, prediction,
      reason: `needs ${prediction.reserveBytes} workspace bytes and ${prediction.kvBlocks} KV blocks even reshaped; ` +
        `the budget gives ${cap.workspaceTotal} bytes and ${cap.kvTotalBlocks} blocks`,
    };
  }
  const reshaped = (Object.values(FIELD) as Reshape['field'][])
    .map((field) => ({ field, from: shapeValue(asked, field, model.rerankBatch), to: shapeValue(shape, field, model.rerankBatch) }))
    .filter((r) => r.from !== r.to);
  return { action: fits(prediction, false) ? 'admit' : 'queue', shape, prediction, reshaped };
}
