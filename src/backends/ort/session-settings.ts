/** The intra-op threads of each direct session made from now on (ort-direct.ts): how many, and how they wait for work. */

/** Intra-op threads of each session made from now on (0: ONNX Runtime's default). */
let intraOpThreads = 0;

/**
 * Whether a direct session's intra-op threads wait for work by spinning or by sleeping: 'off', they
 * sleep; 'runs', they spin, but only while a run is going (ONNX Runtime's allow_spinning with
 * force_spinning_stop: at the end of each run they stop and sleep until the next).
 */
export type IntraOpSpin = 'off' | 'runs';
let intraOpSpin: IntraOpSpin = 'off';

/**
 * Threads each direct session made after this call computes with, the calling one included (0: ONNX
 * Runtime's default, one per physical core). Fewer leave cores to the event loop while a model runs,
 * at the cost of each run's speed (RAGGUARD_INTRA_OP_THREADS).
 */
export function setIntraOpThreads(n: number): void {
  if (!Number.isInteger(n) || n < 0) throw new RangeError(`intra-op threads must be an integer >= 0, got ${n}`);
  intraOpThreads = n;
}

/** How the intra-op threads of each direct session made after this call wait for work (RAGGUARD_INTRA_OP_SPIN). */
export function setIntraOpSpin(mode: IntraOpSpin): void {
  if (mode !== 'off' && mode !== 'runs') throw new RangeError(`intra-op spinning must be 'off' or 'runs', got '${String(mode)}'`);
  intraOpSpin = mode;
}

/** What each direct session made after applySessionSettings takes (RAGGUARD_INTRA_OP_THREADS, RAGGUARD_INTRA_OP_SPIN). */
export interface SessionSettings {
  intraOpThreads: number;
  intraOpSpin: IntraOpSpin;
}

/** Both session settings at once: the server's, and a benchmark's that runs models as the server does. */
export function applySessionSettings(s: SessionSettings): void {
  setIntraOpThreads(s.intraOpThreads);
  setIntraOpSpin(s.intraOpSpin);
}

/** The settings a direct session made now takes where its options give none (ort-c-api.ts). */
export function intraOpDefaults(): { threads: number; spin: IntraOpSpin } {
  return { threads: intraOpThreads, spin: intraOpSpin };
}
