/** Memory readings: the process's own counters, and bytes measured around a load (host, and GPU through NVML). */
import { regionViewBytes } from '../backends/ort/ort-direct.js';
import type { LoadBytes } from '../runtime/load-bytes.js';
import { settledResident } from './peak-meter.js';
import { usedBytes, type GpuMemoryReader } from './nvml.js';

export interface ProcessMemory {
  rss: number;
  heapTotal: number;
  heapUsed: number;
  /**
   * C++ objects bound to JS objects (ONNX Runtime tensors, faiss) plus ArrayBuffers, less the views of
   * the counting allocator's reserved regions (address space, whose memory in use the allocator counts).
   */
  external: number;
  arrayBuffers: number;
}

export function processMemory(): ProcessMemory {
  const m = process.memoryUsage();
  return { rss: m.rss, heapTotal: m.heapTotal, heapUsed: m.heapUsed, external: m.external - regionViewBytes(), arrayBuffers: m.arrayBuffers };
}


/**
 * Runs `load` and reports how much memory it added: resident memory on the host and, with a `device`
 * reader, device memory as NVML sees it (weights a GPU provider uploaded live there, not in the
 * process). The calibration of a component's real footprint (ONNX Runtime's weights after its own
 * conversions, arenas, tokenizer tables), which file sizes alone do not give. Loads must run one at a
 * time for the deltas to be attributable.
 */
export async function measureLoad<T>(load: () => Promise<T>, device?: GpuMemoryReader): Promise<{ value: T } & LoadBytes> {
  // Settled first: memory that earlier work freed but the process still held (a GGUF conversion just
  // before the decoder's load: hundreds of MiB of buffers) would otherwise be reused by the load unseen,
  // and its weights counted as nothing (a SmolLM2-135M decoder converted in the same process measured 0
  // bytes, 235 MiB when found converted). And after: the load's own garbage is not what it holds.
  const before = await settledResident();
  const deviceBefore = device ? usedBytes(device.read()) : 0;
  const value = await load();
  const hostBytes = Math.max(0, (await settledResident()) - before);
  const deviceBytes = device ? Math.max(0, usedBytes(device.read()) - deviceBefore) : 0;
  return { value, bytes: hostBytes + deviceBytes, hostBytes, deviceBytes };
}
