/** The corpus and its chunks, the retrieval of a query (dense, lexical, fused, reranked), and what one request may ask for (config.ts: VARIABLES, in the README's order). */
import { int, num, str, bool, oneOf, rel, type Variable } from './parse.js';

export const QUERY_VARIABLES: readonly Variable[] = [
  {
    name: 'RAGGUARD_CORPUS_DIR', default: 'data/corpus',
    doc: "Directory of *.txt documents (first line = title) ingested when the index is empty; '' for none.",
    apply: str((c, v) => (c.corpusDir = v === '' ? '' : rel(v)), true),
  },
  { name: 'RAGGUARD_CHUNK_TOKENS', default: '128', doc: 'Embedder tokens per chunk.', apply: int(16, 512, (c, v) => (c.chunkTokens = v)) },
  {
    name: 'RAGGUARD_CHUNK_OVERLAP', default: '32', doc: 'Tokens shared by consecutive chunks (< chunk tokens).',
    apply: int(0, 256, (c, v) => (c.chunkOverlapTokens = v)),
  },
  { name: 'RAGGUARD_TOP_K', default: '20', doc: 'Default hits retrieved per query.', apply: int(1, 1000, (c, v) => (c.defaultTopK = v)) },
  { name: 'RAGGUARD_MAX_TOP_K', default: '100', doc: 'Largest top_k a request may ask for.', apply: int(1, 1000, (c, v) => (c.maxTopK = v)) },
  {
    name: 'RAGGUARD_RERANK_TOP_N', default: '3', doc: 'Default chunks kept after rerank (and offered to the prompt).',
    apply: int(1, 100, (c, v) => (c.defaultRerankTopN = v)),
  },
  {
    name: 'RAGGUARD_MAX_RERANK_TOP_N', default: '16', doc: 'Largest rerank_top_n a request may ask for.',
    apply: int(1, 100, (c, v) => (c.maxRerankTopN = v)),
  },
  {
    name: 'RAGGUARD_MAX_NEW_TOKENS', default: '64', doc: 'Default tokens generated per answer.',
    apply: int(1, 4096, (c, v) => (c.defaultMaxNewTokens = v)),
  },
  {
    name: 'RAGGUARD_MAX_NEW_TOKENS_LIMIT', default: '256', doc: 'Largest max_new_tokens a request may ask for.',
    apply: int(1, 4096, (c, v) => (c.maxNewTokensLimit = v)),
  },
  {
    name: 'RAGGUARD_MAX_N', default: '8',
    doc: 'Largest `n` (samples of one prompt) a /v1 completion may ask for (at most RAGGUARD_MAX_NUM_SEQS; the default follows a smaller one); they share the prompt\'s KV blocks, each adds its own new tokens\' KV.',
    apply: int(1, 64, (c, v) => (c.maxN = v)),
  },
  {
    name: 'RAGGUARD_PROMPT_BUDGET', default: '768', doc: 'Most prompt tokens (template + context + question) given to the decoder.',
    apply: int(32, 32768, (c, v) => (c.promptBudgetTokens = v)),
  },
  {
    name: 'RAGGUARD_QUERY_COPY_SPAN', default: 'off',
    doc: 'Grounded by construction, for /query answers (decoders with a chat template, no response_format; /v1 routes are never constrained): `ticks`, every `code span` of the answer is copied verbatim from a chunk in its prompt; `first`, the answer must also open with one, then one line at most; `off`, unconstrained (generate/span-answer.ts).',
    apply: oneOf(['off', 'first', 'ticks'] as const, (c, v) => (c.queryCopySpan = v)),
  },
  {
    name: 'RAGGUARD_CONTEXT_SENTENCES', default: '2',
    doc: "Query-focused context for /query prompts: of each chunk, only this many sentences go into the prompt, those sharing the most of the question's content words, in their order (a sentence ending in ':' brings the next one along; retrieval/focus.ts); citations keep the whole chunk. Fewer prompt tokens, a shorter prefill: on a CPU that is most of a /query's latency. 0: whole chunks. Default 2, chosen on the tuning split for the default decoder (Qwen2.5-Coder-1.5B: as many facts as whole chunks at 0.58 of the prompt tokens; held out, 0.811 of 106 at /query p50 3.3 s); Qwen2.5-Coder-0.5B answers better with 0 (it lost 2 of 30 tuning facts with 2).",
    apply: int(0, 100, (c, v) => (c.contextSentences = v)),
  },
  {
    name: 'RAGGUARD_MAX_QUERY_TOKENS', default: '64', doc: 'Longest query, in decoder tokens; longer ones get 413.',
    apply: int(1, 4096, (c, v) => (c.maxQueryTokens = v)),
  },
  {
    name: 'RAGGUARD_PRUNE_MARGIN', default: '0.25', doc: 'Hits scoring below (best cosine - margin) are pruned before rerank.',
    apply: num(0, 2, (c, v) => (c.pruneMargin = v)),
  },
  {
    name: 'RAGGUARD_DEDUPE_JACCARD', default: '0.8', doc: 'Word 3-shingle Jaccard at which two hits are duplicates (1 = exact only).',
    apply: num(0, 1, (c, v) => (c.dedupeJaccard = v)),
  },
  {
    name: 'RAGGUARD_RETRIEVAL', default: 'hybrid',
    doc: 'First-stage retrieval: hybrid (faiss cosine and BM25 fused by reciprocal rank), dense (faiss only; RAGGUARD_PRUNE_MARGIN applies), or lexical (BM25 only).',
    apply: oneOf(['hybrid', 'dense', 'lexical'] as const, (c, v) => (c.retrieval = v)),
  },
  {
    name: 'RAGGUARD_RRF_K', default: '60', doc: 'Reciprocal-rank fusion constant k: a hit at rank r in a list adds weight / (k + r).',
    apply: num(0, 10000, (c, v) => (c.rrfK = v)),
  },
  {
    name: 'RAGGUARD_RRF_DENSE_WEIGHT', default: '1', doc: 'Weight of the dense (embedder) ranking in the fusion.',
    apply: num(0, 100, (c, v) => (c.rrfDenseWeight = v)),
  },
  {
    name: 'RAGGUARD_RRF_LEXICAL_WEIGHT', default: '1', doc: 'Weight of the BM25 ranking in the fusion.',
    apply: num(0, 100, (c, v) => (c.rrfLexicalWeight = v)),
  },
  {
    name: 'RAGGUARD_RETRIEVAL_DEPTH', default: '50', doc: 'Hits each side (dense, BM25) contributes to the fusion (at least top_k).',
    apply: int(1, 10000, (c, v) => (c.retrievalDepth = v)),
  },
  { name: 'RAGGUARD_BM25_K1', default: '1.2', doc: 'BM25 term-frequency saturation k1.', apply: num(0, 10, (c, v) => (c.bm25K1 = v)) },
  { name: 'RAGGUARD_BM25_B', default: '0.75', doc: 'BM25 length normalisation b (0: none, 1: full).', apply: num(0, 1, (c, v) => (c.bm25B = v)) },
  {
    name: 'RAGGUARD_RERANK', default: 'false',
    doc: "Rerank the first stage's hits with the cross-encoder (RAGGUARD_RERANKER); false keeps their fused order and skips the model run. Off by default: the shipped cross-encoder lowers R@1 below fused retrieval's (npm run bench:rag) and no pretrained one is to be had.",
    apply: bool((c, v) => (c.rerank = v)),
  },
  {
    name: 'RAGGUARD_MAX_DOCUMENT_BYTES', default: '2000000', doc: 'Largest POST /documents body, in bytes.',
    apply: int(1024, 1 << 30, (c, v) => (c.maxDocumentBytes = v)),
  },
  {
    name: 'RAGGUARD_MAX_UPLOAD_BYTES', default: '33554432',
    doc: 'Largest request carrying files to POST /documents or PUT /documents/:id (a multipart upload, or JSON with base64 content), in bytes, held in memory while its files are read; the text taken from each file is still held to RAGGUARD_MAX_DOCUMENT_BYTES.',
    apply: int(1024, 1 << 30, (c, v) => (c.maxUploadBytes = v)),
  },
];
