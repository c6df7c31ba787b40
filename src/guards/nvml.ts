/**
 * GPU memory readings through NVML (libnvidia-ml) via koffi. Loading is lazy and happens once;
 * a host without an NVIDIA driver yields {source: 'none', reason} instead of an exception.
 */
import koffi from 'koffi';

export interface GpuMemory { index: number; name: string; totalBytes: number; usedBytes: number; freeBytes: number }
export type GpuReading =
  | { source: 'nvml'; gpus: GpuMemory[]; at: number }
  | { source: 'none'; reason: string; at: number };
export interface GpuMemoryReader { read(): GpuReading }

/** Bytes in use on every GPU of a reading together; 0 for a reading of none. */
export function usedBytes(r: GpuReading): number {
  return r.source === 'nvml' ? r.gpus.reduce((s, g) => s + g.usedBytes, 0) : 0;
}

/** koffi hands back unsigned long long as number, or bigint past 2^53. */
type U64 = number | bigint;
interface NvmlMemory { total: U64; free: U64; used: U64 }
type DeviceHandle = unknown;

/** Typed views of the bound NVML functions (koffi's own signatures are untyped). */
interface Nvml {
  init(): number;
  getCount(count: [number]): number;
  getHandle(index: number, handle: [DeviceHandle]): number;
  getMemory(handle: DeviceHandle, mem: NvmlMemory): number;
  getName(handle: DeviceHandle, buf: Buffer, length: number): number;
  errorString(code: number): string;
}

const NAME_BUFFER_SIZE = 96;
let typesDefined = false;

function errorMessage(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

function bind(libPath: string): Nvml {
  const lib = koffi.load(libPath);
  if (!typesDefined) {
    // koffi type names are process-global; define them once.
    koffi.struct('nvmlMemory_t', { total: 'unsigned long long', free: 'unsigned long long', used: 'unsigned long long' });
    typesDefined = true;
  }
  const init = lib.func('int nvmlInit_v2()');
  const getCount = lib.func('int nvmlDeviceGetCount_v2(_Out_ unsigned int *count)');
  const getHandle = lib.func('int nvmlDeviceGetHandleByIndex_v2(unsigned int index, _Out_ void **device)');
  const getMemory = lib.func('int nvmlDeviceGetMemoryInfo(void *device, _Out_ nvmlMemory_t *memory)');
  const errorString = lib.func('const char *nvmlErrorString(int result)');
  let getName: ((h: DeviceHandle, b: Buffer, n: number) => unknown) | undefined;
  try {
    getName = lib.func('int nvmlDeviceGetName(void *device, char *name, unsigned int length)');
  } catch {
    getName = undefined; // optional: names fall back to "GPU <i>"
  }
  return {
    init: () => Number(init()),
    getCount: (c) => Number(getCount(c)),
    getHandle: (i, h) => Number(getHandle(i, h)),
    getMemory: (h, m) => Number(getMemory(h, m)),
    getName: (h, b, n) => (getName ? Number(getName(h, b, n)) : -1),
    errorString: (code) => {
      const s: unknown = errorString(code);
      return typeof s === 'string' ? s : `NVML error ${code}`;
    },
  };
}

interface Loaded { nvml: Nvml; devices: { index: number; name: string; handle: DeviceHandle }[] }

/** Lazily loads NVML once; every later read reuses the handles; never throws: failures become {source:'none', reason}. */
export function nvmlReader(libPath = 'libnvidia-ml.so.1'): GpuMemoryReader {
  let state: { ok: true; loaded: Loaded } | { ok: false; reason: string } | undefined;

  const load = (): { ok: true; loaded: Loaded } | { ok: false; reason: string } => {
    let nvml: Nvml;
    try {
      nvml = bind(libPath);
    } catch (e) {
      return { ok: false, reason: `${libPath} not loadable: ${errorMessage(e)}; no NVIDIA GPU or driver on this host` };
    }
    try {
      const fail = (what: string, rc: number): { ok: false; reason: string } =>
        ({ ok: false, reason: `${what} failed: ${nvml.errorString(rc)}` });
      let rc = nvml.init();
      if (rc !== 0) return fail('nvmlInit_v2', rc);
      const count: [number] = [0];
      rc = nvml.getCount(count);
      if (rc !== 0) return fail('nvmlDeviceGetCount_v2', rc);
      const devices: Loaded['devices'] = [];
      for (let index = 0; index < count[0]; index++) {
        const h: [DeviceHandle] = [null];
        rc = nvml.getHandle(index, h);
        if (rc !== 0) return fail('nvmlDeviceGetHandleByIndex_v2', rc);
        const buf = Buffer.alloc(NAME_BUFFER_SIZE);
        let name = `GPU ${index}`;
        if (nvml.getName(h[0], buf, NAME_BUFFER_SIZE) === 0) {
          const end = buf.indexOf(0);
          const s = buf.toString('utf8', 0, end < 0 ? buf.length : end).trim();
          if (s) name = s;
        }
        devices.push({ index, name, handle: h[0] });
      }
      return { ok: true, loaded: { nvml, devices } };
    } catch (e) {
      return { ok: false, reason: `NVML setup failed: ${errorMessage(e)}` };
    }
  };

  return {
    read(): GpuReading {
      const at = Date.now();
      state ??= load();
      if (!state.ok) return { source: 'none', reason: state.reason, at };
      const { nvml, devices } = state.loaded;
      try {
        const gpus: GpuMemory[] = [];
        for (const d of devices) {
          const mem: NvmlMemory = { total: 0, free: 0, used: 0 };
          const rc = nvml.getMemory(d.handle, mem);
          if (rc !== 0) return { source: 'none', reason: `nvmlDeviceGetMemoryInfo failed: ${nvml.errorString(rc)}`, at };
          gpus.push({
            index: d.index, name: d.name,
            totalBytes: Number(mem.total), usedBytes: Number(mem.used), freeBytes: Number(mem.free),
          });
        }
        return { source: 'nvml', gpus, at };
      } catch (e) {
        return { source: 'none', reason: `nvmlDeviceGetMemoryInfo failed: ${errorMessage(e)}`, at };
      }
    },
  };
}

/** Samples a reader every intervalMs (unref'd timer), keeping the latest reading and the peak used bytes per GPU since the last resetPeak(). */
export class GpuSampler {
  private current: GpuReading;
  private readonly peaks = new Map<number, number>();
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly reader: GpuMemoryReader, intervalMs: number) {
    this.current = { source: 'none', reason: 'not sampled yet', at: Date.now() };
    this.sample();
    this.timer = setInterval(() => this.sample(), Math.max(1, intervalMs));
    this.timer.unref();
  }

  /** Takes one reading now (the timer calls this); a throwing reader becomes a 'none' reading. */
  sample(): GpuReading {
    let r: GpuReading;
    try {
      r = this.reader.read();
    } catch (e) {
      r = { source: 'none', reason: `reader failed: ${errorMessage(e)}`, at: Date.now() };
    }
    this.current = r;
    if (r.source === 'nvml') {
      for (const g of r.gpus) {
        const prev = this.peaks.get(g.index);
        if (prev === undefined || g.usedBytes > prev) this.peaks.set(g.index, g.usedBytes);
      }
    }
    return r;
  }

  latest(): GpuReading { return this.current; }

  peakUsedBytes(index: number): number | undefined { return this.peaks.get(index); }

  /** Forgets the peaks; they restart from the latest reading's used bytes. */
  resetPeak(): void {
    this.peaks.clear();
    if (this.current.source === 'nvml') for (const g of this.current.gpus) this.peaks.set(g.index, g.usedBytes);
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }

  /** (Re)starts periodic sampling. */
  start(intervalMs: number): void {
    this.stop();
    this.timer = setInterval(() => this.sample(), Math.max(1, intervalMs));
    this.timer.unref();
  }

  get running(): boolean { return this.timer !== undefined; }
}
