/** The ONNX decoder's (decoder-model.ts) past buffers made in a spare tensor's memory, and the present outputs' names. */
import type { KvDtype } from '../../generate/decoder-shape.js';
import type { KvTensor } from './forward.js';
import { HostTensor } from './ort-direct.js';

/**
 * How much larger than needed a spare tensor may be to hold a past buffer (allocPast). The guard
 * reserves for each decoding row its buffer and the replaced one held beside it during a change of
 * the batch (memory-model.ts, replacedBuffer): a batch that keeps a buffer of at most 1.5 times its
 * need, in place of a new one next to the old, holds less than that.
 */
export const SPARE_RATIO = 1.5;

/** The index in `spare` of the smallest live host tensor of `type` holding `need` to SPARE_RATIO x `need` elements; -1 if none. */
export function pickSpare(spare: readonly KvTensor[], type: KvDtype, need: number): number {
  let best = -1;
  spare.forEach((t, i) => {
    if (!(t instanceof HostTensor) || t.disposed || t.type !== type) return;
    const n = t.data.length;
    if (n >= need && n <= need * SPARE_RATIO && (best < 0 || n < spare[best]!.data.length)) best = i;
  });
  return best;
}

export function presentNames(layers: number): string[] {
  return Array.from({ length: layers }, (_, l) => [`present.${l}.key`, `present.${l}.value`]).flat();
}
