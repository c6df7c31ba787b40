/** The switches of ragguard's custom-op library (RAGGUARD_OPS_LIBRARY: QMatMul8, QMatMul4), asked of the library itself. */
import koffi from 'koffi';
import { RAGGUARD_OPS_LIBRARY, ragguardOpsUnavailable } from './ort-c-api.js';

/** The ops library's own switches, bound once (the same path ONNX Runtime loads: one copy in the process). */
let opsSwitches: {
  vnni: () => number; setPortable: (on: number) => void; amx: () => number; setAmx: (on: number) => void;
  amxBf16: () => number; setAmxBf16: (on: number) => void;
} | undefined;
function ragguardOps(): NonNullable<typeof opsSwitches> {
  if (!opsSwitches) {
    const lib = koffi.load(RAGGUARD_OPS_LIBRARY);
    opsSwitches = {
      vnni: lib.func('int ragguard_ops_vnni()') as () => number,
      setPortable: lib.func('void ragguard_ops_set_portable(int on)') as (on: number) => void,
      amx: lib.func('int ragguard_ops_amx()') as () => number,
      setAmx: lib.func('void ragguard_ops_set_amx(int on)') as (on: number) => void,
      amxBf16: lib.func('int ragguard_ops_amx_bf16()') as () => number,
      setAmxBf16: lib.func('void ragguard_ops_set_amx_bf16(int on)') as (on: number) => void,
    };
  }
  return opsSwitches;
}

/** The library's switches where its ops can run here; otherwise the reason they cannot, thrown (what every setter checks first). */
function usableOps(): NonNullable<typeof opsSwitches> {
  const why = ragguardOpsUnavailable();
  if (why) throw new Error(`ragguard's ops cannot run here: ${why}`);
  return ragguardOps();
}

/**
 * Whether ragguard's ops run their AVX512-VNNI kernels on this CPU (false: their plain C path, correct
 * but many times slower than ONNX Runtime's own MatMulNBits). Asked of the library each time: a test
 * may switch it to the plain C path. False where the ops cannot run at all.
 */
export function ragguardOpsVnni(): boolean {
  return !ragguardOpsUnavailable() && ragguardOps().vnni() === 1;
}

/**
 * Sends ragguard's ops down their plain C path whatever the CPU (true), or back to its best (false):
 * what a CPU without AVX512-VNNI runs, for tests on one that has it.
 */
export function setRagguardOpsPortable(on: boolean): void {
  usableOps().setPortable(on ? 1 : 0);
}

/**
 * Whether ragguard's ops run products of 16 rows or more (prefills) on AMX (TDPBSUD) here: the CPU has
 * AMX-INT8, Linux grants the process the tile state, RAGGUARD_OPS_AMX is not 0 and neither
 * setRagguardOpsAmx(false) nor setRagguardOpsPortable(true) is in force. Their outputs are the AVX512-VNNI
 * kernels' bit for bit.
 */
export function ragguardOpsAmx(): boolean {
  return !ragguardOpsUnavailable() && ragguardOps().amx() === 1;
}

/** Keeps ragguard's ops on their AVX512-VNNI kernels at every row count (false), or lets prefills use AMX again (true): for tests. */
export function setRagguardOpsAmx(on: boolean): void {
  usableOps().setAmx(on ? 1 : 0);
}

/**
 * Whether ragguard's ops run prefills (128 rows or more, K a multiple of 32) on AMX in bfloat16
 * (TDPBF16PS: qmatmul-bf16.c) here: AMX runs (ragguardOpsAmx), the CPU has AMX-BF16 and AVX512-BF16,
 * RAGGUARD_OPS_AMX_BF16 is not 0 and setRagguardOpsAmxBf16(false) is not in force. Their outputs are
 * not the int8 kernels' bit for bit: x and the dequantized weights are rounded to bfloat16, the sums
 * kept in floats.
 */
export function ragguardOpsAmxBf16(): boolean {
  return !ragguardOpsUnavailable() && ragguardOps().amxBf16() === 1;
}

/** Keeps ragguard's ops on their int8 paths at every row count (false), or lets prefills use AMX-BF16 again (true): for tests. */
export function setRagguardOpsAmxBf16(on: boolean): void {
  usableOps().setAmxBf16(on ? 1 : 0);
}
