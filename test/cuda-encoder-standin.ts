/**
 * A stand-in for the CUDA encoder library (encoder-binding.ts's EncoderNative) on machines without a GPU:
 * it keeps the uploaded tensors and runs the forward pass encoder.cu runs, in float32 in JavaScript,
 * from them (word + position + type embeddings and LayerNorm; per layer attention over each sequence's
 * own tokens, LayerNorm, GELU feed-forward, LayerNorm; pooling and L2 norm, or the classifier and pair
 * heads). So the runner's weight mapping, uploads, batching and accounting run on the CPU against ONNX
 * Runtime's outputs for the same model (scripts/check-cuda-encoders.ts checks the device). Its plan is
 * encoder-plan.ts's, as the real library's must be.
 */
import type { EncoderHandle, EncoderNative, EncoderNativeConfig, EncoderNativeMemory } from '../src/backends/cuda/encoder-binding.js';
import { EncoderTensor, HEADS, planEncoder, POOLINGS, type EncoderShape } from '../src/backends/cuda/encoder-plan.js';

interface Engine {
  cfg: EncoderNativeConfig;
  tensors: Map<string, Float32Array>;
  done: boolean;
}

export interface EncoderStandIn extends EncoderNative {
  /** Each run's [rows, width]. */
  readonly runs: [number, number][];
  /** Engines created and not destroyed. */
  live: number;
  /** Uploads made (kind, layer, elements). */
  readonly uploads: { kind: number; layer: number; count: number }[];
}

const key = (kind: number, layer: number) => `${kind}:${layer}`;

function shapeOf(c: EncoderNativeConfig): EncoderShape {
  return {
    numLayers: c.num_layers, hidden: c.hidden, numHeads: c.num_heads, intermediate: c.intermediate, vocab: c.vocab, maxPositions: c.max_positions,
    typeVocab: c.type_vocab, numLabels: c.num_labels, head: HEADS[c.head]!, pooling: POOLINGS[c.pooling] ?? 'mean', normalize: c.normalize === 1,
    act: c.act === 0 ? 'gelu' : 'gelu_tanh', lnEps: c.ln_eps,
  };
}

/** y[t][o] = b[o] + sum_i x[t][i] W[o][i]. */
function linear(x: Float32Array, T: number, inDim: number, w: Float32Array, b: Float32Array, outDim: number): Float32Array {
  const y = new Float32Array(T * outDim);
  for (let t = 0; t < T; t++) {
    for (let o = 0; o < outDim; o++) {
      let s = b[o]!;
      const wo = o * inDim, xt = t * inDim;
      for (let i = 0; i < inDim; i++) s += x[xt + i]! * w[wo + i]!;
      y[t * outDim + o] = s;
    }
  }
  return y;
}

function layerNorm(v: Float32Array, T: number, H: number, g: Float32Array, b: Float32Array, eps: number): void {
  for (let t = 0; t < T; t++) {
    let mean = 0;
    for (let c = 0; c < H; c++) mean += v[t * H + c]!;
    mean /= H;
    let q = 0;
    for (let c = 0; c < H; c++) q += (v[t * H + c]! - mean) ** 2;
    const rstd = 1 / Math.sqrt(q / H + eps);
    for (let c = 0; c < H; c++) v[t * H + c] = (v[t * H + c]! - mean) * rstd * g[c]! + b[c]!;
  }
}

function erf(x: number): number {
  // Abramowitz-Stegun 7.1.26 is too coarse for a reference: a series / continued fraction pair instead.
  const ax = Math.abs(x);
  if (ax < 2.5) {
    let sum = ax, term = ax;
    for (let n = 1; n < 60; n++) {
      term *= -ax * ax / n;
      sum += term / (2 * n + 1);
    }
    return Math.sign(x) * sum * 2 / Math.sqrt(Math.PI);
  }
  // erfc by Lentz's continued fraction.
  let f = ax, c = ax, d = 0;
  for (let n = 1; n < 60; n++) {
    const a = n / 2;
    d = ax + a * d;
    d = 1 / d;
    c = ax + a / c;
    const delta = c * d;
    f *= delta;
  }
  const erfc = Math.exp(-ax * ax) / (f * Math.sqrt(Math.PI));
  return Math.sign(x) * (1 - erfc);
}

/** The forward pass of encoder.cu over one padded run, in float32: rows x the head's width. */
export function standInForward(shape: EncoderShape, t: (kind: EncoderTensor, layer?: number) => Float32Array,
  ids: Int32Array, types: Int32Array, lens: Int32Array, rows: number, width: number): Float32Array {
  const { hidden: H, intermediate: I, numHeads: heads } = shape;
  const D = H / heads, T = rows * width;
  const x = new Float32Array(T * H);
  const word = t(EncoderTensor.Word), pos = t(EncoderTensor.Position), typ = t(EncoderTensor.TokenType);
  for (let r = 0; r < T; r++) {
    const id = ids[r]!, tt = types[r]!, p = r % width;
    for (let c = 0; c < H; c++) x[r * H + c] = word[id * H + c]! + pos[p * H + c]! + typ[tt * H + c]!;
  }
  layerNorm(x, T, H, t(EncoderTensor.EmbNormWeight), t(EncoderTensor.EmbNormBias), shape.lnEps);
  for (let l = 0; l < shape.numLayers; l++) {
    const q = linear(x, T, H, t(EncoderTensor.QueryWeight, l), t(EncoderTensor.QueryBias, l), H);
    const k = linear(x, T, H, t(EncoderTensor.KeyWeight, l), t(EncoderTensor.KeyBias, l), H);
    const v = linear(x, T, H, t(EncoderTensor.ValueWeight, l), t(EncoderTensor.ValueBias, l), H);
    const ctx = new Float32Array(T * H);
    const scale = 1 / Math.sqrt(D);
    const s = new Float64Array(width);
    for (let b = 0; b < rows; b++) {
      const len = lens[b]!;
      for (let h = 0; h < heads; h++) {
        for (let qi = 0; qi < width; qi++) {
          const qr = (b * width + qi) * H + h * D;
          let m = -Infinity;
          for (let j = 0; j < len; j++) {
            const kr = (b * width + j) * H + h * D;
            let dot = 0;
            for (let d = 0; d < D; d++) dot += q[qr + d]! * k[kr + d]!;
            s[j] = dot * scale;
            m = Math.max(m, s[j]!);
          }
          let sum = 0;
          for (let j = 0; j < len; j++) sum += (s[j] = Math.exp(s[j]! - m));
          for (let j = 0; j < len; j++) {
            const vr = (b * width + j) * H + h * D, p = s[j]! / sum;
            for (let d = 0; d < D; d++) ctx[qr + d]! += p * v[vr + d]!;
          }
        }
      }
    }
    const a = linear(ctx, T, H, t(EncoderTensor.AttnOutWeight, l), t(EncoderTensor.AttnOutBias, l), H);
    for (let i = 0; i < a.length; i++) a[i]! += x[i]!;
    layerNorm(a, T, H, t(EncoderTensor.AttnNormWeight, l), t(EncoderTensor.AttnNormBias, l), shape.lnEps);
    const f = linear(a, T, H, t(EncoderTensor.InterWeight, l), t(EncoderTensor.InterBias, l), I);
    for (let i = 0; i < f.length; i++) {
      const z = f[i]!;
      f[i] = shape.act === 'gelu' ? 0.5 * z * (1 + erf(z / Math.SQRT2)) : 0.5 * z * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (z + 0.044715 * z ** 3)));
    }
    const o = linear(f, T, I, t(EncoderTensor.OutWeight, l), t(EncoderTensor.OutBias, l), H);
    for (let i = 0; i < o.length; i++) o[i]! += a[i]!;
    layerNorm(o, T, H, t(EncoderTensor.OutNormWeight, l), t(EncoderTensor.OutNormBias, l), shape.lnEps);
    x.set(o);
  }
  const row = (b: number, tok: number) => x.subarray((b * width + tok) * H, (b * width + tok + 1) * H);
  if (shape.head === 'embedding') {
    const out = new Float32Array(rows * H);
    for (let b = 0; b < rows; b++) {
      const len = lens[b]!, v = out.subarray(b * H, (b + 1) * H);
      if (shape.pooling === 'cls') v.set(row(b, 0));
      else if (shape.pooling === 'lasttoken') v.set(row(b, len - 1));
      else if (shape.pooling === 'max') {
        v.fill(-Infinity);
        for (let tok = 0; tok < len; tok++) row(b, tok).forEach((z, c) => (v[c] = Math.max(v[c]!, z)));
      } else {
        for (let tok = 0; tok < len; tok++) row(b, tok).forEach((z, c) => (v[c]! += z));
        const div = shape.pooling === 'mean' ? len : Math.sqrt(len);
        for (let c = 0; c < H; c++) v[c]! /= div;
      }
      if (shape.normalize) {
        const n = Math.max(Math.hypot(...v), 1e-12);
        for (let c = 0; c < H; c++) v[c]! /= n;
      }
    }
    return out;
  }
  const L = shape.numLabels;
  const out = new Float32Array(rows * L);
  for (let b = 0; b < rows; b++) {
    const pooled = linear(row(b, 0), 1, H, t(EncoderTensor.PoolerWeight), t(EncoderTensor.PoolerBias), H).map(Math.tanh);
    const logits = linear(pooled, 1, H, t(EncoderTensor.ClassifierWeight), t(EncoderTensor.ClassifierBias), L);
    if (shape.head === 'pair') {
      const len = lens[b]!;
      const sa = new Float32Array(H), sb = new Float32Array(H);
      let na = 0, nb = 0;
      for (let tok = 0; tok < len; tok++) {
        const into = types[b * width + tok] === 0 ? (na++, sa) : (nb++, sb);
        row(b, tok).forEach((z, c) => (into[c]! += z));
      }
      for (let c = 0; c < H; c++) {
        sa[c]! /= Math.max(na, 1);
        sb[c]! /= Math.max(nb, 1);
      }
      let dot = 0;
      for (let c = 0; c < H; c++) dot += sa[c]! * sb[c]!;
      logits[0]! += t(EncoderTensor.Scale)[0]! * dot / (Math.max(Math.hypot(...sa), 1e-12) * Math.max(Math.hypot(...sb), 1e-12));
    }
    out.set(logits, b * L);
  }
  return out;
}

export function standInEncoder(): EncoderStandIn {
  const engines = new Map<EncoderHandle, Engine>();
  const plan = (cfg: EncoderNativeConfig) => planEncoder(shapeOf(cfg), { maxRows: cfg.max_rows, maxTokens: cfg.max_tokens, cublasWorkspaceBytes: cfg.cublas_workspace_bytes });
  const engine = (h: EncoderHandle) => {
    const e = engines.get(h);
    if (!e) throw new Error('no such encoder engine');
    return e;
  };
  const s: EncoderStandIn = {
    runs: [],
    uploads: [],
    live: 0,
    deviceCount: () => 1,
    plan: (cfg) => {
      const p = plan(cfg);
      return [p.weights, p.activations, p.cublasWorkspace, p.hostPinned, p.total];
    },
    create: (cfg) => {
      const h = {} as EncoderHandle;
      engines.set(h, { cfg, tensors: new Map(), done: false });
      s.live++;
      return h;
    },
    destroy: (h) => {
      if (engines.delete(h)) s.live--;
    },
    upload: (h, kind, layer, data) => {
      engine(h).tensors.set(key(kind, layer), data.slice());
      s.uploads.push({ kind, layer, count: data.length });
    },
    loadDone: (h) => {
      engine(h).done = true;
    },
    run: (h, ids, types, lens, rows, width, out) => new Promise((resolve, reject) => setImmediate(() => {
      try {
        const e = engine(h);
        if (!e.done) throw new Error('run before every weight was loaded');
        if (rows > e.cfg.max_rows || rows * width > e.cfg.max_tokens) throw new Error(`run of ${rows} x ${width} outside the limits`);
        s.runs.push([rows, width]);
        const get = (kind: EncoderTensor, layer = 0) => {
          const v = e.tensors.get(key(kind, layer));
          if (!v) throw new Error(`tensor ${EncoderTensor[kind]} of layer ${layer} was not uploaded`);
          return v;
        };
        out.set(standInForward(shapeOf(e.cfg), get, ids, types, lens, rows, width));
        resolve();
      } catch (err) {
        reject(err as Error);
      }
    })),
    memory: (h): EncoderNativeMemory => {
      const p = plan(engine(h).cfg);
      return { weights: p.weights, activations: p.activations, cublas_workspace: p.cublasWorkspace, host_pinned: p.hostPinned, total: p.total, device_free: 100e9, device_total: 141e9 };
    },
  };
  return s;
}
