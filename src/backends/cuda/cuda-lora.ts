/**
 * LoRA adapters on the CUDA backend, as vLLM's punica/S-LoRA path serves many at once: every projection
 * of every layer has a device slot, A [entries, in, capacity] and B [entries, capacity, out] (lora.ts's
 * layout, so PEFT adapters convert with planAdapter / slotTensors), allocated once when the engine is
 * created (max_loras + 1 entries of max_lora_rank per module, counted by the device accountant), entry 0
 * zeros for the base model's rows. Each row of a step carries its sequence's entry (step-pack.ts lora[S])
 * and the kernels add (x A[entry]) B[entry] after each base GEMM; a step without adapter rows launches
 * none of them.
 *
 * This pool owns the entries: loading an adapter writes every slot of a free entry (one host-to-device
 * copy per tensor; zeros for slots the adapter leaves alone, since the entry may hold an earlier
 * adapter's weights), unloading only frees the entry, exactly as lora-pool.ts does for the host slots.
 * The adapter registry (adapters.ts) drives it unchanged.
 *
 * A pool may be made before the device memory exists (cudaLoraPool: the server builds its adapter
 * registry, and so the pool, before the budget has sized the KV pool and the runner is created); the
 * runner that allocates the slots binds it (CudaRunnerOptions.loraPool). Until then nothing can load.
 */
import type { AdapterSlots } from '../../generate/lora-pool.js';
import { DecoderAdapter, LoraPoolFullError } from '../../generate/lora-pool.js';
import { loraSlots, slotCapacity, writeEntry, type LoraProjection, type LoraSlot, type SlotTensors } from '../../generate/lora.js';
import type { CudaModelConfig, ModelDtype } from './hf-checkpoint.js';
import { loraSlotBytes } from './step-pack.js';

/** The projections' order inside a layer: rg_lora_write's `projection` (ragguard_cuda.cu L_QKV..L_DOWN). */
export const LORA_PROJECTIONS: readonly LoraProjection[] = ['self_attn.qkv_proj', 'self_attn.o_proj', 'mlp.gate_proj', 'mlp.up_proj', 'mlp.down_proj'];

/** Writes one slot of an entry on the device: A [in, capacity], B [capacity, out] float32, or zeros (null). */
export type SlotWriter = (layer: number, projection: number, entry: number, a: Float32Array | null, b: Float32Array | null) => void;

export class CudaLoraPool implements AdapterSlots {
  private readonly freeEntries: number[];
  private readonly freed = new Set<() => void>();

  constructor(
    /** lora.ts loraSlots of the model. */
    readonly slots: readonly LoraSlot[],
    readonly maxLoras: number,
    readonly maxRank: number,
    /** The slots' device bytes (the accountant's figure: DevicePlan.lora). */
    readonly bytes: number,
    /** The device slots' writer; absent until the runner that allocates them binds the pool. */
    private write?: SlotWriter,
  ) {
    for (const s of slots) {
      if (LORA_PROJECTIONS.indexOf(s.projection) < 0) throw new Error(`no device LoRA slot for ${s.projection}`);
    }
    this.freeEntries = Array.from({ length: maxLoras }, (_, i) => maxLoras - i); // pop() takes 1 first
  }

  get available(): number {
    return this.freeEntries.length;
  }

  /** Whether the device slots exist (a runner has bound the pool). */
  get bound(): boolean {
    return this.write !== undefined;
  }

  /** Attaches the device slots (the runner that allocated them); once. */
  bind(write: SlotWriter): void {
    if (this.write) throw new Error('this LoRA pool already writes into a runner\'s slots');
    this.write = write;
  }

  load(key: string, tensors: readonly SlotTensors[]): DecoderAdapter {
    const given = new Map(tensors.map((t) => [t.slot.a, t]));
    // Checked before an entry is taken: a refused adapter leaves nothing behind.
    for (const s of this.slots) {
      const t = given.get(s.a);
      if (t && t.rank > slotCapacity(s, this.maxRank)) throw new Error(`rank ${t.rank} over slot capacity ${slotCapacity(s, this.maxRank)} for ${s.a}`);
    }
    const write = this.write;
    if (!write) throw new Error('the CUDA decoder\'s LoRA slots are not allocated yet (no runner has bound them)');
    const entry = this.freeEntries.pop();
    if (entry === undefined) throw new LoraPoolFullError(`all ${this.maxLoras} adapter slots are in use (RAGGUARD_MAX_LORAS)`);
    try {
      for (const s of this.slots) {
        const t = given.get(s.a);
        const p = LORA_PROJECTIONS.indexOf(s.projection);
        if (!t || t.rank === 0) {
          write(s.layer, p, entry, null, null);
          continue;
        }
        const cap = slotCapacity(s, this.maxRank);
        const a = new Float32Array(s.inDim * cap);
        const b = new Float32Array(cap * s.outDim);
        writeEntry(a, 0, 'A', s.inDim, cap, t.a, t.rank);
        writeEntry(b, 0, 'B', s.outDim, cap, t.b, t.rank);
        write(s.layer, p, entry, a, b);
      }
    } catch (e) {
      // A failed copy: the entry goes back (its next load overwrites every slot again).
      this.freeEntries.push(entry);
      throw e;
    }
    return new DecoderAdapter(key, entry, (e) => {
      this.freeEntries.push(e);
      for (const listener of this.freed) listener();
    });
  }

  onFree(listener: () => void): void {
    this.freed.add(listener);
  }
}

/**
 * The pool of a model's device LoRA slots, not yet bound to device memory: for a holder that must hand the
 * adapter registry its pool before the runner exists; the runner created with it (CudaRunnerOptions.loraPool)
 * allocates the slots and binds it.
 */
export function cudaLoraPool(config: CudaModelConfig, dtype: ModelDtype, maxLoras: number, maxRank: number): CudaLoraPool {
  if (maxLoras < 1 || maxRank < 1) throw new Error(`LoRA slots need max_loras and max_lora_rank of at least 1 (${maxLoras} x ${maxRank})`);
  return new CudaLoraPool(loraSlots(config), maxLoras, maxRank, loraSlotBytes(config, dtype, maxLoras, maxRank));
}
