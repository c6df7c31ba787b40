/**
 * The start-up profile run (vLLM's profile_run): runs each stage's model at the shapes the
 * configuration allows, measures each run's peak (peak-meter.ts: the host's resident memory, or NVML's
 * device memory where the models run on a GPU), and calibrates
 * the memory model per stage by a line through the points: measured = scale x analytic + offset. The
 * analytic model gives the shape of the curve from the configs; the profile pins its scale, and the
 * fixed cost of a run, on this runtime and this machine.
 *
 * Each measured run is the first of its shape, after a warm-up run one token shorter: serving rarely
 * repeats a shape (prompt lengths vary, every decode step is one token wider), and a runtime that has
 * planned a shape before allocates it differently. Each shape is measured REPEATS times, a few tokens
 * apart, and the fit runs through all of them, which evens out the allocator's run-to-run scatter. A
 * meter that does not see the runs at all leaves the analytic figures (the report says so).
 */
import type { Calibration, MemoryModel, RunShape, Stage, StageFit } from './memory-model.js';
import { STAGES } from './memory-model.js';
import { measurePeak, type PeakMeter } from './peak-meter.js';

/** Runs one model at a shape, with dummy inputs. */
export interface StageRunners {
  embed(batch: number, tokens: number): Promise<void>;
  rerank(pairs: number, tokens: number): Promise<void>;
  decoder(rows: number, newTokens: number, context: number): Promise<void>;
}

/** The largest shapes requests can take, from the configuration. */
export interface ProfileLimits {
  queryTokens: number;
  rerankPairs: number;
  pairTokens: number;
  promptTokens: number;
  /** Longest context of a decode step: prompt plus new tokens. */
  contextTokens: number;
  decodeRows: number;
}

export interface ProfilePoint {
  stage: Stage;
  /** [batch or rows, tokens fed, context] */
  shape: RunShape;
  analytic_bytes: number;
  measured_bytes: number;
}

export type ProfileReport =
  | {
    source: 'profile'; calibration: Calibration; headroom: number; points: ProfilePoint[]; ms: number;
    /** Stages the meter did not see (their analytic figures stand), each with why. */
    analytic_stages?: Partial<Record<Stage, string>>;
    /** Where the calibration cache was consulted (calibration-cache.ts): restored from it, or measured and why. */
    cache?: CacheNote;
  }
  | { source: 'analytic'; reason: string };

/** What the calibration cache did for this start: its file, whether the calibration came from it, and if not why. */
export interface CacheNote {
  file: string;
  restored: boolean;
  /** When the restored calibration was measured. */
  written_at?: string;
  /** Why the profile ran (no file, what changed since, a damaged file). */
  why?: string;
  /** The file was there but unreadable as a calibration: ignored (the log warns). */
  damaged?: boolean;
  /** Why the new calibration could not be stored (the next start profiles again). */
  write_error?: string;
}

const REPEATS = 3;

/** n / 2^k, at least 2 * REPEATS (each repeat and its warm-up run are shorter by a token or two). */
const part = (n: number, k: number) => Math.max(2 * REPEATS, Math.floor(n / 2 ** k));

/** Shapes per stage: the largest allowed, and smaller ones along each dimension. */
function shapes(l: ProfileLimits): { stage: Stage; shape: RunShape }[] {
  const q = (stage: Stage, shape: RunShape) => ({ stage, shape });
  return [
    q('embed', [1, l.queryTokens, 0]), q('embed', [1, part(l.queryTokens, 1), 0]), q('embed', [1, part(l.queryTokens, 2), 0]),
    q('rerank', [l.rerankPairs, l.pairTokens, 0]), q('rerank', [l.rerankPairs, part(l.pairTokens, 1), 0]),
    q('rerank', [part(l.rerankPairs, 2), l.pairTokens, 0]), q('rerank', [part(l.rerankPairs, 2), part(l.pairTokens, 2), 0]),
    q('prefill', [1, l.promptTokens, 0]), q('prefill', [1, part(l.promptTokens, 1), 0]), q('prefill', [1, part(l.promptTokens, 2), 0]),
    q('prefill', [1, part(l.promptTokens, 3), 0]),
    q('decode', [l.decodeRows, 1, l.contextTokens - 1]), q('decode', [part(l.decodeRows, 2), 1, l.contextTokens - 1]),
    q('decode', [l.decodeRows, 1, part(l.contextTokens, 1)]), q('decode', [part(l.decodeRows, 3), 1, part(l.contextTokens, 2)]),
    // A request's own share of a decode step is one row: profile that regime too.
    q('decode', [1, 1, l.contextTokens - 1]), q('decode', [1, 1, part(l.contextTokens, 2)]),
  ];
}

/** Least squares: the coefficients minimising sum (x . k - y)^2, or undefined where the columns are (nearly) dependent. */
function leastSquares(xs: readonly number[][], ys: readonly number[]): number[] | undefined {
  const m = xs[0]?.length ?? 0;
  // Columns scaled to unit size first: they differ by orders of magnitude.
  const norm = Array.from({ length: m }, (_, j) => Math.sqrt(xs.reduce((s, x) => s + x[j]! ** 2, 0)) || 1);
  const a = Array.from({ length: m }, (_, i) => [
    ...Array.from({ length: m }, (_, j) => xs.reduce((s, x) => s + (x[i]! / norm[i]!) * (x[j]! / norm[j]!), 0)),
    xs.reduce((s, x, k) => s + (x[i]! / norm[i]!) * ys[k]!, 0),
  ]);
  for (let c = 0; c < m; c++) { // Gauss-Jordan with partial pivoting
    const p = a.reduce((best, row, r) => (r >= c && Math.abs(row[c]!) > Math.abs(a[best]![c]!) ? r : best), c);
    if (Math.abs(a[p]![c]!) < 1e-9) return undefined;
    [a[c], a[p]] = [a[p]!, a[c]!];
    for (let r = 0; r < m; r++) {
      if (r === c) continue;
      const f = a[r]![c]! / a[c]![c]!;
      for (let k = c; k <= m; k++) a[r]![k]! -= f * a[c]![k]!;
    }
  }
  return a.map((row, i) => row[m]! / row[i]! / norm[i]!);
}

/**
 * Residuals are relative (a run of 50 MB mispredicted by 5 MB is as wrong as one of 200 MB by 20 MB):
 * each point's row is divided by its measured bytes, floored at 16 MiB so that small runs, whose peaks
 * scatter by a large fraction from run to run and on which no admission turns, do not steer the fit.
 */
const weight = (measured: number) => 1 / Math.max(measured, 16 << 20);

/**
 * Fits the stage's points by weighted least squares (relative errors, see weight): one scale for the
 * analytic bytes plus an offset, or through the origin where the offset would be negative; the analytic
 * figures where there are no usable points. (A scale per analytic term was tried: from scattered points
 * it extrapolated badly to the shapes serving runs.)
 */
export function fitStage(points: readonly { analytic_bytes: number; measured_bytes: number }[]): StageFit {
  const w = points.map((p) => weight(p.measured_bytes));
  const ys = points.map((p, i) => p.measured_bytes * w[i]!);
  const xs = points.map((p, i) => p.analytic_bytes * w[i]!);
  const line = points.length >= 2 ? leastSquares(xs.map((x, i) => [x, w[i]!]), ys) : undefined;
  if (line && line[0]! > 0 && line[1]! >= 0) return { scale: line[0]!, offsetBytes: Math.round(line[1]!) };
  const origin = leastSquares(xs.map((x) => [x]), ys);
  return origin && origin[0]! > 0 ? { scale: origin[0]!, offsetBytes: 0 } : { scale: 1, offsetBytes: 0 };
}

/**
 * The analytic model sums the buffers a run holds at once; a runtime may free some sooner, so it can
 * overstate, but a fit below half of it says more about a disturbed measurement than about the runtime,
 * and under-predicting is what overflows: the scale is kept at MIN_SCALE or more.
 */
const MIN_SCALE = 0.5;
/** The identity fit: a stage's analytic figures as they are. */
const ANALYTIC_FIT: StageFit = { scale: 1, offsetBytes: 0 };
export function floorFit(f: StageFit): StageFit {
  return { scale: Math.max(MIN_SCALE, f.scale), offsetBytes: f.offsetBytes };
}

/** Stages whose largest profiled run is smaller than this cannot tell a blind meter from a small run. */
const BLIND_FLOOR_BYTES = 8 << 20;

/** Runs of a few MiB and less (their scatter is in the kilobytes) do not set the headroom. */
const HEADROOM_FLOOR_BYTES = 4 << 20;
const MAX_HEADROOM = 1;

/**
 * The largest relative amount by which a profiled run exceeded its fitted prediction (0 when none did),
 * capped at MAX_HEADROOM: the scatter of one shape's peak from run to run, which the guard reserves on
 * top (RAGGUARD_MIN_HEADROOM is its floor).
 */
export function headroom(points: readonly ProfilePoint[], calibration: Calibration): number {
  let worst = 0;
  for (const p of points) {
    if (p.measured_bytes < HEADROOM_FLOOR_BYTES) continue;
    const f = calibration[p.stage];
    const predicted = f.scale * p.analytic_bytes + f.offsetBytes;
    if (predicted > 0) worst = Math.max(worst, (p.measured_bytes - predicted) / predicted);
  }
  return Math.min(MAX_HEADROOM, worst);
}

/** The model runs of a profile at these limits: each shape once unmeasured, then REPEATS times, each after a warm-up run. */
export function profileRunCount(limits: ProfileLimits): number {
  return shapes(limits).length * (1 + 2 * REPEATS);
}

/**
 * What a profile at these limits runs: each shape with the memory model's analytic bytes for it. Part of
 * the calibration cache's key: it changes with the limits and with anything that changes the model's figures.
 */
export function profilePlan(model: MemoryModel, limits: ProfileLimits): { stage: Stage; shape: RunShape; analytic_bytes: number }[] {
  return shapes(limits).map(({ stage, shape }) => ({ stage, shape, analytic_bytes: model.analytic(stage, shape) }));
}

function runShape(run: StageRunners, stage: Stage, [b, s, c]: RunShape): Promise<void> {
  return stage === 'embed' ? run.embed(b, s) : stage === 'rerank' ? run.rerank(b, s) : run.decoder(b, s, c);
}

/** `onRun(done, of)` hears each model run as it ends (the start-up's progress). */
export async function profileMemory(model: MemoryModel, run: StageRunners, limits: ProfileLimits, meter: PeakMeter,
  onRun?: (done: number, of: number) => void): Promise<ProfileReport> {
  if (!meter.available) return { source: 'analytic', reason: meter.reason ?? 'no peak meter' };
  const t0 = performance.now();
  const points: ProfilePoint[] = [];
  const of = profileRunCount(limits);
  let done = 0;
  const counted = async (stage: Stage, shape: RunShape) => {
    await runShape(run, stage, shape);
    onRun?.(++done, of);
  };
  // A first pass unmeasured: the first runs after start-up (first use of each kernel and buffer size,
  // start-up's leftovers in the heap) scatter far more than later ones.
  for (const { stage, shape } of shapes(limits)) await counted(stage, shape);
  for (const { stage, shape: [b, s, c] } of shapes(limits)) {
    // Shorter by d tokens: fewer tokens fed, or for a decode step a shorter context.
    const at = (d: number): RunShape => (stage === 'decode' ? [b, s, c - d] : [b, s - d, c]);
    for (let k = 0; k < REPEATS; k++) {
      const shape = at(2 * k);
      await counted(stage, at(2 * k + 1));
      const { bytes } = await measurePeak(meter, () => counted(stage, shape));
      points.push({ stage, shape, analytic_bytes: model.analytic(stage, shape), measured_bytes: bytes });
    }
  }
  // A meter that saw (almost) nothing of a stage's runs that the analytic model puts at megabytes
  // measured the wrong thing (on a GPU: an allocator that suballocates small buffers from device memory
  // it keeps, out of NVML's sight): a fit to it would admit far too much, so that stage keeps its
  // analytic figures, and the stages the meter does see are calibrated.
  // (Stages whose runs are all small cannot tell; they are fitted, and count as seen only with others.)
  const blind: Partial<Record<Stage, string>> = {};
  let judged = 0;
  for (const st of STAGES) {
    const own = points.filter((p) => p.stage === st);
    const big = own.length > 0 ? own.reduce((a, b) => (b.analytic_bytes > a.analytic_bytes ? b : a)) : undefined;
    if (!big || big.analytic_bytes < BLIND_FLOOR_BYTES) continue;
    judged++;
    if (big.measured_bytes < 0.1 * big.analytic_bytes) {
      blind[st] = `the meter saw ${big.measured_bytes} bytes for a ${st} run of ${Math.round(big.analytic_bytes)} analytic bytes: it does not see these runs`;
    }
  }
  const unseen = Object.keys(blind).length;
  if (judged > 0 && unseen === judged) return { source: 'analytic', reason: Object.values(blind).join('; ') };
  const calibration = Object.fromEntries(STAGES.map((st) =>
    [st, blind[st] !== undefined ? ANALYTIC_FIT : floorFit(fitStage(points.filter((p) => p.stage === st)))])) as Calibration;
  const measured = points.filter((p) => blind[p.stage] === undefined);
  return {
    source: 'profile', calibration, headroom: headroom(measured, calibration), points, ms: Math.round(performance.now() - t0),
    ...(unseen > 0 ? { analytic_stages: blind } : {}),
  };
}
