/**
 * The native CUDA decoder (ragguard_cuda.cu, built by `npm run setup` with nvcc where CUDA is present,
 * into build/native/libragguard_cuda.so) bound through koffi, as NVML and ONNX Runtime's C API are.
 * Loading is lazy and happens once; without the library or without a GPU, `cudaBackend()` says why
 * instead of throwing, so that the CPU paths stay as they are.
 */
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import koffi from 'koffi';
import { LazyLibrary, nativeCalls, numbers } from './native-library.js';

export const CUDA_LIBRARY = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../build/native/libragguard_cuda.so');

/** rg_config of the C ABI. */
export interface NativeConfig {
  num_layers: number; hidden: number; num_heads: number; num_kv_heads: number; head_dim: number; intermediate: number; vocab: number;
  dtype: number; tie_embeddings: number; qkv_bias: number; rms_eps: number;
  num_blocks: number; block_size: number; max_batched_tokens: number; max_seqs: number; max_blocks_per_seq: number;
  cublas_workspace_bytes: number; device: number; graph_max_batch: number;
  /** LoRA slots: adapters resident at once (0: none) and rank per module. */
  max_loras: number; max_lora_rank: number;
  /**
   * A GGUF decoder (1) or FP8 weights made at load (2): the embedding, head and projections stay quantized
   * (rg_quant_upload), in `quant_bytes` at the end of the weights; `quant_tile_bytes` of workspace hold
   * the larger products' split partial sums (or their dequantized tiles, with `quant_gemm` 1).
   */
  quantized: number; quant_bytes: number; quant_tile_bytes: number;
  /** Products of more than 8 rows: 0 the tensor-core kernel reading quantized units, 1 dequantized tiles + cuBLAS. */
  quant_gemm: number;
}

/** rg_memory: the accountant's device figures and the device's own free/total. */
export interface NativeMemory {
  weights: number; kv_pool: number; workspace: number; cublas_workspace: number; graphs: number; host_pinned: number; total: number;
  device_free: number; device_total: number;
  /** The LoRA slots (included in total). */
  lora: number;
}

export type EngineHandle = { readonly __brand: 'rg_engine' };

export interface CudaBackend {
  deviceCount(): number;
  plan(cfg: NativeConfig): number[];
  create(cfg: NativeConfig): EngineHandle;
  destroy(h: EngineHandle): void;
  setRope(h: EngineHandle, invFreq: Float32Array): void;
  loadTensor(h: EngineHandle, kind: number, layer: number, dstOffset: number, file: string, fileOffset: number, count: number, srcDtype: number): void;
  /** Every weight is in: frees the loading's staging buffers. */
  loadDone(h: EngineHandle): void;
  /** Returns the graphs' device bytes so far. */
  captureGraphs(h: EngineHandle, buckets: readonly number[]): number;
  /** One step on a worker thread (the event loop stays free); writes S token ids (and logits when given). */
  step(h: EngineHandle, words: Int32Array, tokensOut: Int32Array, logitsOut: Float32Array | null): Promise<void>;
  copyBlocks(h: EngineHandle, pairs: Int32Array): void;
  memory(h: EngineHandle): NativeMemory;
  /** Profiling (benchmarks): while on, steps launch their kernels directly and the time is summed by phase. */
  profile?(h: EngineHandle, on: boolean): void;
  profileRead?(h: EngineHandle): StepProfile;
  /** Mean device milliseconds of the decode graph of `batch` replayed `reps` times on the last step's inputs. */
  graphTime?(h: EngineHandle, batch: number, reps: number): number;
  /**
   * Steps of at most `rows` rows (0-4) multiply through the library's GEMV kernel instead of cuBLAS (0:
   * cuBLAS always); steps launched directly and graphs captured afterwards. Benchmarks compare the two.
   */
  setGemvRows?(h: EngineHandle, rows: number): void;
  /**
   * A GGUF decoder's GEMV products: 0 in float (the default), 1 in paired half arithmetic (float16
   * activations), 2 with int8 activations and dp4a (rg_set_qgemv_math); graphs captured afterwards keep it.
   * Benchmarks and the agreement check compare them.
   */
  setQgemvMath?(h: EngineHandle, mode: 0 | 1 | 2): void;
  /**
   * FP8 weights' products of more rows than the GEMV takes: 0 the tensor-core tiles (default), 1 cuBLASLt's FP8
   * GEMM with a scale a weight row and a token (rg_set_fp8_gemm). Before the FP8 segments are registered: it
   * changes their packing (withFp8 rowScales).
   */
  setFp8Gemm?(h: EngineHandle, mode: 0 | 1): void;
  /** What cuBLASLt's FP8 path could not do (shapes it had no algorithm for ran the tiles), or ''. */
  fp8GemmNote?(h: EngineHandle): string;
  /**
   * Writes one LoRA slot of an entry: A [in, capacity] and B [capacity, out] float32 (cuda-lora.ts pads
   * them), or zeros where both are null. `projection` is the slot's index in a layer (LORA_PROJECTIONS).
   */
  loraWrite(h: EngineHandle, layer: number, projection: number, entry: number, a: Float32Array | null, b: Float32Array | null): void;
  /**
   * Uploads output rows [row0, row0 + rows) of a GGUF decoder's quantized matrix `kind` (gguf-blocks.ts's
   * planes of ggml type `type`, `bytes` long) at byte `offset` of the quantized area; `packed` null
   * registers an FP8 matrix that loadTensor then fills.
   */
  quantUpload(h: EngineHandle, kind: number, layer: number, row0: number, type: number, rows: number, cols: number, offset: number, packed: Uint8Array | null, bytes: number): void;
}

/** Milliseconds by phase over `steps` profiled steps (rg_profile_read's order). */
export interface StepProfile {
  steps: number;
  ms: Record<(typeof PROFILE_PHASES)[number], number>;
}

export const PROFILE_PHASES = ['embed', 'norm', 'qkv_gemm', 'rope_cache', 'attention', 'o_gemm', 'gate_up_gemm', 'silu', 'down_gemm', 'head_gemm', 'sample'] as const;

function bind(file: string): CudaBackend {
  const lib = koffi.load(file);
  koffi.struct('rg_config', {
    num_layers: 'int32_t', hidden: 'int32_t', num_heads: 'int32_t', num_kv_heads: 'int32_t', head_dim: 'int32_t', intermediate: 'int32_t', vocab: 'int32_t',
    dtype: 'int32_t', tie_embeddings: 'int32_t', qkv_bias: 'int32_t', rms_eps: 'float',
    num_blocks: 'int32_t', block_size: 'int32_t', max_batched_tokens: 'int32_t', max_seqs: 'int32_t', max_blocks_per_seq: 'int32_t',
    cublas_workspace_bytes: 'int64_t', device: 'int32_t', graph_max_batch: 'int32_t',
    max_loras: 'int32_t', max_lora_rank: 'int32_t',
    quantized: 'int32_t', quant_bytes: 'int64_t', quant_tile_bytes: 'int64_t', quant_gemm: 'int32_t',
  });
  koffi.struct('rg_memory', {
    weights: 'int64_t', kv_pool: 'int64_t', workspace: 'int64_t', cublas_workspace: 'int64_t', graphs: 'int64_t', host_pinned: 'int64_t',
    total: 'int64_t', device_free: 'int64_t', device_total: 'int64_t', lora: 'int64_t',
  });
  const lastError = lib.func('const char *rg_last_error()');
  const deviceCount = lib.func('int rg_device_count()');
  const plan = lib.func('int rg_plan(const rg_config *cfg, _Out_ int64_t *out)');
  const create = lib.func('void *rg_create(const rg_config *cfg)');
  const destroy = lib.func('void rg_destroy(void *h)');
  const setRope = lib.func('int rg_set_rope(void *h, const float *inv_freq)');
  const loadTensor = lib.func('int rg_load_tensor(void *h, int kind, int layer, int64_t dst_offset, const char *path, int64_t file_offset, int64_t count, int src_dtype)');
  const loadDone = lib.func('int rg_load_done(void *h)');
  const capture = lib.func('int rg_capture_graphs(void *h, const int32_t *buckets, int n)');
  const step = lib.func('int rg_step(void *h, const int32_t *words, int32_t nwords, int32_t *tokens_out, float *logits_out)');
  const copyBlocks = lib.func('int rg_copy_blocks(void *h, const int32_t *pairs, int n)');
  const memory = lib.func('int rg_memory_info(void *h, _Out_ rg_memory *m)');
  const profile = lib.func('int rg_profile(void *h, int32_t on)');
  const profileRead = lib.func('int rg_profile_read(void *h, _Out_ double *out, int32_t n)');
  const graphTime = lib.func('int rg_graph_time(void *h, int32_t batch, int32_t reps, _Out_ float *ms)');
  const setGemvRows = lib.func('int rg_set_gemv_rows(void *h, int32_t rows)');
  const setQgemvMath = lib.func('int rg_set_qgemv_math(void *h, int32_t mode)');
  const setFp8Gemm = lib.func('int rg_set_fp8_gemm(void *h, int32_t mode)');
  const fp8GemmNote = lib.func('const char *rg_fp8_gemm_note(void *h)');
  const loraWrite = lib.func('int rg_lora_write(void *h, int layer, int projection, int entry, const float *a, const float *b)');
  const quantUpload = lib.func('int rg_quant_upload(void *h, int kind, int layer, int row0, int type, int rows, int cols, int64_t offset, const uint8_t *data, int64_t nbytes)');
  const { check, async } = nativeCalls('CUDA backend', () => lastError());
  return {
    deviceCount: () => Number(deviceCount()),
    plan(cfg) {
      const out = new BigInt64Array(6);
      check(plan(cfg, out), 'rg_plan');
      return Array.from(out, Number);
    },
    create(cfg) {
      const h = create(cfg) as EngineHandle | null;
      if (!h) throw new Error(`CUDA backend: ${String(lastError())}`);
      return h;
    },
    destroy: (h) => void destroy(h),
    setRope: (h, inv) => void check(setRope(h, inv), 'rg_set_rope'),
    loadTensor(h, kind, layer, dstOffset, file, fileOffset, count, srcDtype) {
      check(loadTensor(h, kind, layer, dstOffset, file, fileOffset, count, srcDtype), `loading ${file}`);
    },
    loadDone: (h) => void check(loadDone(h), 'rg_load_done'),
    captureGraphs(h, buckets) {
      check(capture(h, Int32Array.from(buckets), buckets.length), 'capturing CUDA graphs');
      return this.memory(h).graphs;
    },
    step: (h, words, tokensOut, logitsOut) => async(step, [h, words, words.length, tokensOut, logitsOut], 'step'),
    copyBlocks: (h, pairs) => void check(copyBlocks(h, pairs, pairs.length / 2), 'rg_copy_blocks'),
    memory(h) {
      const m = {} as NativeMemory;
      check(memory(h, m), 'rg_memory_info');
      return numbers(m);
    },
    profile: (h, on) => void check(profile(h, on ? 1 : 0), 'rg_profile'),
    profileRead(h) {
      const out = new Float64Array(PROFILE_PHASES.length + 1);
      check(profileRead(h, out, out.length), 'rg_profile_read');
      return { steps: out[0]!, ms: Object.fromEntries(PROFILE_PHASES.map((p, i) => [p, Number(out[i + 1]!.toFixed(4))])) as StepProfile['ms'] };
    },
    graphTime(h, batch, reps) {
      const ms = new Float32Array(1);
      check(graphTime(h, batch, reps, ms), 'rg_graph_time');
      return ms[0]!;
    },
    setGemvRows: (h, rows) => void check(setGemvRows(h, rows), 'rg_set_gemv_rows'),
    setQgemvMath: (h, mode) => void check(setQgemvMath(h, mode), 'rg_set_qgemv_math'),
    setFp8Gemm: (h, mode) => void check(setFp8Gemm(h, mode), 'rg_set_fp8_gemm'),
    fp8GemmNote: (h) => String(fp8GemmNote(h) ?? ''),
    loraWrite(h, layer, projection, entry, a, b) {
      check(loraWrite(h, layer, projection, entry, a, b), `writing LoRA entry ${entry}`);
    },
    quantUpload(h, kind, layer, row0, type, rows, cols, offset, packed, bytes) {
      check(quantUpload(h, kind, layer, row0, type, rows, cols, offset, packed, bytes), `uploading quantized weight kind ${kind} of layer ${layer}`);
    },
  };
}

const library = new LazyLibrary(bind);

/** The bound backend, or null with `cudaUnavailable()` saying why (no library built, no GPU). */
export function cudaBackend(file = CUDA_LIBRARY): CudaBackend | null {
  return library.get(file);
}

export function cudaUnavailable(): string {
  return library.why();
}
