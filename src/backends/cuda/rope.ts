/**
 * Rotary embedding frequencies from a Hugging Face config, as transformers computes them
 * (modeling_rope_utils): the default table 1 / theta^(2i/d), `linear` scaling (positions divided by
 * the factor) and Llama 3's frequency-dependent scaling. The CUDA kernels take the table as it is, so
 * every scaling the table can express is one function here; any other rope type (dynamic NTK, YaRN,
 * LongRoPE, ...) changes attention in ways the table cannot carry and is refused by name.
 */

/** `rope_scaling` (transformers 4) or `rope_parameters` (transformers 5), as config.json gives them. */
export interface RopeScaling {
  rope_type?: string;
  type?: string;
  factor?: number;
  low_freq_factor?: number;
  high_freq_factor?: number;
  original_max_position_embeddings?: number;
  rope_theta?: number;
}

export class UnsupportedRopeError extends Error {}

/** The rope type a config names ('default' when none). */
export function ropeType(scaling: RopeScaling | null | undefined): string {
  return scaling?.rope_type ?? scaling?.type ?? 'default';
}

/** head_dim / 2 inverse frequencies (float32), with the config's scaling applied. */
export function ropeInvFreq(headDim: number, theta: number, scaling?: RopeScaling | null): Float32Array {
  const half = headDim / 2;
  const inv = new Float32Array(half);
  for (let i = 0; i < half; i++) inv[i] = 1 / Math.pow(theta, (2 * i) / headDim);
  const type = ropeType(scaling);
  if (type === 'default') return inv;
  const factor = scaling?.factor;
  if (typeof factor !== 'number' || !(factor > 0)) throw new UnsupportedRopeError(`rope scaling '${type}' without a positive factor`);
  if (type === 'linear') return inv.map((f) => f / factor);
  if (type === 'llama3') {
    const low = scaling?.low_freq_factor, high = scaling?.high_freq_factor, old = scaling?.original_max_position_embeddings;
    if (typeof low !== 'number' || typeof high !== 'number' || typeof old !== 'number' || !(high > low)) {
      throw new UnsupportedRopeError('llama3 rope scaling needs low_freq_factor < high_freq_factor and original_max_position_embeddings');
    }
    const lowWavelen = old / low, highWavelen = old / high;
    return inv.map((f) => {
      const wavelen = (2 * Math.PI) / f;
      if (wavelen < highWavelen) return f; // high frequencies: unchanged
      if (wavelen > lowWavelen) return f / factor; // low frequencies: scaled as linear
      const smooth = (old / wavelen - low) / (high - low);
      return (1 - smooth) * (f / factor) + smooth * f;
    });
  }
  throw new UnsupportedRopeError(`rope scaling '${type}' is not supported by the CUDA backend (default, linear and llama3 are)`);
}
