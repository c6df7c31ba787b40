/**
 * Autoregressive generation of one sequence on the decoder's KV cache: one prefill pass over the
 * prompt, then one token per step, feeding each step's present KV back as the next step's past. The
 * cache is the sequence's own, contiguous (a genai decoder's buffer is sized for the prompt and every
 * new token up front): the baseline the paged engine is measured against.
 */
import type { DecoderModel, KvTensor } from './decoder-model.js';
import { sampleToken, seededRandom } from '../../generate/sampler.js';
import type { FinishReason, Generation } from '../../generate/generation.js';

export interface GenerateOptions {
  maxNewTokens: number;
  /** 0 = greedy. */
  temperature: number;
  seed?: number;
  /** Generate exactly maxNewTokens, past any end-of-sequence token (benchmarks). */
  ignoreEos?: boolean;
}

export async function generate(model: DecoderModel, promptIds: readonly number[], opts: GenerateOptions): Promise<Generation> {
  if (promptIds.length === 0) throw new Error('empty prompt');
  const limit = Math.min(opts.maxNewTokens, model.shape.maxPositions - promptIds.length);
  const random = seededRandom(opts.seed ?? 0x5eed);
  const ids: number[] = [];
  let past: KvTensor[] | undefined;
  let width = model.pastWidth([0], promptIds.length + limit);
  let pending = [...promptIds];
  let length = 0;
  let finishReason: FinishReason = 'length';
  try {
    while (ids.length < limit) {
      const out = await model.forward({ tokens: [pending], lengths: [length], past, width });
      // A run that writes in place hands its past back as its present.
      for (const t of past ?? []) if (!out.present.includes(t)) t.dispose();
      past = out.present;
      width = out.width;
      length += pending.length;
      const next = sampleToken(out.lastLogits, opts.temperature, random);
      if (model.eosIds.has(next) && !opts.ignoreEos) {
        finishReason = 'stop';
        break;
      }
      ids.push(next);
      pending = [next];
    }
  } finally {
    for (const t of past ?? []) t.dispose();
  }
  return { ids, text: model.tokenizer.decode(ids).trim(), finishReason };
}
