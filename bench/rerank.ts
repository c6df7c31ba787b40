/**
 * Reranker throughput: (query, passage) pairs scored per second at batch sizes 1, 8 and 32, through
 * ragguard's reranker (src/rerank/reranker.ts: its ONNX session as the server runs it) and, beside it on
 * the same machine and the same pairs, the same cross-encoder (the same directory: config, tokenizer,
 * onnx/model.onnx) through transformers.js (@huggingface/transformers' AutoModelForSequenceClassification,
 * on onnxruntime-node). The pairs: each question of data/questions.json against passages of the shipped
 * corpus (the first 600 characters of each document), as /query reranks them.
 *
 * Both score every pair; the two engines' logits are compared (max |difference|): the same model, so
 * the figures compare runtimes, not models. Each engine and batch size gets a warm-up pass over the
 * first batches, then `--rounds` timed passes over all pairs; the best round counts (least disturbed).
 *
 *   npm run bench:rerank [-- --pairs 256 --rounds 3 --batches 1,8,32]
 *
 * The reranker is RAGGUARD_RERANKER (default models/reranker); threads as the server's
 * (RAGGUARD_INTRA_OP_THREADS; ONNX Runtime's default for transformers.js). Prints a table, then one JSON
 * object as the last line of stdout.
 */
import { readdir, readFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { loadConfig } from '../src/config/config.js';
import { Reranker } from '../src/retrieval/reranker.js';
import { countingAllocator, installHostAccounting } from '../src/backends/ort/ort-allocator.js';
import { applySessionSettings } from '../src/backends/ort/ort-direct.js';

const ROOT = path.resolve(import.meta.dirname, '..');

const { values } = parseArgs({ options: { pairs: { type: 'string', default: '256' }, rounds: { type: 'string', default: '3' }, batches: { type: 'string', default: '1,8,32' } } });
const numPairs = Number(values.pairs);
const rounds = Number(values.rounds);
const batches = values.batches.split(',').map(Number);
if (!(numPairs >= 1 && rounds >= 1 && batches.every((b) => Number.isInteger(b) && b >= 1))) throw new Error('--pairs, --rounds and --batches take positive integers');

const cfg = loadConfig(process.env);
// ONNX Runtime's allocations as the server makes them: through the counting allocator, with its warm cache.
installHostAccounting(cfg);
applySessionSettings(cfg);
const dir = cfg.rerankerPath;

/** The benchmark's pairs: questions against corpus passages, cycled to `n`. */
async function benchPairs(n: number): Promise<[string, string][]> {
  const questions = (JSON.parse(await readFile(path.join(ROOT, 'data', 'questions.json'), 'utf8')) as { question: string }[]).map((q) => q.question);
  const corpusDir = path.join(ROOT, 'data', 'corpus');
  const files = (await readdir(corpusDir)).filter((f) => f.endsWith('.txt')).sort();
  const passages = await Promise.all(files.map(async (f) => (await readFile(path.join(corpusDir, f), 'utf8')).slice(0, 600)));
  return Array.from({ length: n }, (_, i) => [questions[i % questions.length]!, passages[(i * 7) % passages.length]!]);
}

interface Engine {
  name: string;
  score(pairs: readonly (readonly [string, string])[]): Promise<number[]>;
}

async function ragguardEngine(): Promise<Engine> {
  const reranker = await Reranker.load(dir, cfg.providers.reranker);
  return { name: 'ragguard', score: async (pairs) => (await reranker.scorePairs(pairs, pairs.length)).scores };
}

async function transformersEngine(maxTokens: number): Promise<Engine> {
  const tf = await import('@huggingface/transformers');
  tf.env.allowRemoteModels = false;
  tf.env.localModelPath = path.dirname(path.resolve(dir));
  const id = path.basename(dir);
  const tokenizer = await tf.AutoTokenizer.from_pretrained(id, { local_files_only: true });
  const model = await tf.AutoModelForSequenceClassification.from_pretrained(id, { local_files_only: true, dtype: 'fp32', device: 'cpu' });
  return {
    name: 'transformers.js',
    score: async (pairs) => {
      // The pairs cut as ragguard cuts them (the passage's tail; at most the reranker's maxTokens).
      const inputs = tokenizer(pairs.map((p) => p[0]), { text_pair: pairs.map((p) => p[1]), padding: true, truncation: true, max_length: maxTokens });
      const out = await model(inputs) as { logits: { data: Float32Array; dims: number[] } };
      const labels = out.logits.dims[1] ?? 1;
      return pairs.map((_, i) => out.logits.data[i * labels]!);
    },
  };
}

async function timed(e: Engine, pairs: readonly (readonly [string, string])[], batch: number): Promise<{ pairsPerSecond: number; scores: number[] }> {
  for (let s = 0; s < Math.min(pairs.length, 2 * batch); s += batch) await e.score(pairs.slice(s, s + batch)); // warm-up
  let best = Infinity;
  let scores: number[] = [];
  for (let r = 0; r < rounds; r++) {
    const out: number[] = [];
    const t0 = performance.now();
    for (let s = 0; s < pairs.length; s += batch) out.push(...(await e.score(pairs.slice(s, s + batch))));
    best = Math.min(best, performance.now() - t0);
    scores = out;
  }
  return { pairsPerSecond: pairs.length / (best / 1000), scores };
}

const pairs = await benchPairs(numPairs);
const ours = await ragguardEngine();
const maxTokens = (await Reranker.load(dir, cfg.providers.reranker)).maxTokens;
const peer = await transformersEngine(maxTokens);
const rows: { batch: number; ragguard: number; transformers_js: number; ratio: number; max_abs_logit_diff: number }[] = [];
for (const batch of batches) {
  const a = await timed(ours, pairs, batch);
  const b = await timed(peer, pairs, batch);
  const diff = Math.max(...a.scores.map((x, i) => Math.abs(x - b.scores[i]!)));
  rows.push({ batch, ragguard: a.pairsPerSecond, transformers_js: b.pairsPerSecond, ratio: a.pairsPerSecond / b.pairsPerSecond, max_abs_logit_diff: diff });
}

console.log(`reranker ${dir}: ${pairs.length} pairs, best of ${rounds} rounds, ${os.cpus().length} CPUs (${os.cpus()[0]?.model ?? '?'})`);
console.log('batch  ragguard pairs/s  transformers.js pairs/s  ratio  max |logit diff|');
for (const r of rows) {
  console.log(`${String(r.batch).padStart(5)}  ${r.ragguard.toFixed(1).padStart(16)}  ${r.transformers_js.toFixed(1).padStart(23)}  ${r.ratio.toFixed(2).padStart(5)}  ${r.max_abs_logit_diff.toExponential(2)}`);
}
console.log(JSON.stringify({
  bench: 'rerank', reranker: dir, pairs: pairs.length, rounds, cpus: os.cpus().length, intra_op_threads: cfg.intraOpThreads,
  allocator: countingAllocator() ? { counting: true, warm_limit_bytes: countingAllocator()!.warmLimit(), warm_bytes_at_end: countingAllocator()!.warm() } : { counting: false },
  results: rows.map((r) => ({ ...r, ragguard: Number(r.ragguard.toFixed(1)), transformers_js: Number(r.transformers_js.toFixed(1)), ratio: Number(r.ratio.toFixed(3)) })),
}));
