/**
 * The start-up profile run (vLLM's profile_run, on the host): runs each stage's model at the shapes
 * the configuration allows, measures each run's peak resident bytes (peak-meter.ts), and calibrates
 * the memory model by the ratio of measured to analytic bytes per stage. The analytic model gives the
 * shape of the curve from the configs; the profile pins its scale on this runtime and this machine.
 *
 * Each measured run is the first of its shape, after a warm-up run one token shorter: serving rarely
 * repeats a shape (prompt lengths vary, every decode step is one token wider), and a runtime that has
 * planned a shape before allocates it differently. Peaks are host memory: with models on a GPU they are not measurable per run, and the
 * analytic figures are kept (the report says so).
 */
import type { MemoryModel, Stage, StageScales } from './memory-model.js';
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
  | { source: 'profile'; scales: StageScales; points: ProfilePoint[]; ms: number }
  | { source: 'analytic'; reason: string };

const half = (n: number) => Math.max(1, Math.floor(n / 2));

/** Shapes per stage: the largest allowed, and smaller ones along each dimension. */
function shapes(l: ProfileLimits): { stage: Stage; shape: [number, number, number] }[] {
  const q = (stage: Stage, shape: [number, number, number]) => ({ stage, shape });
  return [
    q('embed', [1, l.queryTokens, 0]), q('embed', [1, half(l.queryTokens), 0]),
    q('rerank', [l.rerankPairs, l.pairTokens, 0]), q('rerank', [l.rerankPairs, half(l.pairTokens), 0]),
    q('rerank', [half(half(l.rerankPairs)), l.pairTokens, 0]),
    q('prefill', [1, l.promptTokens, 0]), q('prefill', [1, half(l.promptTokens), 0]), q('prefill', [1, half(half(l.promptTokens)), 0]),
    q('decode', [l.decodeRows, 1, l.contextTokens - 1]), q('decode', [half(half(l.decodeRows)), 1, l.contextTokens - 1]),
    q('decode', [l.decodeRows, 1, half(l.contextTokens)]),
  ];
}

function analytic(model: MemoryModel, stage: Stage, [b, s, c]: [number, number, number]): number {
  return stage === 'embed' || stage === 'rerank' ? model.encoderWorkspace(b, s) : model.decoderWorkspace(b, s, c);
}

/** Least-squares scale through the origin: minimises sum (k * analytic - measured)^2, so large shapes weigh most. */
export function fitScale(points: readonly { analytic_bytes: number; measured_bytes: number }[]): number {
  const num = points.reduce((s, p) => s + p.analytic_bytes * p.measured_bytes, 0);
  const den = points.reduce((s, p) => s + p.analytic_bytes * p.analytic_bytes, 0);
  return den > 0 && num > 0 ? num / den : 1;
}

export async function profileMemory(model: MemoryModel, run: StageRunners, limits: ProfileLimits, meter: PeakMeter): Promise<ProfileReport> {
  if (!meter.available) return { source: 'analytic', reason: meter.reason ?? 'no peak meter' };
  const t0 = performance.now();
  const points: ProfilePoint[] = [];
  for (const { stage, shape } of shapes(limits)) {
    const [b, s, c] = shape;
    const once = (d: number) => (stage === 'embed' ? run.embed(b, s - d) : stage === 'rerank' ? run.rerank(b, s - d)
      : stage === 'prefill' ? run.decoder(b, s - d, c) : run.decoder(b, s, c - d));
    await once(1);
    const { bytes } = await measurePeak(meter, () => once(0));
    points.push({ stage, shape, analytic_bytes: analytic(model, stage, shape), measured_bytes: bytes });
  }
  const scales = Object.fromEntries(STAGES.map((st) => [st, fitScale(points.filter((p) => p.stage === st))])) as StageScales;
  return { source: 'profile', scales, points, ms: Math.round(performance.now() - t0) };
}
