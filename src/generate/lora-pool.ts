/**
 * The adapter slots (lora.ts): for each projection of the graph, one A [entries, in, capacity] and one B
 * [entries, capacity, out] tensor, allocated once, entry 0 zeros (the base model's rows), entries 1..n
 * the resident adapters'. Loading an adapter writes its weights into a free entry; unloading frees the
 * entry. Nothing is allocated per adapter or per batch, so the bytes are those of start-up, exactly, as
 * vLLM's LoRA manager preallocates max_loras x max_lora_rank.
 */
import { floatsToHalfs } from '../runtime/float16.js';
import type { KvArray, KvDtype } from './decoder-shape.js';
import { slotCapacity, writeEntry, type LoraSlot, type SlotTensors } from './lora.js';

/** A host tensor as runs take it (the decoder's: ONNX Runtime's memory on the direct path). */
export interface SlotTensor {
  readonly data: unknown;
  dispose(): void;
}

interface Slot<T extends SlotTensor> {
  slot: LoraSlot;
  capacity: number;
  a: T;
  b: T;
}

/** A resident adapter: its entry in the pool; dispose() frees the entry. */
export class DecoderAdapter {
  private disposed = false;

  constructor(
    /** Identifies its weights: prefix-cache entries are per key (name and content). */
    readonly key: string,
    /** Its entry in every slot (never 0, the base model's). */
    readonly entry: number,
    private readonly free: (entry: number) => void,
  ) {}

  get released(): boolean {
    return this.disposed;
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.free(this.entry);
  }
}

export class LoraPoolFullError extends Error {}

/**
 * A decoder's adapter slots as the adapter registry drives them (adapters.ts): this host pool, or the
 * CUDA backend's device slots (backends/cuda/cuda-lora.ts).
 */
export interface AdapterSlots {
  readonly maxLoras: number;
  readonly maxRank: number;
  /** Bytes of all its slots, allocated once. */
  readonly bytes: number;
  /** Free entries. */
  readonly available: number;
  /** Writes an adapter's slot tensors into a free entry; throws LoraPoolFullError when none is free. */
  load(key: string, tensors: readonly SlotTensors[]): DecoderAdapter;
  /** Called whenever an entry frees. */
  onFree(listener: () => void): void;
}

export class LoraPool<T extends SlotTensor = SlotTensor> implements AdapterSlots {
  /** By slot's A input name. */
  readonly slots: ReadonlyMap<string, Slot<T>>;
  /** Bytes of all its tensors. */
  readonly bytes: number;
  private readonly freeEntries: number[];
  private readonly freed = new Set<() => void>();

  constructor(
    slots: readonly LoraSlot[],
    /** Adapters resident at once (entries besides the zero one). */
    readonly maxLoras: number,
    /** Largest rank of one module. */
    readonly maxRank: number,
    private readonly dtype: KvDtype,
    make: (dims: readonly number[]) => T,
  ) {
    const entries = maxLoras + 1;
    const byName = new Map<string, Slot<T>>();
    let elements = 0;
    for (const slot of slots) {
      const capacity = slotCapacity(slot, maxRank);
      const s: Slot<T> = { slot, capacity, a: make([entries, slot.inDim, capacity]), b: make([entries, capacity, slot.outDim]) };
      // Fresh host memory is not zeroed: every entry starts as zeros (entry 0 stays so).
      (s.a.data as KvArray).fill(0);
      (s.b.data as KvArray).fill(0);
      byName.set(slot.a, s);
      elements += entries * capacity * (slot.inDim + slot.outDim);
    }
    this.slots = byName;
    this.bytes = elements * (dtype === 'float16' ? 2 : 4);
    this.freeEntries = Array.from({ length: maxLoras }, (_, i) => maxLoras - i); // pop() takes 1 first
  }

  get available(): number {
    return this.freeEntries.length;
  }

  /** Writes an adapter's slot tensors (lora.ts slotTensors) into a free entry; throws when none is free. */
  load(key: string, tensors: readonly SlotTensors[]): DecoderAdapter {
    const entry = this.freeEntries.pop();
    if (entry === undefined) throw new LoraPoolFullError(`all ${this.maxLoras} adapter slots are in use (RAGGUARD_MAX_LORAS)`);
    const given = new Map(tensors.map((t) => [t.slot.a, t]));
    const cast = (v: Float32Array): KvArray => (this.dtype === 'float16' ? floatsToHalfs(v) : v);
    for (const [name, s] of this.slots) {
      const t = given.get(name);
      if (t && t.rank > s.capacity) {
        this.freeEntries.push(entry);
        throw new Error(`rank ${t.rank} over slot capacity ${s.capacity} for ${name}`);
      }
      // Slots the adapter leaves alone are zeroed: the entry may hold an earlier adapter's weights.
      writeEntry(s.a.data as KvArray, entry, 'A', s.slot.inDim, s.capacity, t && cast(t.a), t?.rank);
      writeEntry(s.b.data as KvArray, entry, 'B', s.slot.outDim, s.capacity, t && cast(t.b), t?.rank);
    }
    return new DecoderAdapter(key, entry, (e) => {
      this.freeEntries.push(e);
      for (const listener of this.freed) listener();
    });
  }

  /**
   * Called whenever an entry frees. The pool is the decoder's (one per model), so every registry on it
   * hands a freed entry to its waiters, whichever registry's adapter released it: a waiter woken only
   * by its own registry's releases could wait on a free entry until its deadline.
   */
  onFree(listener: () => void): void {
    this.freed.add(listener);
  }

  /** Frees the tensors (the pool must not be used after). */
  dispose(): void {
    for (const s of this.slots.values()) {
      s.a.dispose();
      s.b.dispose();
    }
  }
}
