/**
 * The start-up profile run (vLLM's profile_run, on the host): runs each stage's model at the shapes
 * the configuration allows, measures each run's peak resident bytes (peak-meter.ts), and calibrates
 * the memory model per stage by a line through the points (measured = scale x analytic + offset).
 * The analytic model gives the shape of the curve from the configs; the profile pins its scale, and
 * the fixed cost of a run, on this runtime and this machine.
 *
 * Each measured run is the first of its shape, after a warm-up run one token shorter: serving rarely
 * repeats a shape (prompt lengths vary, every decode step is one token wider), and a runtime that has
 * planned a shape before allocates it differently. Each shape is measured REPEATS times, a few tokens
 * apart, and the fit runs through all of them, which evens out the allocator's run-to-run scatter. Peaks are host memory: with models on a GPU they are not measurable per run, and the
 * analytic figures are kept (the report says so).
 */
import type { Calibration, MemoryModel, Stage, StageFit } from './memory-model.js';
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
  shape: [number, number, number];
  analytic_bytes: number;
  measured_bytes: number;
}

export type ProfileReport =
  | { source: 'profile'; calibration: Calibration; points: ProfilePoint[]; ms: number }
  | { source: 'analytic'; reason: string };

const REPEATS = 3;

/** n / 2^k, at least 2 * REPEATS (each repeat and its warm-up run are shorter by a token or two). */
const part = (n: number, k: number) => Math.max(2 * REPEATS, Math.floor(n / 2 ** k));

/** Shapes per stage: the largest allowed, and smaller ones along each dimension. */
function shapes(l: ProfileLimits): { stage: Stage; shape: [number, number, number] }[] {
  const q = (stage: Stage, shape: [number, number, number]) => ({ stage, shape });
  return [
    q('embed', [1, l.queryTokens, 0]), q('embed', [1, part(l.queryTokens, 1), 0]), q('embed', [1, part(l.queryTokens, 2), 0]),
    q('rerank', [l.rerankPairs, l.pairTokens, 0]), q('rerank', [l.rerankPairs, part(l.pairTokens, 1), 0]),
    q('rerank', [part(l.rerankPairs, 2), l.pairTokens, 0]), q('rerank', [part(l.rerankPairs, 2), part(l.pairTokens, 2), 0]),
    q('prefill', [1, l.promptTokens, 0]), q('prefill', [1, part(l.promptTokens, 1), 0]), q('prefill', [1, part(l.promptTokens, 2), 0]),
    q('prefill', [1, part(l.promptTokens, 3), 0]),
    q('decode', [l.decodeRows, 1, l.contextTokens - 1]), q('decode', [part(l.decodeRows, 2), 1, l.contextTokens - 1]),
    q('decode', [l.decodeRows, 1, part(l.contextTokens, 1)]), q('decode', [part(l.decodeRows, 3), 1, part(l.contextTokens, 2)]),
  ];
}

function analytic(model: MemoryModel, stage: Stage, [b, s, c]: [number, number, number]): number {
  return stage === 'embed' || stage === 'rerank' ? model.encoderWorkspace(b, s) : model.decoderWorkspace(b, s, c);
}

/**
 * Least-squares line measured = scale x analytic + offset (absolute errors: large shapes, which decide
 * admission, weigh most). A negative offset would predict less than nothing for small runs: then the
 * line goes through the origin. Without usable points the analytic figures stand.
 */
export function fitStage(points: readonly { analytic_bytes: number; measured_bytes: number }[]): StageFit {
  const n = points.length;
  const sx = points.reduce((s, p) => s + p.analytic_bytes, 0);
  const sy = points.reduce((s, p) => s + p.measured_bytes, 0);
  const sxx = points.reduce((s, p) => s + p.analytic_bytes ** 2, 0);
  const sxy = points.reduce((s, p) => s + p.analytic_bytes * p.measured_bytes, 0);
  const det = n * sxx - sx * sx;
  if (n >= 2 && det > 0) {
    const scale = (n * sxy - sx * sy) / det;
    const offsetBytes = (sy - scale * sx) / n;
    if (scale > 0 && offsetBytes >= 0) return { scale, offsetBytes: Math.round(offsetBytes) };
  }
  return sxx > 0 && sxy > 0 ? { scale: sxy / sxx, offsetBytes: 0 } : { scale: 1, offsetBytes: 0 };
}

export async function profileMemory(model: MemoryModel, run: StageRunners, limits: ProfileLimits, meter: PeakMeter): Promise<ProfileReport> {
  if (!meter.available) return { source: 'analytic', reason: meter.reason ?? 'no peak meter' };
  const t0 = performance.now();
  const points: ProfilePoint[] = [];
  for (const { stage, shape: [b, s, c] } of shapes(limits)) {
    // Shorter by d tokens: fewer tokens fed, or for a decode step a shorter context.
    const at = (d: number): [number, number, number] => (stage === 'decode' ? [b, s, c - d] : [b, s - d, c]);
    const once = ([rb, rs, rc]: [number, number, number]) =>
      stage === 'embed' ? run.embed(rb, rs) : stage === 'rerank' ? run.rerank(rb, rs) : run.decoder(rb, rs, rc);
    for (let k = 0; k < REPEATS; k++) {
      const shape = at(2 * k);
      await once(at(2 * k + 1));
      const { bytes } = await measurePeak(meter, () => once(shape));
      points.push({ stage, shape, analytic_bytes: analytic(model, stage, shape), measured_bytes: bytes });
    }
  }
  const calibration = Object.fromEntries(STAGES.map((st) => [st, fitStage(points.filter((p) => p.stage === st))])) as Calibration;
  return { source: 'profile', calibration, points, ms: Math.round(performance.now() - t0) };
}
