/** Memory readings: the process's own counters, and bytes measured around a load (host, and GPU through NVML). */
import type { GpuMemoryReader } from './nvml.js';


export interface ProcessMemory {
  rss: number;
  heapTotal: number;
  heapUsed: number;
  /** C++ objects bound to JS objects (ONNX Runtime tensors, faiss) plus ArrayBuffers. */
  external: number;
  arrayBuffers: number;
}

export function processMemory(): ProcessMemory {
  const m = process.memoryUsage();
  return { rss: m.rss, heapTotal: m.heapTotal, heapUsed: m.heapUsed, external: m.external, arrayBuffers: m.arrayBuffers };
}

/** Device bytes in use on every GPU together, as NVML reads them; 0 without a reading. */
function deviceUsed(reader: GpuMemoryReader | undefined): number {
  const r = reader?.read();
  return r?.source === 'nvml' ? r.gpus.reduce((s, g) => s + g.usedBytes, 0) : 0;
}

export interface LoadBytes {
  /** Host and device bytes together. */
  bytes: number;
  hostBytes: number;
  /** Device memory the load took, where NVML reads it (a model whose weights the provider uploads). */
  deviceBytes: number;
}

/**
 * Runs `load` and reports how much memory it added: resident memory on the host and, with a `device`
 * reader, device memory as NVML sees it (weights a GPU provider uploaded live there, not in the
 * process). The calibration of a component's real footprint (ONNX Runtime's weights after its own
 * conversions, arenas, tokenizer tables), which file sizes alone do not give. Loads must run one at a
 * time for the deltas to be attributable.
 */
export async function measureLoad<T>(load: () => Promise<T>, device?: GpuMemoryReader): Promise<{ value: T } & LoadBytes> {
  const before = process.memoryUsage.rss();
  const deviceBefore = deviceUsed(device);
  const value = await load();
  const hostBytes = Math.max(0, process.memoryUsage.rss() - before);
  const deviceBytes = Math.max(0, deviceUsed(device) - deviceBefore);
  return { value, bytes: hostBytes + deviceBytes, hostBytes, deviceBytes };
}
