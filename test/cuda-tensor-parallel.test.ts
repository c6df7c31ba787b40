/**
 * Tensor parallelism's plan on the CPU (tensor-parallel.ts; the NCCL side runs on a machine of several
 * GPUs): a checkpoint's tensors split over 2 and 4 ranks by the plan's loads (strided pieces for the
 * row-parallel o and down), each rank's products computed on its shard, and the all-reduce stand-in:
 * column-parallel outputs (q|k|v, gate|up) are the full model's rows of the rank's heads and intermediate
 * slice, row-parallel partial sums (o, down) all-reduced are the full products; the refusals; the budget
 * taken from the smallest rank.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { parseConfig, placeTensor, WeightKind, weightElems, type TensorLoad } from '../src/backends/cuda/hf-checkpoint.js';
import { allReduceSum, budgetOverRanks, rankLoads, shardPlan, type RankShard } from '../src/backends/cuda/tensor-parallel.js';

const RAW = { model_type: 'qwen2', vocab_size: 64, hidden_size: 128, intermediate_size: 256, num_hidden_layers: 1, num_attention_heads: 8, num_key_value_heads: 4, head_dim: 32, max_position_embeddings: 64 };
const full = parseConfig(RAW);
const H = 128, D = 32, q = 8 * D, kv = 4 * D, I = 256;

function rng(seed: number) {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32) * 2 - 1;
}

/** The layer's tensors as a safetensors file lays them out (one float32 "file"), and their loads. */
function checkpoint() {
  const r = rng(3);
  const shapes: [string, number][] = [
    ['model.layers.0.self_attn.q_proj.weight', q * H], ['model.layers.0.self_attn.k_proj.weight', kv * H], ['model.layers.0.self_attn.v_proj.weight', kv * H],
    ['model.layers.0.self_attn.q_proj.bias', q], ['model.layers.0.self_attn.k_proj.bias', kv], ['model.layers.0.self_attn.v_proj.bias', kv],
    ['model.layers.0.self_attn.o_proj.weight', H * q], ['model.layers.0.mlp.gate_proj.weight', I * H], ['model.layers.0.mlp.up_proj.weight', I * H],
    ['model.layers.0.mlp.down_proj.weight', H * I], ['model.layers.0.input_layernorm.weight', H],
  ];
  const file = new Float32Array(shapes.reduce((a, [, n]) => a + n, 0)).map(() => r());
  const loads: TensorLoad[] = [];
  let at = 0;
  for (const [name, n] of shapes) {
    const p = placeTensor(full, name)!;
    loads.push({ name, kind: p.kind, layer: p.layer, dstOffset: p.dstOffset, file: 'f', fileOffset: at * 4, count: n, dtype: 'F32' });
    at += n;
  }
  return { file, loads };
}

/** A rank's fused weight of `kind`, assembled from its pieces as the native loader reads them. */
function rankWeight(s: RankShard, kind: number, file: Float32Array, loads: TensorLoad[]): Float32Array {
  const w = new Float32Array(weightElems(s.config, kind as 0));
  for (const t of loads.filter((l) => l.kind === kind)) {
    for (const p of rankLoads(full, s, t)) {
      for (let row = 0; row < p.rows; row++) {
        const src = p.fileOffset / 4 + row * p.fileRowStride;
        w.set(file.subarray(src, src + p.elems), p.dstOffset + row * p.elems);
      }
    }
  }
  return w;
}

/** The full model's fused weight of `kind` (tp 1). */
const fullWeight = (kind: number, file: Float32Array, loads: TensorLoad[]) => rankWeight(shardPlan(full, 1).ranks[0]!, kind, file, loads);

function matvec(w: Float32Array, x: Float32Array, n: number): Float32Array {
  const k = x.length, y = new Float32Array(n);
  for (let i = 0; i < n; i++) { let s = 0; for (let j = 0; j < k; j++) s += w[i * k + j]! * x[j]!; y[i] = s; }
  return y;
}

const close = (a: Float32Array, b: Float32Array, what: string) => {
  assert.equal(a.length, b.length, what);
  for (let i = 0; i < a.length; i++) assert.ok(Math.abs(a[i]! - b[i]!) <= 1e-4 * (1 + Math.abs(b[i]!)), `${what}: element ${i}: ${a[i]} against ${b[i]}`);
};

describe('tensor parallel plan', () => {
  for (const tp of [2, 4]) {
    test(`TP=${tp}: each rank's q|k|v and gate|up rows are the full model's for its heads and slice; o and down all-reduced are the full products`, () => {
      const { file, loads } = checkpoint();
      const plan = shardPlan(full, tp);
      const r = rng(9);
      const x = new Float32Array(H).map(() => r());
      const a = new Float32Array(q).map(() => r());
      const act = new Float32Array(I).map(() => r());
      const qkvFull = matvec(fullWeight(WeightKind.qkv, file, loads), x, q + 2 * kv);
      const biasFull = fullWeight(WeightKind.qkvBias, file, loads);
      const oFull = matvec(fullWeight(WeightKind.o, file, loads), a, H);
      const guFull = matvec(fullWeight(WeightKind.gateUp, file, loads), x, 2 * I);
      const downFull = matvec(fullWeight(WeightKind.down, file, loads), act, H);
      const oParts: Float32Array[] = [], downParts: Float32Array[] = [];
      for (const s of plan.ranks) {
        const qr = s.config.numHeads * D, kvr = s.config.numKvHeads * D, Ir = s.config.intermediateSize;
        const qkv = matvec(rankWeight(s, WeightKind.qkv, file, loads), x, qr + 2 * kvr);
        const bias = rankWeight(s, WeightKind.qkvBias, file, loads);
        const [h0] = s.heads, [k0] = s.kvHeads, [i0] = s.inter;
        close(qkv.subarray(0, qr), qkvFull.subarray(h0 * D, h0 * D + qr), `rank ${s.rank} q`);
        close(qkv.subarray(qr, qr + kvr), qkvFull.subarray(q + k0 * D, q + k0 * D + kvr), `rank ${s.rank} k`);
        close(qkv.subarray(qr + kvr), qkvFull.subarray(q + kv + k0 * D, q + kv + k0 * D + kvr), `rank ${s.rank} v`);
        close(bias.subarray(qr, qr + kvr), biasFull.subarray(q + k0 * D, q + k0 * D + kvr), `rank ${s.rank} k bias`);
        const gu = matvec(rankWeight(s, WeightKind.gateUp, file, loads), x, 2 * Ir);
        close(gu.subarray(0, Ir), guFull.subarray(i0, i0 + Ir), `rank ${s.rank} gate`);
        close(gu.subarray(Ir), guFull.subarray(I + i0, I + i0 + Ir), `rank ${s.rank} up`);
        oParts.push(matvec(rankWeight(s, WeightKind.o, file, loads), a.subarray(h0 * D, h0 * D + qr), H));
        downParts.push(matvec(rankWeight(s, WeightKind.down, file, loads), act.subarray(i0, i0 + Ir), H));
        // Norms are replicated.
        close(rankWeight(s, WeightKind.inputNorm, file, loads), fullWeight(WeightKind.inputNorm, file, loads), `rank ${s.rank} norm`);
      }
      allReduceSum(oParts);
      allReduceSum(downParts);
      for (const p of oParts) close(p, oFull, 'o all-reduced');
      for (const p of downParts) close(p, downFull, 'down all-reduced');
    });
  }

  test('refused by name where a dimension does not divide; the budget is the smallest rank\'s', () => {
    assert.throws(() => shardPlan(full, 8), /num_key_value_heads 4 does not divide over 8 GPUs/);
    assert.throws(() => shardPlan(full, 3), /1, 2, 4 or 8 GPUs/);
    assert.throws(() => shardPlan(parseConfig({ ...RAW, intermediate_size: 192 }), 4), /intermediate \(48\)/);
    assert.deepEqual(budgetOverRanks([100e9, 90e9], [10e9, 10e9], 1e6), { blocks: 80000, limitingRank: 1 });
  });
});
