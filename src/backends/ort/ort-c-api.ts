/**
 * ONNX Runtime's C API bound once (koffi FFI on the libonnxruntime that onnxruntime-node ships), for the
 * direct sessions and host tensors of ort-direct.ts.
 *
 * Function-table indices are those of OrtApi in onnxruntime_c_api.h (the table only ever grows, so
 * they hold for every later version); the table is requested at API version 16.
 */
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';
import path from 'node:path';
import koffi from 'koffi';
import { RunInterrupted } from '../../runtime/errors.js';
import { BY_ONNX, ELEMENT, regions, view, type HostArray, type HostTensorType } from './host-memory.js';
import { intraOpDefaults, type IntraOpSpin } from './session-settings.js';

/** OrtApi function-table slots used here (onnxruntime_c_api.h). */
const SLOT = {
  GetErrorMessage: 2, CreateEnv: 3, CreateSession: 7, Run: 9, CreateSessionOptions: 10, EnableProfiling: 14, DisableMemPattern: 17, DisableCpuMemArena: 19,
  SetSessionGraphOptimizationLevel: 23, SetIntraOpNumThreads: 24, SessionGetInputCount: 30, SessionGetOutputCount: 31, SessionGetInputTypeInfo: 33, SessionGetOutputTypeInfo: 34,
  SessionGetInputName: 36, SessionGetOutputName: 37, CreateRunOptions: 39, RunOptionsSetTerminate: 46,
  CreateTensorAsOrtValue: 48, CreateTensorWithDataAsOrtValue: 49, GetTensorMutableData: 51, CastTypeInfoToTensorInfo: 55, GetTensorElementType: 60,
  GetDimensionsCount: 61, GetDimensions: 62, GetTensorTypeAndShape: 65, AllocatorFree: 76, GetAllocatorWithDefaultOptions: 78,
  ReleaseStatus: 93, ReleaseSession: 95, ReleaseValue: 96, ReleaseRunOptions: 97, ReleaseTypeInfo: 98, ReleaseTensorTypeAndShapeInfo: 99,
  ReleaseSessionOptions: 100, CreateCpuMemoryInfo: 69, AddSessionConfigEntry: 130, RegisterAllocator: 176,
  RegisterCustomOpsLibrary_V2: 228, GetBuildInfoString: 254,
} as const;

/**
 * ragguard's custom-op library (src/backends/ort/ragguard-ops.c, built by npm run setup): its
 * QMatMul8 and QMatMul4 run the block products of converted GGUF decoders (RAGGUARD_CPU_KERNELS).
 */
export const RAGGUARD_OPS_LIBRARY = path.resolve(import.meta.dirname, '..', '..', '..', 'build', 'native', 'libragguard-ops.so');

export interface Api {
  check(status: unknown): void;
  createSession(file: string, options?: DirectSessionOptions): unknown;
  /** The session's inputs or outputs: names, and element types where they are tensors of a type handled here. */
  io(session: unknown, side: 'input' | 'output'): SessionValueInfo[];
  createTensor(type: HostTensorType, dims: readonly number[]): { value: unknown; data: HostArray };
  /** A tensor of `dims` over the first elements of `base`'s memory (which it does not own), viewed through `base`'s own view. */
  tensorOver(base: unknown, baseData: HostArray, type: HostTensorType, dims: readonly number[]): { value: unknown; data: HostArray };
  wrapOutput(value: unknown): { type: HostTensorType; dims: number[]; data: HostArray };
  /**
   * One run on a worker thread. An abort of `signal` while it runs sets the run's terminate flag:
   * ONNX Runtime stops between two nodes and the run rejects with the signal's reason (RunInterrupted).
   */
  run(session: unknown, inNames: string[], inValues: unknown[], outNames: string[], outValues: unknown[], signal?: AbortSignal): Promise<void>;
  releaseValue(value: unknown): void;
  releaseSession(session: unknown): void;
  /**
   * Registers `allocator` (an OrtAllocator for the CPU, whose memory info this makes) with the
   * environment: every session made afterwards, here or by onnxruntime-node, with
   * session.use_env_allocators=1 allocates through it.
   */
  registerCpuAllocator(allocator: (info: unknown) => unknown): void;
}

export interface SessionValueInfo {
  name: string;
  /** A tensor's element type ('float32', ...; 'onnx element type N' for those not handled here); undefined where not a tensor. */
  type: string | undefined;
  /** A tensor's rank (its number of dimensions, symbolic ones included); undefined where not a tensor. */
  rank?: number;
}

let api: Api | null | undefined;
let unavailable = '';
/** Whether this libonnxruntime's API table is the one the ops library was written against (bind checks). */
let opsUsable = false;
/**
 * The loaded libonnxruntime, held for the process's life: koffi unloads a library whose handle is
 * collected, and the API table's functions (decoded pointers) do not hold it. A process that imports
 * onnxruntime-node keeps it mapped anyway; one that uses only this binding (a script timing one op)
 * crashed (SIGSEGV, a call into the unmapped library) at the first collection after bind().
 */
let ortLibrary: unknown;

/** What a direct session may set beyond the options every CPU session here gets. */
export interface DirectSessionOptions {
  /** Intra-op threads (0 or absent: ONNX Runtime's default, one per core). */
  intraOpThreads?: number;
  /** Let idle intra-op threads spin, within runs and between them (default false; see createSession). */
  spinning?: boolean;
  /** This session's IntraOpSpin, where given (default: setIntraOpSpin's, itself 'off' until set). */
  spin?: IntraOpSpin;
  /** ONNX Runtime's profiler on, its JSON written as `<prefix>_<time>.json` when the session is released. */
  profilePrefix?: string;
}

/** Binds the C API once; null (with `directUnavailable()` saying why) where it cannot be loaded. */
export function bind(): Api | null {
  if (api !== undefined) return api;
  try {
    const require = createRequire(import.meta.url);
    const dir = path.join(path.dirname(require.resolve('onnxruntime-node/package.json')), 'bin', 'napi-v6', process.platform, process.arch);
    const lib = koffi.load(path.join(dir, process.platform === 'darwin' ? 'libonnxruntime.dylib' : 'libonnxruntime.so.1'));
    ortLibrary = lib;
    const ApiBase = koffi.struct('OrtApiBase', { GetApi: 'void *', GetVersionString: 'void *' });
    const base = koffi.decode(lib.func('void *OrtGetApiBase()')(), ApiBase) as { GetApi: unknown };
    const getApi = koffi.decode(base.GetApi, koffi.proto('void *OrtGetApi(uint32_t version)')) as (v: number) => unknown;
    const table = koffi.decode(getApi(16), koffi.array('void *', 256)) as unknown[];
    if (!table) throw new Error('OrtGetApi(16) returned NULL');
    const fn = (slot: number, proto: string) => koffi.decode(table[slot], koffi.proto(proto)) as (...args: unknown[]) => unknown;
    const getErrorMessage = fn(SLOT.GetErrorMessage, 'const char *GetErrorMessage(void *status)');
    const releaseStatus = fn(SLOT.ReleaseStatus, 'void ReleaseStatus(void *status)');
    const check = (status: unknown) => {
      if (status === null) return;
      const msg = getErrorMessage(status) as string;
      releaseStatus(status);
      throw new Error(`onnxruntime: ${msg}`);
    };
    const out = () => [null] as unknown[];
    const createEnv = fn(SLOT.CreateEnv, 'void *CreateEnv(int level, const char *id, _Out_ void **env)');
    const createOptions = fn(SLOT.CreateSessionOptions, 'void *CreateSessionOptions(_Out_ void **opts)');
    const disableArena = fn(SLOT.DisableCpuMemArena, 'void *DisableCpuMemArena(void *opts)');
    const disablePattern = fn(SLOT.DisableMemPattern, 'void *DisableMemPattern(void *opts)');
    const setOptLevel = fn(SLOT.SetSessionGraphOptimizationLevel, 'void *SetSessionGraphOptimizationLevel(void *opts, int level)');
    const setIntraOp = fn(SLOT.SetIntraOpNumThreads, 'void *SetIntraOpNumThreads(void *opts, int n)');
    const enableProfiling = fn(SLOT.EnableProfiling, 'void *EnableProfiling(void *opts, const char *prefix)');
    const releaseOptions = fn(SLOT.ReleaseSessionOptions, 'void ReleaseSessionOptions(void *opts)');
    const createSession = fn(SLOT.CreateSession, 'void *CreateSession(void *env, const char *path, void *opts, _Out_ void **session)');
    const releaseSession = fn(SLOT.ReleaseSession, 'void ReleaseSession(void *session)');
    const getAllocator = fn(SLOT.GetAllocatorWithDefaultOptions, 'void *GetAllocatorWithDefaultOptions(_Out_ void **alloc)');
    const createTensor = fn(SLOT.CreateTensorAsOrtValue, 'void *CreateTensorAsOrtValue(void *alloc, const int64_t *shape, size_t n, int type, _Out_ void **value)');
    const createTensorWithData = fn(SLOT.CreateTensorWithDataAsOrtValue,
      'void *CreateTensorWithDataAsOrtValue(void *info, void *data, size_t bytes, const int64_t *shape, size_t n, int type, _Out_ void **value)');
    const mutableData = fn(SLOT.GetTensorMutableData, 'void *GetTensorMutableData(void *value, _Out_ void **data)');
    const typeAndShape = fn(SLOT.GetTensorTypeAndShape, 'void *GetTensorTypeAndShape(void *value, _Out_ void **info)');
    const elementType = fn(SLOT.GetTensorElementType, 'void *GetTensorElementType(void *info, _Out_ int *type)');
    const dimsCount = fn(SLOT.GetDimensionsCount, 'void *GetDimensionsCount(void *info, _Out_ size_t *n)');
    const getDims = fn(SLOT.GetDimensions, 'void *GetDimensions(void *info, _Out_ int64_t *dims, size_t n)');
    const releaseInfo = fn(SLOT.ReleaseTensorTypeAndShapeInfo, 'void ReleaseTensorTypeAndShapeInfo(void *info)');
    const releaseValue = fn(SLOT.ReleaseValue, 'void ReleaseValue(void *value)');
    const createRunOptions = fn(SLOT.CreateRunOptions, 'void *CreateRunOptions(_Out_ void **options)');
    const setTerminate = fn(SLOT.RunOptionsSetTerminate, 'void *RunOptionsSetTerminate(void *options)');
    const releaseRunOptions = fn(SLOT.ReleaseRunOptions, 'void ReleaseRunOptions(void *options)');
    const side = (s: 'Input' | 'Output') => ({
      count: fn(SLOT[`SessionGet${s}Count`], `void *SessionGet${s}Count(void *session, _Out_ size_t *n)`),
      name: fn(SLOT[`SessionGet${s}Name`], `void *SessionGet${s}Name(void *session, size_t i, void *alloc, _Out_ void **name)`),
      typeInfo: fn(SLOT[`SessionGet${s}TypeInfo`], `void *SessionGet${s}TypeInfo(void *session, size_t i, _Out_ void **info)`),
    });
    const sides = { input: side('Input'), output: side('Output') };
    const tensorInfo = fn(SLOT.CastTypeInfoToTensorInfo, 'void *CastTypeInfoToTensorInfo(void *info, _Out_ void **tensor)');
    const releaseTypeInfo = fn(SLOT.ReleaseTypeInfo, 'void ReleaseTypeInfo(void *info)');
    const allocatorFree = fn(SLOT.AllocatorFree, 'void *AllocatorFree(void *alloc, void *p)');
    const cpuMemoryInfo = fn(SLOT.CreateCpuMemoryInfo, 'void *CreateCpuMemoryInfo(int allocatorType, int memType, _Out_ void **info)');
    const addConfigEntry = fn(SLOT.AddSessionConfigEntry, 'void *AddSessionConfigEntry(void *opts, const char *key, const char *value)');
    const registerAllocator = fn(SLOT.RegisterAllocator, 'void *RegisterAllocator(void *env, void *allocator)');
    const registerOpsLibrary = fn(SLOT.RegisterCustomOpsLibrary_V2, 'void *RegisterCustomOpsLibrary_V2(void *opts, const char *path)');
    // The slots are counted from onnxruntime_c_api.h; the build string (past every slot used here and
    // by the ops library but ParallelFor) says the count holds for this libonnxruntime.
    const buildInfo = fn(SLOT.GetBuildInfoString, 'const char *GetBuildInfoString()')() as string;
    opsUsable = typeof buildInfo === 'string' && buildInfo.startsWith('ORT Build Info');
    const runFn = koffi.decode(table[SLOT.Run], koffi.proto(
      'void *Run(void *session, void *runOptions, const char **inNames, void **inValues, size_t nIn, const char **outNames, size_t nOut, _Inout_ void **outValues)',
    )) as (...args: unknown[]) => unknown;

    const env = out();
    check(createEnv(2, 'ragguard', env));
    const alloc = out();
    check(getAllocator(alloc));
    // Tensors made here allocate through the registered allocator once there is one (so that the
    // counting allocator accounts a decoder's KV buffers too), else through the default one.
    let tensorAllocator: unknown = alloc[0];
    let envAllocator = false;
    let cpuInfo: unknown;
    const dataOf = (value: unknown, type: HostTensorType, count: number): HostArray => {
      const p = out();
      check(mutableData(value, p));
      // A view of ONNX Runtime's memory, not a copy: valid until the value is released. In a reserved
      // region, a part of the region's own view (viewRegions says why); elsewhere a new one.
      if (count === 0) return view(type, new ArrayBuffer(0));
      if (regions.length > 0) {
        const at = koffi.address(p[0]) as bigint;
        const r = regions.find((q) => at >= q.start && at < q.end);
        if (r) return view(type, r.buffer, Number(at - r.start), count);
      }
      return view(type, koffi.view(p[0], count * ELEMENT[type].bytes) as ArrayBuffer);
    };
    api = {
      check,
      createSession(file, options = {}) {
        const opts = out();
        check(createOptions(opts));
        try {
          check(disableArena(opts[0])); // as every CPU session here: run buffers go back to malloc
          check(disablePattern(opts[0])); // and no per-shape planned block (session.ts says why)
          check(setOptLevel(opts[0], 99)); // ORT_ENABLE_ALL
          // Between runs idle intra-op threads always sleep: a spinning pool thread would take a core
          // from the event loop, which answers probes and 503s. Within a run ('runs') they may spin
          // between the graph's nodes instead of sleeping and being woken for each (the event loop has
          // little to do while the run it waits for computes).
          const spin = options.spinning ? 'always' : options.spin ?? intraOpDefaults().spin;
          check(addConfigEntry(opts[0], 'session.intra_op.allow_spinning', spin === 'off' ? '0' : '1'));
          if (spin === 'runs') check(addConfigEntry(opts[0], 'session.force_spinning_stop', '1'));
          // The session's own count where given (scripts, tests), else the server's setting; 0: ONNX
          // Runtime's default (a thread per physical core, the calling one included).
          const threads = options.intraOpThreads ?? intraOpDefaults().threads;
          if (threads > 0) check(setIntraOp(opts[0], threads));
          if (options.profilePrefix !== undefined) check(enableProfiling(opts[0], options.profilePrefix));
          if (envAllocator) check(addConfigEntry(opts[0], 'session.use_env_allocators', '1'));
          // The ops library where it is built: a graph converted with ragguard's kernels needs it, others
          // are not changed by it (it only adds the 'ragguard' domain).
          if (opsUsable && existsSync(RAGGUARD_OPS_LIBRARY)) check(registerOpsLibrary(opts[0], RAGGUARD_OPS_LIBRARY));
          const s = out();
          check(createSession(env[0], file, opts[0], s));
          return s[0];
        } finally {
          releaseOptions(opts[0]);
        }
      },
      io(session, which) {
        const { count, name: ioName, typeInfo } = sides[which];
        const n = [0];
        check(count(session, n));
        return Array.from({ length: n[0]! }, (_, i) => {
          const p = out();
          check(ioName(session, i, alloc[0], p));
          const name = koffi.decode(p[0], 'char', -1) as string;
          check(allocatorFree(alloc[0], p[0]));
          const info = out();
          check(typeInfo(session, i, info));
          try {
            const t = out();
            check(tensorInfo(info[0], t)); // NULL where the input is not a tensor; owned by info
            if (t[0] === null) return { name, type: undefined };
            const e = [0];
            check(elementType(t[0], e));
            const r = [0];
            check(dimsCount(t[0], r));
            return { name, type: BY_ONNX.get(e[0]!) ?? `onnx element type ${e[0]}`, rank: r[0]! };
          } finally {
            releaseTypeInfo(info[0]);
          }
        });
      },
      createTensor(type, dims) {
        const v = out();
        check(createTensor(tensorAllocator, BigInt64Array.from(dims.map(BigInt)), dims.length, ELEMENT[type].onnx, v));
        return { value: v[0], data: dataOf(v[0], type, dims.reduce((a, b) => a * b, 1)) };
      },
      tensorOver(base, baseData, type, dims) {
        const count = dims.reduce((a, b) => a * b, 1);
        if (count > baseData.length) throw new Error(`a tensor of ${count} elements over ${baseData.length}`);
        const p = out();
        check(mutableData(base, p));
        cpuInfo ??= (() => {
          const info = out();
          check(cpuMemoryInfo(0, 0, info)); // OrtDeviceAllocator, OrtMemTypeDefault; kept for the process's life
          return info[0];
        })();
        const v = out();
        check(createTensorWithData(cpuInfo, p[0], count * ELEMENT[type].bytes, BigInt64Array.from(dims.map(BigInt)), dims.length, ELEMENT[type].onnx, v));
        // The base's view, not a new one (a new ArrayBuffer counts as V8 external memory: see HostTensor.over).
        return { value: v[0], data: baseData.subarray(0, count) };
      },
      wrapOutput(value) {
        const info = out();
        check(typeAndShape(value, info));
        try {
          const t = [0];
          check(elementType(info[0], t));
          const n = [0];
          check(dimsCount(info[0], n));
          const dims = new BigInt64Array(n[0]!);
          check(getDims(info[0], dims, n[0]));
          const type = BY_ONNX.get(t[0]!);
          if (!type) throw new Error(`output element type ${t[0]} is not supported`);
          const shape = Array.from(dims, Number);
          return { type, dims: shape, data: dataOf(value, type, shape.reduce((a, b) => a * b, 1)) };
        } finally {
          releaseInfo(info[0]);
        }
      },
      run(session, inNames, inValues, outNames, outValues, signal) {
        // On a worker thread (koffi's async call), so that the event loop answers probes, new requests
        // and load-shedding 503s while a model runs. Runs stay serialised all the same (run-gate.ts: the
        // guards' per-run accounting assumes no two overlap); an earlier version that let a decoder run
        // overlap the encoders' spread memory across malloc arenas and bursts went 3-43 % over budget.
        if (signal?.aborted) throw new RunInterrupted(signal.reason);
        // Run options only where the run can be stopped: their terminate flag is how a run already on the
        // worker thread is told to end (ONNX Runtime checks it between nodes).
        let options: unknown = null;
        if (signal) {
          const o = out();
          check(createRunOptions(o));
          options = o[0];
        }
        const stop = () => check(setTerminate(options));
        signal?.addEventListener('abort', stop, { once: true });
        return new Promise((resolve, reject) => {
          (runFn as unknown as { async(...args: unknown[]): void }).async(
            session, options, inNames, inValues, inNames.length, outNames, outNames.length, outValues,
            (err: unknown, status: unknown) => {
              signal?.removeEventListener('abort', stop);
              try {
                if (err) throw err;
                try {
                  check(status);
                } catch (e) {
                  // Stopped by the flag (or failing after the abort): the abort is why.
                  if (signal?.aborted) throw new RunInterrupted(signal.reason);
                  throw e;
                }
                resolve();
              } catch (e) {
                reject(e as Error);
              } finally {
                if (options !== null) releaseRunOptions(options);
              }
            },
          );
        });
      },
      registerCpuAllocator(allocator) {
        const info = out();
        check(cpuMemoryInfo(0, 0, info)); // OrtDeviceAllocator, OrtMemTypeDefault; kept for the process's life
        const registered = allocator(info[0]);
        check(registerAllocator(env[0], registered));
        tensorAllocator = registered;
        envAllocator = true;
      },
      releaseValue: (v) => void releaseValue(v),
      releaseSession: (s) => void releaseSession(s),
    };
  } catch (e) {
    unavailable = (e as Error).message;
    api = null;
  }
  return api;
}

/** Registers a CPU allocator with ONNX Runtime's environment (see Api.registerCpuAllocator); throws where the C API cannot be bound. */
export function registerCpuAllocator(allocator: (info: unknown) => unknown): void {
  const a = bind();
  if (!a) throw new Error(`onnxruntime C API unavailable: ${unavailable}`);
  a.registerCpuAllocator(allocator);
}

/** Why ragguard's custom ops (RAGGUARD_OPS_LIBRARY) cannot run in this process ('' when they can). */
export function ragguardOpsUnavailable(): string {
  if (!bind()) return `ONNX Runtime's C API is not bound here (${unavailable})`;
  if (!opsUsable) return "this ONNX Runtime's API table is not the one the ops library was written against";
  if (!existsSync(RAGGUARD_OPS_LIBRARY)) return `${path.relative(process.cwd(), RAGGUARD_OPS_LIBRARY)} is not built (npm run setup builds it)`;
  return '';
}

/** Why direct sessions cannot be used here ('' when they can). */
export function directUnavailable(): string {
  bind();
  return unavailable;
}
