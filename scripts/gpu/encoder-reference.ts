/**
 * References for the CUDA encoder's check on the GPU host (scripts/check-cuda-encoders.ts), made here on
 * the CPU path (ONNX Runtime, which the GPU host does not have): a few texts' embeddings by the test
 * embedder and by all-MiniLM-L6-v2, and the test reranker's scores for a query's passages. Texts of very
 * different lengths, so that the device's padded batches, its attention tiles (64 keys) and truncation
 * (512 tokens for the embedders, 256 for the reranker) are all exercised.
 *
 *   node --import tsx scripts/gpu/encoder-reference.ts > scripts/gpu/encoder-reference.json
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { Embedder } from '../../src/retrieval/embedder.js';
import { Reranker } from '../../src/retrieval/reranker.js';

const ROOT = path.resolve(import.meta.dirname, '../..');
const corpus = (name: string, words: number) => readFileSync(path.join(ROOT, 'data', 'corpus', `${name}.txt`), 'utf8').split(/\s+/).slice(0, words).join(' ');

export const EMBED_TEXTS = [
  'How do I cancel a job queued with at?',
  'Run atrm with the task number; atq lists the pending jobs.',
  "The sticky bit on /tmp lets only a file's owner delete it.",
  'a',
  corpus('apt-cache', 90),
  corpus('quotas', 260),
  // Past 512 tokens: truncated, as the server truncates.
  corpus('task-scheduling-cron-atd', 700),
];

export const RERANK = {
  query: 'How can I stop one particular user from scheduling cron jobs?',
  passages: [
    'To deny a user access to crontab, list the user name in /etc/cron.deny.',
    'APT pinning gives packages from one release priority over another.',
    "The sticky bit on /tmp lets only a file's owner delete it.",
    corpus('task-scheduling-cron-atd', 120),
    corpus('quotas', 400),
    'cron',
  ],
};

const round = (v: ArrayLike<number>) => Array.from(v, (x) => Number(x.toFixed(7)));

async function embeddings(dir: string): Promise<{ dir: string; dimension: number; pooling: string; embeddings: number[][] }> {
  const e = await Embedder.load(path.join(ROOT, dir), 'cpu');
  const v = await e.embed(EMBED_TEXTS);
  return { dir, dimension: e.dimension, pooling: e.pooling, embeddings: EMBED_TEXTS.map((_, i) => round(v.subarray(i * e.dimension, (i + 1) * e.dimension))) };
}

const r = await Reranker.load(path.join(ROOT, 'models', 'reranker'), 'cpu');
const scored = await r.score(RERANK.query, RERANK.passages);
console.log(JSON.stringify({
  made_by: 'scripts/gpu/encoder-reference.ts: the CPU path (ONNX Runtime, float32) on the same model directories',
  texts: EMBED_TEXTS,
  embedders: [await embeddings('models/embedder'), await embeddings('models/pretrained/all-minilm-l6-v2')],
  rerankers: [{ dir: 'models/reranker', query: RERANK.query, passages: RERANK.passages, scores: round(scored.scores) }],
}));
