/**
 * GPU 0's used memory as NVML reports it to a bench's own process: a reading now, and a sampler that keeps
 * the highest reading until stopped. Without NVML each reading is null and `unavailable()` says why.
 */
import { nvmlReader, type GpuReading } from '../src/guards/nvml.js';

export function gpuZero(sampleMs: number): {
  used: () => number | null;
  peakSampler: () => { stop: () => number | null };
  unavailable: () => string | null;
} {
  const nvml = nvmlReader();
  let unavailable: string | null = null;
  const used = (): number | null => {
    const r: GpuReading = nvml.read();
    if (r.source !== 'nvml' || r.gpus.length === 0) {
      unavailable = r.source === 'none' ? r.reason : 'NVML sees no GPU';
      return null;
    }
    return r.gpus[0]!.usedBytes;
  };
  /** Samples every `sampleMs` until stopped; the highest reading (null without NVML). */
  const peakSampler = () => {
    let peak = used();
    const sample = () => {
      const u = used();
      if (u !== null && (peak === null || u > peak)) peak = u;
    };
    const t = setInterval(sample, sampleMs);
    return {
      stop: () => {
        clearInterval(t);
        sample();
        return peak;
      },
    };
  };
  return { used, peakSampler, unavailable: () => unavailable };
}
