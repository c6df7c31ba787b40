/**
 * The CUDA encoder library (encoder.cu, built by scripts/build-cuda.sh with nvcc where CUDA is present,
 * into build/native/libragguard_encoder.so) bound through koffi, as the decoder's is (binding.ts). Loaded
 * lazily and once; without the library or a GPU, `encoderNative()` is null and `encoderUnavailable()`
 * says why, so that the ONNX Runtime paths stay as they are.
 */
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import koffi from 'koffi';
import { LazyLibrary, nativeCalls, numbers } from './native-library.js';

export const ENCODER_LIBRARY = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../build/native/libragguard_encoder.so');

/** rg_enc_config of the C ABI. */
export interface EncoderNativeConfig {
  num_layers: number; hidden: number; num_heads: number; intermediate: number; vocab: number; max_positions: number; type_vocab: number; num_labels: number;
  /** 0 embedding, 1 classifier, 2 pair. */
  head: number;
  /** 0 mean, 1 cls, 2 max, 3 mean_sqrt_len, 4 lasttoken. */
  pooling: number;
  normalize: number;
  /** 0 GELU (erf), 1 GELU (tanh). */
  act: number;
  ln_eps: number;
  max_rows: number; max_tokens: number;
  cublas_workspace_bytes: number;
  device: number;
  /** 0 the tensor-core attention kernel, 1 the plain reference one (checks). */
  attention: number;
}

/** rg_enc_memory: the accountant's figures and the device's own free/total. */
export interface EncoderNativeMemory {
  weights: number; activations: number; cublas_workspace: number; host_pinned: number; total: number;
  device_free: number; device_total: number;
}

export type EncoderHandle = { readonly __brand: 'rg_encoder' };

export interface EncoderNative {
  deviceCount(): number;
  /** [weights, activations, cuBLAS workspace, pinned host, device total]: encoder-plan.ts planEncoder's. */
  plan(cfg: EncoderNativeConfig): number[];
  create(cfg: EncoderNativeConfig): EncoderHandle;
  destroy(h: EncoderHandle): void;
  /** One tensor (encoder-plan.ts EncoderTensor `kind`, of `layer` where per layer), float32, Linear weights [out, in]. */
  upload(h: EncoderHandle, kind: number, layer: number, data: Float32Array): void;
  /** Every tensor is in (else throws naming the first missing one). */
  loadDone(h: EncoderHandle): void;
  /**
   * One run on a worker thread: `rows` sequences padded to `width` (ids and types rows x width, lens each
   * sequence's tokens); writes rows x the head's width of floats into `out`.
   */
  run(h: EncoderHandle, ids: Int32Array, types: Int32Array, lens: Int32Array, rows: number, width: number, out: Float32Array): Promise<void>;
  memory(h: EncoderHandle): EncoderNativeMemory;
}

function bind(file: string): EncoderNative {
  const lib = koffi.load(file);
  koffi.struct('rg_enc_config', {
    num_layers: 'int32_t', hidden: 'int32_t', num_heads: 'int32_t', intermediate: 'int32_t', vocab: 'int32_t', max_positions: 'int32_t',
    type_vocab: 'int32_t', num_labels: 'int32_t', head: 'int32_t', pooling: 'int32_t', normalize: 'int32_t', act: 'int32_t', ln_eps: 'float',
    max_rows: 'int32_t', max_tokens: 'int32_t', cublas_workspace_bytes: 'int64_t', device: 'int32_t', attention: 'int32_t',
  });
  koffi.struct('rg_enc_memory', {
    weights: 'int64_t', activations: 'int64_t', cublas_workspace: 'int64_t', host_pinned: 'int64_t', total: 'int64_t',
    device_free: 'int64_t', device_total: 'int64_t',
  });
  const lastError = lib.func('const char *rg_enc_last_error()');
  const deviceCount = lib.func('int rg_enc_device_count()');
  const plan = lib.func('int rg_enc_plan(const rg_enc_config *cfg, _Out_ int64_t *out)');
  const create = lib.func('void *rg_enc_create(const rg_enc_config *cfg)');
  const destroy = lib.func('void rg_enc_destroy(void *h)');
  const upload = lib.func('int rg_enc_upload(void *h, int kind, int layer, const float *data, int64_t count)');
  const loadDone = lib.func('int rg_enc_load_done(void *h)');
  const run = lib.func('int rg_enc_run(void *h, const int32_t *ids, const int32_t *types, const int32_t *lens, int32_t rows, int32_t width, float *out)');
  const memory = lib.func('int rg_enc_memory_info(void *h, _Out_ rg_enc_memory *m)');
  const { check, async } = nativeCalls('CUDA encoder', () => lastError());
  return {
    deviceCount: () => Number(deviceCount()),
    plan(cfg) {
      const out = new BigInt64Array(5);
      check(plan(cfg, out), 'rg_enc_plan');
      return Array.from(out, Number);
    },
    create(cfg) {
      const h = create(cfg) as EncoderHandle | null;
      if (!h) throw new Error(`CUDA encoder: ${String(lastError())}`);
      return h;
    },
    destroy: (h) => void destroy(h),
    upload: (h, kind, layer, data) => void check(upload(h, kind, layer, data, data.length), 'uploading a weight'),
    loadDone: (h) => void check(loadDone(h), 'loading'),
    run: (h, ids, types, lens, rows, width, out) => async(run, [h, ids, types, lens, rows, width, out], 'run'),
    memory(h) {
      const m = {} as EncoderNativeMemory;
      check(memory(h, m), 'rg_enc_memory_info');
      return numbers(m);
    },
  };
}

const library = new LazyLibrary(bind);

/** The bound library, or null with `encoderUnavailable()` saying why (not built, no GPU). */
export function encoderNative(file = ENCODER_LIBRARY): EncoderNative | null {
  return library.get(file);
}

export function encoderUnavailable(): string {
  return library.why();
}
