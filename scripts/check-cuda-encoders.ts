/**
 * The CUDA encoder on the device against the CPU path: scripts/gpu/encoder-reference.json holds ONNX
 * Runtime's embeddings and rerank scores for the same model directories (made on a machine with ONNX
 * Runtime: the GPU host has none). For each model and each attention kernel (the tensor-core one the
 * server runs, and the plain reference one), through the server's own Embedder and Reranker with
 * RAGGUARD_*_EP=cuda:
 *   - embeddings: cosine to the reference >= 0.999 for every text (one padded batch of every length);
 *     each text embedded alone gives the batch's vector (padding does not leak: cosine >= 0.9999);
 *   - rerank scores: within 1e-2 of the reference, relative (to at least 1);
 *   - the device's free memory does not move across runs after the first (every buffer was allocated
 *     at load), and the native accountant's total is the plan's.
 * Exits 1 on a mismatch; the last line is JSON. all-MiniLM-L6-v2 is checked where its directory is here
 * (MINILM_DIR, default models/pretrained/all-minilm-l6-v2; the GPU host has it only when carried:
 * scripts/gpu/run-encoders.sh's minilm step), and said skipped otherwise.
 *
 *   node --import tsx scripts/check-cuda-encoders.ts
 */
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { encoderNative, encoderUnavailable } from '../src/backends/cuda/encoder-binding.js';
import type { CudaEncoder } from '../src/backends/cuda/encoder-runner.js';
import { Embedder } from '../src/retrieval/embedder.js';
import { Reranker } from '../src/retrieval/reranker.js';
import { cosine } from '../src/retrieval/similarity.js';

const ROOT = path.resolve(import.meta.dirname, '..');
const MINILM = process.env['MINILM_DIR'] ?? path.join(ROOT, 'models', 'pretrained', 'all-minilm-l6-v2');

interface Reference {
  texts: string[];
  embedders: { dir: string; dimension: number; embeddings: number[][] }[];
  rerankers: { dir: string; query: string; passages: string[]; scores: number[] }[];
}

const ref = JSON.parse(readFileSync(path.join(ROOT, 'scripts', 'gpu', 'encoder-reference.json'), 'utf8')) as Reference;
const where = (dir: string) => (dir.endsWith('all-minilm-l6-v2') ? MINILM : path.join(ROOT, dir));
const KERNELS = [['tensor-core', false], ['reference', true]] as const;


const round = (x: number) => Number(x.toFixed(6));

/**
 * The CUDA encoder behind a loaded embedder's EncoderBackend: its `device` (exact figures), which on this
 * backend is the encoder itself, read here for its native accountant's free and total bytes.
 */
function cudaEncoderOf(model: { device?: unknown }, dir: string): CudaEncoder {
  if (!model.device) throw new Error(`${dir}: loaded with RAGGUARD_*_EP=cuda but has no device figures (not on the CUDA encoder)`);
  return model.device as CudaEncoder;
}
const results: Record<string, unknown>[] = [];
let ok = true;

if (!encoderNative()) {
  console.log(JSON.stringify({ ok: false, error: `the CUDA encoder is unavailable: ${encoderUnavailable()}` }));
  process.exit(1);
}

for (const e of ref.embedders) {
  const dir = where(e.dir);
  if (!existsSync(path.join(dir, 'onnx', 'model.onnx'))) {
    results.push({ model: e.dir, skipped: `${dir} is not here` });
    continue;
  }
  for (const [kernel, referenceAttention] of KERNELS) {
    const emb = await Embedder.load(dir, 'cuda', { cuda: { referenceAttention } });
    const cuda = cudaEncoderOf(emb, dir);
    const batch = await emb.embed(ref.texts);
    const free0 = cuda.memory().device_free;
    const d = emb.dimension;
    const toRef = ref.texts.map((_, i) => cosine(batch.subarray(i * d, (i + 1) * d), e.embeddings[i]!));
    const alone: number[] = [];
    for (let i = 0; i < ref.texts.length; i++) alone.push(cosine(await emb.embed([ref.texts[i]!]), batch.subarray(i * d, (i + 1) * d)));
    const m = cuda.memory();
    const worst = Math.min(...toRef), worstAlone = Math.min(...alone);
    const pass = d === e.dimension && worst >= 0.999 && worstAlone >= 0.9999 && m.total === cuda.deviceBytes;
    ok &&= pass;
    results.push({
      model: e.dir, kernel, pass, worst_cosine: round(worst), cosines: toRef.map(round), batch_vs_alone_worst: round(worstAlone),
      device_free_change_bytes: m.device_free - free0, device_bytes: m.total, plan_bytes: cuda.deviceBytes,
    });
    await emb.release();
  }
}

for (const r of ref.rerankers) {
  const dir = where(r.dir);
  for (const [kernel, referenceAttention] of KERNELS) {
    const rr = await Reranker.load(dir, 'cuda', { cuda: { referenceAttention } });
    const { scores } = await rr.score(r.query, r.passages);
    const rel = scores.map((s, i) => Math.abs(s - r.scores[i]!) / Math.max(1, Math.abs(r.scores[i]!)));
    const worst = Math.max(...rel);
    // The order the reference ranks the passages in, kept.
    const order = (v: number[]) => v.map((_, i) => i).sort((a, b) => v[b]! - v[a]!).join(',');
    const pass = worst <= 1e-2 && order(scores) === order(r.scores);
    ok &&= pass;
    results.push({ model: r.dir, kernel, pass, worst_relative_error: round(worst), scores: scores.map(round), reference: r.scores });
    await rr.release();
  }
}

for (const x of results) console.log(JSON.stringify(x));
console.log(JSON.stringify({ ok, checked: results.filter((x) => 'pass' in x).length, failed: results.filter((x) => x['pass'] === false).map((x) => `${String(x['model'])} ${String(x['kernel'])}`), skipped: results.filter((x) => 'skipped' in x) }));
process.exitCode = ok ? 0 : 1;
