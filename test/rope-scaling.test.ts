/**
 * Rotary scaling from config.json (rope_scaling, rope_parameters) into the genai builder's cos/sin
 * tables: linear and llama3 held, the rest refused by name instead of converted into another model.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { buildGqaDecoder, type GqaSourceConfig } from '../src/backends/ort/convert/gqa-builder.js';
import { rotaryFromConfig } from '../src/backends/ort/convert/rope-scaling.js';

const base: GqaSourceConfig = {
  vocab_size: 8, hidden_size: 8, intermediate_size: 8, num_hidden_layers: 1, num_attention_heads: 1, head_dim: 8, rope_theta: 10000, max_position_embeddings: 16,
};

function cosTable(cfg: GqaSourceConfig): Float32Array {
  const seen: Float32Array[] = [];
  buildGqaDecoderTables(cfg, seen);
  return seen[0]!;
}

/** The cos table the builder writes, caught from a source that fails only after the tables. */
function buildGqaDecoderTables(cfg: GqaSourceConfig, out: Float32Array[]): void {
  const one = new Float32Array(64).fill(1);
  const weights = { floats: (name: string) => (name.endsWith('.bias') ? undefined : name.endsWith('norm.weight') ? one.subarray(0, 8) : name.includes('embed') ? one : new Float32Array(64).fill(0.1)) };
  const g = buildGqaDecoder(cfg, weights, { lora: false });
  const t = g.initializers.find((i) => i.name === 'cos_cache')!;
  out.push(new Float32Array(t.data.buffer, t.data.byteOffset, t.data.length / 4));
}

test('linear scaling divides positions by its factor', () => {
  const plain = cosTable(base);
  const scaled = cosTable({ ...base, rope_scaling: { rope_type: 'linear', factor: 2 } });
  // Position 2p scaled is position p plain (4 frequencies a row).
  for (let p = 0; p < 8; p++) for (let i = 0; i < 4; i++) assert.ok(Math.abs(scaled[2 * p * 4 + i]! - plain[p * 4 + i]!) < 1e-6);
  assert.notDeepEqual([...scaled.subarray(4, 8)], [...plain.subarray(4, 8)]);
});

test("llama3 scaling: long wavelengths by the factor, short ones kept, between interpolated (Llama 3.1's parameters)", () => {
  const { rotary, theta } = rotaryFromConfig({ rope_theta: 500000, rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192 } }, 128);
  assert.equal(theta, 500000);
  const f = rotary.freqFactors!;
  assert.equal(f.length, 64);
  assert.equal(f[0], 1);
  assert.equal(f[63], 8);
  for (let i = 1; i < 64; i++) assert.ok(f[i]! >= f[i - 1]!, 'factors grow with the wavelength');
  assert.ok(f.some((x) => x > 1 && x < 8), 'some frequencies are interpolated');
});

test('rope_parameters (transformers 5) carry rope_theta; unsupported types are refused by name', () => {
  assert.equal(rotaryFromConfig({ rope_theta: 1, rope_parameters: { rope_type: 'default', rope_theta: 1e6 } }, 64).theta, 1e6);
  for (const type of ['yarn', 'dynamic', 'longrope']) {
    assert.throws(() => rotaryFromConfig({ rope_scaling: { rope_type: type, factor: 4 } }, 64), new RegExp(`rope_scaling of type '${type}' is not supported`));
    assert.throws(() => buildGqaDecoder({ ...base, rope_parameters: { rope_type: type, factor: 4, rope_theta: 1e4 } }, new Map(), {}), new RegExp(`rope_parameters of type '${type}'`));
  }
  assert.throws(() => rotaryFromConfig({ rope_scaling: { type: 'linear' } }, 64), /rope_scaling\.factor is missing/);
});
