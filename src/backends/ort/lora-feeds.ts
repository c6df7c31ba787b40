/** The LoRA inputs of an ONNX decoder's run (decoder-model.ts): the adapter slots' pool tensors, or zeros. */
import * as ort from 'onnxruntime-node';
import type { KvArray } from '../../generate/decoder-shape.js';
import { LORA_INDEX, type LoraSlot } from '../../generate/lora.js';
import type { DecoderAdapter, LoraPool } from '../../generate/lora-pool.js';
import type { KvTensor } from './forward.js';
import type { DirectSession } from './ort-direct.js';

/** A run's LoRA feeds and the tensors made for it alone (the row index). */
export interface LoraFeeds {
  feeds: Record<string, KvTensor>;
  made: KvTensor[];
}

/** What a run's LoRA feeds are made from: the decoder's slots and pool, its tensors, and its cached rank-0 (or rank-1) zeros. */
export interface LoraFeedSource {
  slots: readonly LoraSlot[] | null;
  pool: LoraPool<KvTensor> | undefined;
  direct: DirectSession | null;
  hostTensor(dims: readonly number[]): KvTensor;
  /** The zero A and B per slot, made once by `make` and kept by the decoder. */
  zeroLora(make: () => Record<string, KvTensor>): Record<string, KvTensor>;
}

/**
 * The LoRA inputs of a run of `rows` rows: rank-0 tensors where no row has an adapter; else every
 * slot's pool tensors and each row's entry (0 for a base-model row), or one entry for all where the
 * rows share it (the graph then gathers one A and B per projection and broadcasts them).
 */
export function loraFeeds(src: LoraFeedSource, rows: number, adapters: readonly (DecoderAdapter | undefined)[] | undefined): LoraFeeds {
  const slots = src.slots;
  const any = adapters?.some((a) => a !== undefined) ?? false;
  if (!slots) {
    if (any) throw new Error('this decoder has no LoRA inputs');
    return { feeds: {}, made: [] };
  }
  if (adapters?.some((a) => a?.released)) throw new Error('a LoRA adapter was used after it was released');
  const entries = (adapters ?? [undefined]).map((a) => a?.entry ?? 0);
  const shared = entries.every((e) => e === entries[0]);
  const n = shared ? 1 : rows;
  const index = src.direct ? src.direct.tensor('int64', [n]) : new ort.Tensor('int64', new BigInt64Array(n), [n]);
  const ids = index.data as BigInt64Array;
  const feeds: Record<string, KvTensor> = { [LORA_INDEX]: index };
  if (!any || !src.pool) {
    ids.fill(0n);
    // Rank 0 on the CPU; rank 1 of zeros through onnxruntime-node, whose WebGPU provider crashes on an
    // empty tensor (seen on the H200: a segfault in the first run).
    const r = src.direct ? 0 : 1;
    const zero = src.zeroLora(() => Object.fromEntries(slots.flatMap((s) => {
      const [a, b] = [src.hostTensor([1, s.inDim, r]), src.hostTensor([1, r, s.outDim])];
      (a.data as KvArray).fill(0);
      (b.data as KvArray).fill(0);
      return [[s.a, a], [s.b, b]];
    })));
    Object.assign(feeds, zero);
    return { feeds, made: [index] };
  }
  for (let r = 0; r < n; r++) ids[r] = BigInt(entries[r]!);
  for (const s of src.pool.slots.values()) {
    feeds[s.slot.a] = s.a;
    feeds[s.slot.b] = s.b;
  }
  return { feeds, made: [index] };
}
