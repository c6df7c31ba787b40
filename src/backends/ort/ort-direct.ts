/**
 * ONNX Runtime's C API called directly (koffi FFI on the libonnxruntime that onnxruntime-node ships),
 * for runs whose inputs and outputs are tensors in host memory that ONNX Runtime allocated and
 * JavaScript views without a copy: IO binding on the CPU.
 *
 * Why: onnxruntime-node copies every output of every run into a new ArrayBuffer, a preallocated one
 * included. A genai decoder's present KV is its whole batch buffer (written in place by the
 * attention), so that copy, page faults of the fresh buffer included, cost more than the model itself
 * at larger batches (32 rows of 512 positions: ~24 ms of copying for a ~10 ms step). Here the buffer
 * is given as the run's output and stays where it is.
 *
 * Its parts: the C API's binding (ort-c-api.ts), host tensors' types and views (host-memory.ts), the
 * sessions' intra-op settings (session-settings.ts), ragguard's ops' switches (ragguard-ops.ts).
 */
import type { HostArray, HostTensorType } from './host-memory.js';
import { bind, type Api, type DirectSessionOptions, type SessionValueInfo } from './ort-c-api.js';

export { regionViewBytes, viewRegions, type HostArray, type HostTensorType } from './host-memory.js';
export { applySessionSettings, setIntraOpSpin, setIntraOpThreads, type IntraOpSpin, type SessionSettings } from './session-settings.js';
export {
  directUnavailable, RAGGUARD_OPS_LIBRARY, ragguardOpsUnavailable, registerCpuAllocator, type DirectSessionOptions, type SessionValueInfo,
} from './ort-c-api.js';
export { ragguardOpsAmx, ragguardOpsAmxBf16, ragguardOpsVnni, setRagguardOpsAmx, setRagguardOpsAmxBf16, setRagguardOpsPortable } from './ragguard-ops.js';

/** A tensor in host memory that ONNX Runtime owns; `data` views it without a copy until dispose(). */
export class HostTensor {
  readonly location = 'cpu' as const;
  private value: unknown;

  constructor(
    private readonly owner: Api,
    value: unknown,
    readonly type: HostTensorType,
    readonly dims: readonly number[],
    readonly data: HostArray,
    /** The tensor whose memory this one lies in (tensorOver): released with this one. */
    private readonly under?: HostTensor,
  ) {
    this.value = value;
  }

  /** Whether dispose() was called. */
  get disposed(): boolean {
    return this.value === null;
  }

  /** The OrtValue, for a run; throws once disposed. */
  get handle(): unknown {
    if (this.value === null) throw new Error('tensor used after dispose');
    return this.value;
  }

  dispose(): void {
    if (this.value === null) return;
    this.owner.releaseValue(this.value);
    this.value = null;
    this.under?.dispose();
  }
}

/** An inference session on the CPU through the C API, with HostTensor inputs and outputs. */
export class DirectSession {
  private handle: unknown;

  /** The model's inputs and outputs, read once when the session is made. */
  readonly inputs: readonly SessionValueInfo[];
  readonly outputs: readonly SessionValueInfo[];

  private constructor(private readonly a: Api, handle: unknown) {
    this.handle = handle;
    this.inputs = a.io(handle, 'input');
    this.outputs = a.io(handle, 'output');
  }

  /** Null where the C API cannot be bound (see directUnavailable()). */
  static create(modelFile: string, options?: DirectSessionOptions): DirectSession | null {
    const a = bind();
    return a ? new DirectSession(a, a.createSession(modelFile, options)) : null;
  }

  /** An uninitialised tensor (the registered CPU allocator where there is one, else ONNX Runtime's default: malloc). */
  tensor(type: HostTensorType, dims: readonly number[]): HostTensor {
    const { value, data } = this.a.createTensor(type, dims);
    return new HostTensor(this.a, value, type, dims, data);
  }

  /**
   * A tensor of `type` and `dims` in the memory of `base` (at least as large), which it takes over:
   * disposing it disposes `base`. No allocation, and no new view of the memory.
   *
   * Why: each view of ONNX Runtime's memory is an ArrayBuffer that V8 counts as external memory until
   * it is collected, and every 64 MiB of it starts a full garbage collection. A batch's past buffers
   * are up to 1.3 GB (32 rows); made new for every change of the batch, they kept the event loop in
   * full collections of the ~100 MB heap (about 100 ms of main-thread time each) for up to half of a
   * burst's end (`--trace-gc`: "external memory pressure"). Since the counting allocator's regions, a
   * large tensor in one adds no view either (viewRegions); a tensor made over a spare still saves the
   * allocation and the first touch of its pages.
   */
  tensorOver(base: HostTensor, type: HostTensorType, dims: readonly number[]): HostTensor {
    if (base.type !== type) throw new Error(`a ${type} tensor over a ${base.type} one`);
    const { value, data } = this.a.tensorOver(base.handle, base.data, type, dims);
    return new HostTensor(this.a, value, type, dims, data, base);
  }

  /**
   * One run (callers pass the run gate, run-gate.ts: the C call itself runs on a worker thread). An output given a tensor is written into it (it may be an input too: the operator then
   * works in place, as GroupQueryAttention does with its KV buffer); one given null is allocated by
   * ONNX Runtime and returned (the caller disposes it). An abort of `signal` stops the run between two of
   * its nodes (it rejects with RunInterrupted; an output given then holds partial results).
   */
  async run(inputs: Readonly<Record<string, HostTensor>>, outputs: Readonly<Record<string, HostTensor | null>>, signal?: AbortSignal): Promise<Record<string, HostTensor>> {
    if (this.handle === null) throw new Error('session disposed');
    const inNames = Object.keys(inputs);
    const outNames = Object.keys(outputs);
    const outValues = outNames.map((n) => outputs[n]?.handle ?? null);
    await this.a.run(this.handle, inNames, inNames.map((n) => inputs[n]!.handle), outNames, outValues, signal);
    const result: Record<string, HostTensor> = {};
    outNames.forEach((n, i) => {
      const given = outputs[n];
      if (given) result[n] = given;
      else {
        const o = this.a.wrapOutput(outValues[i]);
        result[n] = new HostTensor(this.a, outValues[i], o.type, o.dims, o.data);
      }
    });
    return result;
  }

  dispose(): void {
    if (this.handle === null) return;
    this.a.releaseSession(this.handle);
    this.handle = null;
  }
}
