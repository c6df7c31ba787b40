/**
 * LoRA adapters by name: loaded into a free slot of the decoder's adapter pool (lora-pool.ts) when a
 * request names one, shared by the requests running with it at the same time, and unloaded (its slot
 * freed) when the last of them ends, so that adapters never accumulate. Each request holds a lease.
 * When every slot is held by adapters in use, a request for another one waits, in arrival order, for
 * a slot to free, up to a deadline (then AdapterBusyError: 503).
 *
 * An adapter is a PEFT directory under the adapter dir (adapter_config.json, adapter_model.safetensors).
 * Whether it fits the decoder and the slots is known from its config and its file's header before it
 * loads (inspect), so that a request naming a misfit gets its 422 before anything runs.
 */
import { createHash } from 'node:crypto';
import { readdir, readFile, stat } from 'node:fs/promises';
import path from 'node:path';
import { ADAPTER_NAME as NAME } from '../config/variables/parse.js';
import { headerOf, readHeader, SafetensorsError, tensorValues } from '../runtime/safetensors.js';
import { dtypeBytes, type KvDtype } from './decoder-shape.js';
import { AdapterInvalidError, planAdapter, slotTensors, type AdapterPlan, type LoraShape, type LoraSlot, type PeftConfig, type SlotTensors } from './lora.js';
import type { AdapterSlots, DecoderAdapter } from './lora-pool.js';

/** The decoder as adapters need it. */
export interface AdapterHost {
  readonly loraSlots: readonly LoraSlot[] | null;
  /** Why the decoder takes no adapters, where it says (loraSlots null). */
  readonly loraUnavailable?: string;
  readonly shape: LoraShape & { kvDtype: KvDtype };
  loraPoolFor(maxLoras: number, maxRank: number): AdapterSlots;
}

export interface AdapterLimits {
  /** Adapters resident at once (the pool's entries). */
  maxLoras: number;
  /** Largest rank of one module. */
  maxRank: number;
  /** How long a request waits for a free slot. */
  waitMs: number;
}

export class AdapterNotFoundError extends Error {}
export class AdapterBusyError extends Error {}
export { AdapterInvalidError };

/** What an adapter is, from its files, before it loads. */
export interface AdapterInfo {
  name: string;
  dir: string;
  plan: AdapterPlan;
  /** Its own weights in the decoder's element type (its pool entry holds them rank-padded). */
  bytes: number;
  /** The largest rank among its projections. */
  maxRank: number;
}

export interface AdapterLease {
  adapter: DecoderAdapter;
  info: AdapterInfo;
  /** Ends this request's use; the last lease's release unloads the adapter. Idempotent. */
  release(): void;
}

interface Loaded {
  info: AdapterInfo;
  /** Its weights' key, once loaded. */
  key?: string;
  ready: Promise<DecoderAdapter>;
  refs: number;
}

export interface AdapterStats {
  dir: string;
  /** Why requests cannot name adapters, where they cannot. */
  unavailable?: string;
  /** The pool: adapters resident at once, rank per module, bytes (allocated once), free slots. */
  slots: { max_loras: number; max_rank: number; bytes: number; free: number };
  loaded: { name: string; key: string; bytes: number; refs: number; max_rank: number }[];
  /** Requests waiting for a free slot. */
  waiting: number;
  loads: number;
  unloads: number;
}

export class AdapterRegistry {
  private readonly loaded = new Map<string, Loaded>();
  /** Inspections by name, valid while the files' size and time hold. */
  private readonly infos = new Map<string, { stamp: string; info: AdapterInfo }>();
  /** The decoder's slots; absent where adapters are unavailable. */
  readonly pool: AdapterSlots | undefined;
  /** Slots held for loads about to start or in progress (the pool counts them only once written). */
  private loading = 0;
  private readonly waiters: (() => void)[] = [];
  private loads = 0;
  private unloads = 0;

  constructor(
    /** '' = adapters off. */
    readonly dir: string,
    private readonly host: AdapterHost,
    readonly limits: AdapterLimits,
  ) {
    // Allocated now, with the server: the budget counts the slots like the KV pool.
    if (!this.unavailable) {
      this.pool = host.loraPoolFor(limits.maxLoras, limits.maxRank);
      // A freed entry goes to the next in line (releases call dispose, which frees the entry).
      this.pool.onFree(() => this.wake());
    }
  }

  /** Why no adapter can load here, or '' where they can. */
  get unavailable(): string {
    if (this.dir === '') return 'no adapter directory (RAGGUARD_ADAPTER_DIR is empty)';
    if (!this.host.loraSlots) {
      return this.host.loraUnavailable ?? 'the decoder has no LoRA inputs (a GGUF converted without them, RAGGUARD_DECODER_LORA: on adds them; an export without them: scripts/build-gqa-decoder.ts adds them)';
    }
    return '';
  }

  /** An adapter's plan from its config and header (no weights read); throws when it cannot run here. */
  async inspect(name: string): Promise<AdapterInfo> {
    const why = this.unavailable;
    if (why) throw new AdapterNotFoundError(`adapter '${name}' cannot load: ${why}`);
    if (!NAME.test(name)) throw new AdapterNotFoundError(`'${name}' is not an adapter name (letters, digits, '.', '_', '-')`);
    const dir = path.join(this.dir, name);
    const files = [path.join(dir, 'adapter_config.json'), path.join(dir, 'adapter_model.safetensors')] as const;
    let stamp: string;
    try {
      const st = await Promise.all(files.map((f) => stat(f)));
      stamp = st.map((s) => `${s.size}:${s.mtimeMs}`).join('/');
    } catch {
      throw new AdapterNotFoundError(`adapter '${name}' not found in ${this.dir} (a PEFT directory: adapter_config.json, adapter_model.safetensors)`);
    }
    const known = this.infos.get(name);
    if (known?.stamp === stamp) return known.info;
    let cfg: PeftConfig;
    try {
      cfg = JSON.parse(await readFile(files[0], 'utf8')) as PeftConfig;
    } catch {
      throw new AdapterInvalidError(`adapter '${name}': adapter_config.json is not JSON`);
    }
    let plan: AdapterPlan;
    try {
      plan = planAdapter(cfg, (await readHeader(files[1])).tensors, this.host.shape, this.limits.maxRank);
    } catch (e) {
      if (e instanceof SafetensorsError || e instanceof AdapterInvalidError) throw new AdapterInvalidError(`adapter '${name}': ${e.message}`);
      throw e;
    }
    const info: AdapterInfo = { name, dir, plan, bytes: plan.elements * dtypeBytes(this.host.shape.kvDtype), maxRank: plan.maxRank };
    this.infos.set(name, { stamp, info });
    return info;
  }

  /** A lease on the adapter: shared where a running request loaded it, else loaded into a free slot (waiting for one). */
  async acquire(name: string, signal?: AbortSignal): Promise<AdapterLease> {
    let entry = this.loaded.get(name);
    if (!entry) {
      const info = await this.inspect(name);
      entry = this.loaded.get(name); // another request may have started loading it meanwhile
      if (!entry) {
        await this.slot(name, signal); // holds a slot from here
        entry = this.loaded.get(name); // ... another request may have loaded it while this one waited
        if (entry) {
          this.loading--;
          this.wake(); // the slot goes to the next in line
        }
      }
      if (!entry) {
        // Once loaded the adapter holds its entry and no longer counts as loading: a request that came
        // in between (and found available - loading at 0 while the entry was taken and this count not
        // yet dropped) is woken here, not left waiting on a free entry until its deadline.
        const ready = this.load(info).finally(() => {
          this.loading--;
          this.wake();
        });
        const e: Loaded = (entry = { info, ready, refs: 0 });
        this.loaded.set(name, e);
        ready.then((a) => {
          e.key = a.key;
          this.loads++;
        }, () => {
          if (this.loaded.get(name) === e) this.loaded.delete(name);
          this.wake();
        });
      }
    }
    entry.refs++;
    let adapter: DecoderAdapter;
    try {
      adapter = await entry.ready;
    } catch (e) {
      entry.refs--;
      throw e;
    }
    let released = false;
    const e = entry;
    return {
      adapter, info: e.info,
      release: () => {
        if (released) return;
        released = true;
        if (--e.refs > 0) return;
        // The last request with it has ended (its sequences' runs are done): its slot is free.
        if (this.loaded.get(name) === e) this.loaded.delete(name);
        this.unloads++;
        adapter.dispose(); // frees its entry: the pool's onFree wakes the next in line
      },
    };
  }

  /** Resolves holding a free slot for a new adapter (FIFO: `loading` counts it), or rejects at the deadline. */
  private slot(name: string, signal?: AbortSignal): Promise<void> {
    const pool = this.pool!;
    if (signal?.aborted) return Promise.reject(signal.reason as Error);
    if (this.waiters.length === 0 && pool.available - this.loading > 0) {
      this.loading++;
      return Promise.resolve();
    }
    return new Promise<void>((resolve, reject) => {
      const waiter = () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', leave);
        resolve();
      };
      // Abandoned (the client went away): out of the line at once.
      const leave = () => {
        const i = this.waiters.indexOf(waiter);
        if (i < 0) return;
        this.waiters.splice(i, 1);
        clearTimeout(timer);
        reject(signal!.reason as Error);
      };
      signal?.addEventListener('abort', leave, { once: true });
      const timer = setTimeout(() => {
        const i = this.waiters.indexOf(waiter);
        if (i >= 0) this.waiters.splice(i, 1);
        reject(new AdapterBusyError(`adapter '${name}': all ${pool.maxLoras} adapter slots stayed in use for ${this.limits.waitMs} ms (RAGGUARD_MAX_LORAS)`));
      }, this.limits.waitMs);
      this.waiters.push(waiter);
    });
  }

  /** Hands free slots to waiters, first come first served. */
  private wake(): void {
    const pool = this.pool;
    while (pool && this.waiters.length > 0 && pool.available - this.loading > 0) {
      this.loading++; // held for the waiter until its load takes it (or it finds the adapter loaded)
      this.waiters.shift()!();
    }
  }

  private async load(info: AdapterInfo): Promise<DecoderAdapter> {
    const file = path.join(info.dir, 'adapter_model.safetensors');
    const bytes = await readFile(file);
    // The key names the weights, not just the name: a replaced file must not hit the old one's prefix cache.
    const key = `${info.name}@${createHash('sha256').update(bytes).digest('hex').slice(0, 16)}`;
    const keys = info.plan.slots.flatMap((s) => s.modules.flatMap((m) => [m.keyA, m.keyB]));
    let slots: SlotTensors[];
    try {
      slots = slotTensors(info.plan, tensorValues(bytes, headerOf(bytes), keys));
    } catch (e) {
      // The file changed since it was inspected, or its data is cut short.
      if (e instanceof SafetensorsError) throw new AdapterInvalidError(`adapter '${info.name}': ${e.message}`);
      throw e;
    }
    return this.pool!.load(key, slots);
  }

  stats(): AdapterStats {
    const loaded = [...this.loaded.values()].map((e) => ({
      name: e.info.name, key: e.key ?? '(loading)', bytes: e.info.bytes, refs: e.refs, max_rank: e.info.maxRank,
    }));
    const why = this.unavailable;
    const p = this.pool;
    return {
      dir: this.dir,
      ...(why ? { unavailable: why } : {}),
      slots: { max_loras: p?.maxLoras ?? 0, max_rank: p?.maxRank ?? 0, bytes: p?.bytes ?? 0, free: p?.available ?? 0 },
      loaded,
      waiting: this.waiters.length,
      loads: this.loads,
      unloads: this.unloads,
    };
  }
}

/**
 * Whether a converted decoder gets LoRA inputs (RAGGUARD_DECODER_LORA): on, off, or, for auto, a decision
 * from the model's shape: on where RAGGUARD_ADAPTER_DIR holds an adapter that fits it (its config and
 * tensor shapes, as inspect() checks them). `log` hears the decision.
 */
export function loraWanted(cfg: { decoderLora: 'auto' | 'on' | 'off'; adapterDir: string; maxLoraRank: number }, log?: (msg: string) => void): boolean | ((shape: LoraShape) => Promise<boolean>) {
  if (cfg.decoderLora !== 'auto') return cfg.decoderLora === 'on';
  return async (shape) => {
    const fits = cfg.adapterDir === '' ? undefined : await firstFitting(cfg.adapterDir, shape, cfg.maxLoraRank);
    log?.(fits ? `LoRA inputs: on (adapter '${fits}' in ${cfg.adapterDir} fits the decoder)`
      : `LoRA inputs: off (no adapter in ${cfg.adapterDir || 'RAGGUARD_ADAPTER_DIR (empty)'} fits the decoder; RAGGUARD_DECODER_LORA=on adds them)`);
    return fits !== undefined;
  };
}

/** The first adapter under `dir` (by name) that could run on a decoder of `shape`, or undefined. */
async function firstFitting(dir: string, shape: LoraShape, maxRank: number): Promise<string | undefined> {
  let names: string[];
  try {
    names = (await readdir(dir)).filter((n) => NAME.test(n)).sort();
  } catch {
    return undefined; // no such directory: nothing fits
  }
  for (const name of names) {
    try {
      const cfg = JSON.parse(await readFile(path.join(dir, name, 'adapter_config.json'), 'utf8')) as PeftConfig;
      planAdapter(cfg, (await readHeader(path.join(dir, name, 'adapter_model.safetensors'))).tensors, shape, maxRank);
      return name;
    } catch {
      // not an adapter, or not one for this decoder
    }
  }
  return undefined;
}

/**
 * The grounded-answer adapters setup ships (models/shipped-adapters/README.md), one for each decoder it
 * fetches, by the decoder's file name: what scripts/grounded-lora.sh names the adapter it trains for that
 * decoder. An adapter fits one decoder's shapes only, so at most one of them loads for a given decoder.
 */
export const GROUNDED_ADAPTER_FOR: Readonly<Record<string, string>> = {
  'Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf': 'coder-grounded-1.5b',
  'Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf': 'coder-grounded',
};

/** The shipped grounded adapters, in the order `auto` tries them (the default decoder's first). */
export const GROUNDED_ADAPTERS: readonly string[] = Object.values(GROUNDED_ADAPTER_FOR);

/** RAGGUARD_QUERY_ADAPTER at start-up: the adapter a /query naming none runs with, and why (the start-up log). */
export interface QueryAdapter {
  name: string | undefined;
  note: string;
}

/**
 * RAGGUARD_QUERY_ADAPTER resolved against the registry: off, a name that must load here (throws its
 * AdapterNotFoundError or AdapterInvalidError, so that the start fails saying why), or auto: the
 * first grounded adapter that loads for this decoder, else none with the reasons.
 */
export async function resolveQueryAdapter(setting: string, registry: Pick<AdapterRegistry, 'inspect'>): Promise<QueryAdapter> {
  if (setting === 'off') return { name: undefined, note: 'query adapter: none (RAGGUARD_QUERY_ADAPTER=off)' };
  if (setting !== 'auto') {
    await registry.inspect(setting);
    return { name: setting, note: `query adapter: ${setting} (RAGGUARD_QUERY_ADAPTER)` };
  }
  const why: string[] = [];
  for (const name of GROUNDED_ADAPTERS) {
    try {
      await registry.inspect(name);
      return { name, note: `query adapter: ${name} (RAGGUARD_QUERY_ADAPTER=auto; off for the base model)` };
    } catch (e) {
      // Not there, or made for another decoder: the next one, then the base model saying why.
      if (!(e instanceof AdapterNotFoundError || e instanceof AdapterInvalidError)) throw e;
      why.push(e.message);
    }
  }
  return { name: undefined, note: `query adapter: none (RAGGUARD_QUERY_ADAPTER=auto: ${why.join('; ')})` };
}
