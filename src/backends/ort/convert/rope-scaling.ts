/**
 * Rotary scaling from a transformers config.json, as the genai builder's cos/sin tables can hold it
 * (gqa-builder.ts GqaOptions.rotary): `rope_scaling` (transformers 4: `rope_type` or the older
 * `type`) or `rope_parameters` (transformers 5, which also carries rope_theta).
 *
 *   default  nothing to do
 *   linear   positions divided by `factor`
 *   llama3   each inverse frequency divided by its own factor (transformers' _compute_llama3_parameters:
 *            long wavelengths by `factor`, short ones kept, those between interpolated)
 * Anything else (dynamic, yarn, longrope, ...) changes attention in ways a fixed table does not hold
 * (position-dependent frequencies, attention scaling) and is refused by name: converting without it
 * would make another model.
 */

type RopeConfig = Record<string, unknown>;

/** Rotary scaling as the cos/sin tables hold it: positions divided by linearFactor, each inverse frequency by its freqFactor. */
export interface RotaryScaling {
  linearFactor?: number;
  freqFactors?: Float32Array;
}

export interface RotaryFromConfig {
  theta: number | undefined;
  rotary: RotaryScaling;
}

function num(c: RopeConfig, key: string, where: string): number {
  const v = c[key];
  if (typeof v !== 'number' || !Number.isFinite(v)) throw new Error(`${where}.${key} is missing or not a number`);
  return v;
}

export function rotaryFromConfig(cfg: { rope_theta?: number; rope_scaling?: unknown; rope_parameters?: unknown }, headDim: number): RotaryFromConfig {
  const params = cfg.rope_parameters as RopeConfig | null | undefined;
  const scaling = cfg.rope_scaling as RopeConfig | null | undefined;
  const [where, c] = params ? ['rope_parameters', params] as const : ['rope_scaling', scaling] as const;
  const theta = typeof params?.['rope_theta'] === 'number' ? params['rope_theta'] as number : cfg.rope_theta;
  if (!c) return { theta, rotary: {} };
  const type = (c['rope_type'] ?? c['type'] ?? 'default') as string;
  if (type === 'default') return { theta, rotary: {} };
  if (type === 'linear') return { theta, rotary: { linearFactor: num(c, 'factor', where) } };
  if (type === 'llama3') {
    const factor = num(c, 'factor', where);
    const low = num(c, 'low_freq_factor', where);
    const high = num(c, 'high_freq_factor', where);
    const old = num(c, 'original_max_position_embeddings', where);
    const base = theta ?? 10000;
    const lowWavelen = old / low;
    const highWavelen = old / high;
    const freqFactors = Float32Array.from({ length: headDim / 2 }, (_, i) => {
      const inv = 1 / base ** ((2 * i) / headDim);
      const wavelen = (2 * Math.PI) / inv;
      if (wavelen < highWavelen) return 1;
      if (wavelen > lowWavelen) return factor;
      const smooth = (old / wavelen - low) / (high - low);
      return 1 / ((1 - smooth) / factor + smooth);
    });
    return { theta, rotary: { freqFactors } };
  }
  throw new Error(`${where} of type '${type}' is not supported (default, linear and llama3 are): converting without it would make another model`);
}
