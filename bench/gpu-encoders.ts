/**
 * bench:gpu-encoders (on the GPU host): the encoders on the CUDA encoder (RAGGUARD_EMBEDDER_EP /
 * RAGGUARD_RERANKER_EP=cuda) against sentence-transformers on the same GPU, same models, same inputs, in
 * one run (scripts/gpu/st_encoders.py, spawned here; plain transformers where sentence-transformers is
 * not installed; the JSON says which ran).
 *
 *   npm run bench:gpu-encoders                         (the CUDA encoder and the peer)
 *   BENCH_ENCODER_EP=cpu npm run bench:gpu-encoders    (the CPU path, ONNX Runtime, alone: run it on the CPU machine)
 *
 * Ingest: the sample corpus (data/corpus) chunked as ingest chunks it (chunker.ts at RAGGUARD_CHUNK_TOKENS /
 * _OVERLAP, each chunk embedded as "title\nchunk"), embedded whole at each batch size (BENCH_ENCODER_BATCHES,
 * default 32,128): chunks/s from the texts (tokenization included, as ingest runs it) and from token ids
 * (the model alone: both sides get the same ids). Rerank: the first 32 questions of data/questions.json, each
 * with 32 chunks, scored at each batch size (BENCH_RERANK_BATCHES, default 16,64,128): pairs/s from the
 * texts and from the encoded pairs (tokenized on RAGGUARD_TOKENIZER_THREADS threads for the CUDA encoder, as the
 * server does). Each figure is the best of BENCH_ENCODER_REPS runs (default 3) after a
 * warm-up. The peer's vectors and scores for the first inputs are compared with ours (agreement).
 *
 * BENCH_ENCODER_DOCS=n takes the corpus' first n documents only, BENCH_RERANK_QUERIES=n n questions (a quick run).
 * Models: BENCH_ENCODER_EMBEDDER (default all-MiniLM-L6-v2 at MINILM_DIR or models/pretrained/..., else
 * models/embedder), BENCH_ENCODER_RERANKER (default models/reranker). The peer loads the same weights:
 * this script writes them from the ONNX graph (encoder-weights.ts) as a Hugging Face checkpoint.
 * The last line is JSON.
 */
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { loadConfig, type ExecutionProvider } from '../src/config/config.js';
import { graphParameters, readEncoderGraph } from '../src/backends/cuda/encoder-weights.js';
import { chunkSections } from '../src/retrieval/chunker.js';
import { embeddingText, readCorpus } from '../src/retrieval/corpus.js';
import { Embedder } from '../src/retrieval/embedder.js';
import { Reranker } from '../src/retrieval/reranker.js';
import { writeSafetensors } from '../src/runtime/safetensors.js';
import { autoTokenizerThreads } from '../src/runtime/tokenizer-pool.js';
import { parseQuestions } from './questions.js';

const ROOT = path.resolve(import.meta.dirname, '..');
const EP = (process.env['BENCH_ENCODER_EP'] ?? 'cuda') as ExecutionProvider;
const MINILM = process.env['MINILM_DIR'] ?? path.join(ROOT, 'models', 'pretrained', 'all-minilm-l6-v2');
const EMBEDDER = process.env['BENCH_ENCODER_EMBEDDER'] ?? (existsSync(path.join(MINILM, 'onnx', 'model.onnx')) ? MINILM : path.join(ROOT, 'models', 'embedder'));
const RERANKER = process.env['BENCH_ENCODER_RERANKER'] ?? path.join(ROOT, 'models', 'reranker');
const BATCHES = (process.env['BENCH_ENCODER_BATCHES'] ?? '32,128').split(',').map(Number);
const RERANK_BATCHES = (process.env['BENCH_RERANK_BATCHES'] ?? '16,64,128').split(',').map(Number);
const REPS = Number(process.env['BENCH_ENCODER_REPS'] ?? 3);
const PEER = process.env['BENCH_ENCODER_PEER'] ?? (EP === 'cuda' ? '1' : '0');
/** BENCH_ENCODER_DOCS: the corpus' first documents only (a quick run); all by default. */
const DOCS = Number(process.env['BENCH_ENCODER_DOCS'] ?? Infinity);
const QUERIES = Number(process.env['BENCH_RERANK_QUERIES'] ?? 32), PASSAGES = 32, AGREE = 16;

const cfg = loadConfig({ ...process.env, RAGGUARD_CORPUS_DIR: 'data/corpus' });
const log = (o: unknown) => console.log(JSON.stringify(o));

async function best(reps: number, run: () => Promise<unknown>): Promise<number> {
  await run(); // warm-up: first use of each shape, kernel, buffer
  let ms = Infinity;
  for (let r = 0; r < reps; r++) {
    const t0 = performance.now();
    await run();
    ms = Math.min(ms, performance.now() - t0);
  }
  return ms;
}

/** The model as a Hugging Face checkpoint (safetensors from the ONNX graph's parameters, config, tokenizer), for the peer. */
function hfCheckpoint(dir: string, out: string, prefix: string): string {
  mkdirSync(out, { recursive: true });
  const p = graphParameters(readEncoderGraph(path.join(dir, 'onnx', 'model.onnx')));
  const tensors = new Map<string, { shape: number[]; values: Float32Array }>();
  for (const [name, c] of p.params) {
    const top = name.startsWith('classifier.') || name === 'scale';
    tensors.set(top ? name : prefix + name, { shape: c.dims, values: c.values });
  }
  writeFileSync(path.join(out, 'model.safetensors'), writeSafetensors(tensors, { format: 'pt' }));
  for (const f of ['config.json', 'tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'vocab.txt']) {
    if (existsSync(path.join(dir, f))) copyFileSync(path.join(dir, f), path.join(out, f));
  }
  return out;
}

// --- inputs, as ingest and /query make them
const cuda = { maxRows: Math.max(...BATCHES, ...RERANK_BATCHES), maxTokens: Math.max(...BATCHES, ...RERANK_BATCHES) * 256 };
// As the server starts them (RAGGUARD_TOKENIZER_THREADS, auto: tokenizer threads for the CUDA encoder).
const tokenizerThreads = cfg.tokenizerThreads === 'auto' ? autoTokenizerThreads() : cfg.tokenizerThreads;
const embedder = await Embedder.load(EMBEDDER, EP, { cuda, tokenizerThreads });
const reranker = await Reranker.load(RERANKER, EP, { cuda, tokenizerThreads });
const docs = (await readCorpus(path.join(ROOT, 'data', 'corpus'))).slice(0, DOCS);
const chunks = docs.flatMap((d) => chunkSections([{ text: d.text }], (w) => embedder.tokenizer.encode(w).length, {
  chunkTokens: cfg.chunkTokens, overlapTokens: cfg.chunkOverlapTokens,
}).map((s) => embeddingText(d.title, s.text)));
const ids = chunks.map((c) => embedder.inputIds(c));
const tokens = ids.reduce((s, r) => s + r.length, 0);
const questions = parseQuestions(JSON.parse(readFileSync(path.join(ROOT, 'data', 'questions.json'), 'utf8'))).slice(0, QUERIES);
const pairs = questions.flatMap((q, i) => Array.from({ length: PASSAGES }, (_, j) => [q.question, chunks[(i * 97 + j * 31) % chunks.length]!] as const));
const encoded = pairs.map(([q, p]) => reranker.pairInput(q, p));
const pairTokens = encoded.reduce((s, p) => s + p.ids.length, 0);
log({ ep: EP, tokenizer_threads: EP === 'cuda' ? tokenizerThreads : 0, embedder: path.relative(ROOT, EMBEDDER) || EMBEDDER, reranker: path.relative(ROOT, RERANKER), chunks: chunks.length, chunk_tokens_mean: Math.round(tokens / chunks.length), pairs: pairs.length, pair_tokens_mean: Math.round(pairTokens / pairs.length) });

// --- ours
const tokenizeMs = await best(1, async () => chunks.map((c) => embedder.inputIds(c)));
const ours: { embed: Record<string, unknown>[]; rerank: Record<string, unknown>[] } = { embed: [], rerank: [] };
for (const b of BATCHES) {
  const text = await best(REPS, () => embedder.embed(chunks, b));
  const model = await best(REPS, () => embedder.embedIds(ids, b));
  const row = { batch: b, chunks_per_s_text: Math.round(chunks.length / (text / 1000)), chunks_per_s_ids: Math.round(chunks.length / (model / 1000)) };
  ours.embed.push(row);
  log({ side: 'ragguard', stage: 'embed', ...row });
}
for (const b of RERANK_BATCHES) {
  const text = await best(REPS, () => reranker.scorePairs(pairs, b));
  const model = await best(REPS, async () => {
    for (let s = 0; s < encoded.length; s += b) await reranker.scoreEncoded(encoded.slice(s, s + b));
  });
  const row = { batch: b, pairs_per_s_text: Math.round(pairs.length / (text / 1000)), pairs_per_s_encoded: Math.round(pairs.length / (model / 1000)) };
  ours.rerank.push(row);
  log({ side: 'ragguard', stage: 'rerank', ...row });
}
const ourVectors = await embedder.embed(chunks.slice(0, AGREE));
const ourScores = (await reranker.scorePairs(pairs.slice(0, AGREE))).scores;

// --- the peer: the same weights, texts and ids, on torch
let peer: Record<string, unknown> | undefined;
let agreement: Record<string, number> | undefined;
if (PEER === '1') {
  const work = mkdtempSync(path.join(tmpdir(), 'rg-enc-bench-'));
  const spec = {
    embedder_dir: hfCheckpoint(EMBEDDER, path.join(work, 'embedder'), ''),
    reranker_dir: hfCheckpoint(RERANKER, path.join(work, 'reranker'), 'bert.'),
    pooling: embedder.pooling, embed_max_tokens: embedder.maxTokens, rerank_max_tokens: reranker.maxTokens,
    texts: chunks, ids, pairs, pair_ids: encoded.map((p) => p.ids), pair_types: encoded.map((p) => p.typeIds),
    batches: BATCHES, rerank_batches: RERANK_BATCHES, reps: REPS, agree: AGREE,
  };
  writeFileSync(path.join(work, 'spec.json'), JSON.stringify(spec));
  const r = spawnSync('python3', [path.join(ROOT, 'scripts', 'gpu', 'st_encoders.py'), path.join(work, 'spec.json')], { encoding: 'utf8', maxBuffer: 1 << 28, env: { ...process.env, PYTHONUNBUFFERED: '1', HF_HUB_OFFLINE: '1', TRANSFORMERS_OFFLINE: '1' } });
  const last = r.stdout.trim().split('\n').filter((l) => l.startsWith('{')).pop();
  if (r.status !== 0 || !last) {
    peer = { error: `st_encoders.py exited ${r.status}: ${(r.stderr || r.stdout).trim().split('\n').slice(-6).join(' | ')}` };
  } else {
    peer = JSON.parse(last) as Record<string, unknown>;
    const vectors = peer['first_embeddings'] as number[][], scores = peer['first_scores'] as number[];
    const d = embedder.dimension;
    let worst = 1;
    vectors.forEach((v, i) => {
      let dot = 0, na = 0, nb = 0;
      v.forEach((x, k) => { const y = ourVectors[i * d + k]!; dot += x * y; na += x * x; nb += y * y; });
      worst = Math.min(worst, dot / Math.sqrt(na * nb));
    });
    const rel = Math.max(...scores.map((s, i) => Math.abs(s - ourScores[i]!) / Math.max(1, Math.abs(s))));
    agreement = { embed_worst_cosine: Number(worst.toFixed(6)), rerank_worst_relative_error: Number(rel.toFixed(5)) };
    delete peer['first_embeddings'];
    delete peer['first_scores'];
  }
  log({ side: 'peer', ...peer });
}

// The tokenizer threads (and the encoders' device memory) would keep the process alive after the last line.
await embedder.release();
await reranker.release();

const ratio = (a: unknown, b: unknown) => (typeof a === 'number' && typeof b === 'number' && b > 0 ? Number((a / b).toFixed(2)) : null);
const peerEmbed = (peer?.['embed'] ?? []) as Record<string, number>[];
const peerRerank = (peer?.['rerank'] ?? []) as Record<string, number>[];
log({
  bench: 'gpu-encoders', ep: EP, tokenizer_threads: EP === 'cuda' ? tokenizerThreads : 0, embedder: path.basename(EMBEDDER), reranker: path.basename(RERANKER), chunks: chunks.length, pairs: pairs.length,
  tokenize_ms: Math.round(tokenizeMs), ours, peer: peer ? { ...peer } : 'not run (BENCH_ENCODER_PEER=0)', agreement,
  vs_peer: peer && !peer['error'] ? {
    embed: ours.embed.map((o, i) => ({ batch: o['batch'], text: ratio(o['chunks_per_s_text'], peerEmbed[i]?.['chunks_per_s_text']), ids: ratio(o['chunks_per_s_ids'], peerEmbed[i]?.['chunks_per_s_ids']) })),
    rerank: ours.rerank.map((o, i) => ({ batch: o['batch'], text: ratio(o['pairs_per_s_text'], peerRerank[i]?.['pairs_per_s_text']), encoded: ratio(o['pairs_per_s_encoded'], peerRerank[i]?.['pairs_per_s_encoded']) })),
  } : undefined,
});
// The H100 run of 2026-12-05 did not exit after the line above even with both encoders released (the call
// waited to its limit): whatever native handle is left (the CUDA context, a tokenizer pool) must not hold a
// device call. The result is printed: stdout to a pipe or file is written synchronously on Linux.
process.exit(0);
