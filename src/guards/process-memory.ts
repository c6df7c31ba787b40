/** Host-side memory readings: the process's own counters, and bytes measured around a load. */

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

/**
 * Runs `load` and reports how much resident memory it added: the calibration of a component's real
 * footprint (ONNX Runtime's weights after its own conversions, arenas, tokenizer tables), which file
 * sizes alone do not give. Loads must run one at a time for the deltas to be attributable.
 */
export async function measureLoad<T>(load: () => Promise<T>): Promise<{ value: T; bytes: number }> {
  const before = process.memoryUsage.rss();
  const value = await load();
  return { value, bytes: Math.max(0, process.memoryUsage.rss() - before) };
}
