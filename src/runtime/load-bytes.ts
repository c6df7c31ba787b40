/** What loading a model added to memory: resident on the host, and on the device as NVML reads it (guards/process-memory.ts measures it). */
export interface LoadBytes {
  /** Host and device bytes together. */
  bytes: number;
  hostBytes: number;
  /** Device memory the load took, where NVML reads it (a model whose weights the provider uploads). */
  deviceBytes: number;
}
