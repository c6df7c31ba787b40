/**
 * The query pipeline: embed -> search -> prune/dedupe -> rerank -> prompt inside a token budget ->
 * generate, and the citations of what went into the prompt. It is given its parts (models, retriever,
 * engine, adapters) and knows nothing of how they were built or where they run (bootstrap.ts wires
 * them); each stage is timed, and where tracing is on a span of its own (runtime/tracing.ts: embed,
 * search, rerank, prompt, generate; the engine's prefill and decode are generate's children). It runs the query as it is given: the guard's decision and the admission
 * queue are the guarded run's (guarded-run.ts), which calls it through RagService.query.
 */
import type { Config } from '../config/config.js';
import type { AdapterRegistry } from '../generate/adapters.js';
import { chatContextPrompt } from '../generate/chat-prompt.js';
import { ChatTemplate, chatTemplateFrom, tokenizerAddsBos } from '../generate/chat-template.js';
import type { DecoderShape } from '../generate/decoder-shape.js';
import type { Engine, GenerateHooks } from '../generate/engine.js';
import type { FinishReason, Generation } from '../generate/generation.js';
import { assemblePrompt, templateFromConfig, type AssembledPrompt, type ContextChunk, type PromptTemplate } from '../generate/prompt.js';
import type { SamplingParams } from '../generate/sequence.js';
import { spanAnswerGrammar } from '../generate/span-answer.js';
import type { GrowthTracker } from '../guards/growth.js';
import type { RequestShape } from '../guards/memory-model.js';
import { processMemory } from '../guards/process-memory.js';
import type { Embedder } from '../retrieval/embedder.js';
import { focusText, queryStems } from '../retrieval/focus.js';
import { dedupe } from '../retrieval/prune.js';
import { RERANK_BATCH, type Reranker } from '../retrieval/reranker.js';
import { DEFAULT_COLLECTION, type Hit, type SearchFilter } from '../retrieval/retrieval-store.js';
import type { Retriever } from '../retrieval/retriever.js';
import type { TextTokenizer } from '../runtime/tokenizer.js';
import { inSpan } from '../runtime/tracing.js';
import { nextTurn } from '../runtime/turns.js';

/** The sampler's per-request fields beyond temperature and seed (sequence.ts). */
export type SamplingOptions = Partial<Pick<SamplingParams, 'topP' | 'topK' | 'repetitionPenalty' | 'presencePenalty' | 'frequencyPenalty' | 'stop' | 'grammar'>>;

/** Streaming and cancellation: citations once the prompt is assembled, each token as generated, an abort signal. */
export interface QueryHooks extends GenerateHooks {
  onCitations?: (citations: Citation[]) => void;
}

export interface QueryInput {
  query: string;
  topK: number;
  rerankTopN: number;
  maxNewTokens: number;
  temperature: number;
  seed?: number;
  /** Prompt tokens at most (a reshape may lower it below RAGGUARD_PROMPT_BUDGET). */
  promptBudget?: number;
  /** Pairs per reranker run (a reshape may lower it below RERANK_BATCH). */
  rerankBatch?: number;
  /** LoRA adapter to generate with (a name under RAGGUARD_ADAPTER_DIR). */
  adapter?: string;
  /** The tenant's prefix-cache salt: its cached blocks serve only its own prompts (prefix-hash.ts). */
  cacheSalt?: string;
  /** The collection searched and the metadata conditions its chunks must meet (default: the 'default' collection). */
  filter?: SearchFilter;
  sampling?: SamplingOptions;
  hooks?: QueryHooks;
  /** Builds the prompt from the ranked chunks instead of the RAG template (a chat's messages: server/openai/chat.ts). */
  promptFor?: (chunks: readonly ContextChunk[], budget: number, between: () => Promise<void>) => Promise<AssembledPrompt>;
}

export interface Citation {
  doc_id: string;
  collection: string;
  title: string;
  chunk_id: number;
  /** Cross-encoder logit (higher is more relevant); with RAGGUARD_RERANK=false, the first-stage score. */
  score: number;
  /** First-stage score: cosine (dense), BM25 (lexical) or the reciprocal-rank fusion sum (hybrid). */
  retrieval_score: number;
  text: string;
  /** Where in the document the chunk is: "page 3", "section: Install > Linux"; absent when the source has no pages or headings. */
  locator?: string;
}

export interface QueryResult {
  answer: string;
  citations: Citation[];
  finish_reason: FinishReason;
  usage: { prompt_tokens: number; completion_tokens: number };
  retrieval: { hits: number; after_prune: number; after_dedupe: number; reranked: number; in_prompt: number; truncated: number };
  timings_ms: { embed: number; search: number; rerank: number; generate: number };
  /** The request's shape as it ran (pairs actually reranked, their width, the assembled prompt). */
  shape: RequestShape;
  /** The adapter it generated with: its name and the key of its weights. */
  adapter?: { name: string; key: string };
  /** With a response_format: max_tokens' budget left out a continuation the schema allowed, so the JSON closed in time. */
  steered_to_close?: true;
}

/** What the pipeline runs on: whatever built them. */
export interface PipelineParts {
  cfg: Pick<Config, 'dedupeJaccard' | 'rerank' | 'promptBudgetTokens'> & Partial<Pick<Config, 'queryCopySpan' | 'contextSentences'>>;
  embedder: Pick<Embedder, 'embed' | 'inputIds'>;
  reranker: Pick<Reranker, 'score' | 'maxTokens'>;
  /** The decoder as the pipeline sees it: its tokenizer, its positions, its BOS. */
  decoder: { readonly tokenizer: TextTokenizer; readonly shape: DecoderShape; readonly bosId: number | undefined };
  retriever: Retriever;
  engine: Engine;
  adapters: AdapterRegistry;
  /** Told of process memory after each query (the leak check). */
  growth: GrowthTracker;
}

const ms = (t0: number) => Math.round((performance.now() - t0) * 100) / 100;

export class QueryPipeline {
  readonly template: PromptTemplate;
  /** The BOS a /query prompt starts with: the decoder's, where its tokenizer adds one. */
  readonly promptBosId: number | undefined;
  /** The decoder's own chat template, where it brings one: /query prompts are then chats (chat-prompt.ts). */
  readonly chat: ChatTemplate | undefined;

  constructor(private readonly parts: PipelineParts) {
    const { decoder } = parts;
    this.template = templateFromConfig(decoder.tokenizer.config);
    this.promptBosId = tokenizerAddsBos(decoder.tokenizer.config, decoder.bosId) ? decoder.bosId : undefined;
    this.chat = chatTemplateFrom(decoder.tokenizer.config).source === 'tokenizer_config'
      ? ChatTemplate.forModel(decoder.tokenizer, decoder.bosId) : undefined;
  }

  /** A query's shape for the guards, at its worst case: the full prompt budget, the longest pairs. */
  requestShape(q: QueryInput): RequestShape {
    const { embedder, reranker, decoder, cfg } = this.parts;
    return {
      queryTokens: embedder.inputIds(q.query).length,
      // Also the query's top_k once admitted (a reshape may halve it): kept as asked when rerank is off,
      // where the memory model's rerank stage is then an overestimate.
      topK: q.topK,
      rerankTopN: q.rerankTopN,
      pairTokens: reranker.maxTokens,
      rerankBatch: q.rerankBatch ?? RERANK_BATCH,
      promptTokens: Math.min(q.promptBudget ?? cfg.promptBudgetTokens, decoder.shape.maxPositions - q.maxNewTokens),
      maxNewTokens: q.maxNewTokens,
    };
  }

  /** Answers the query; an abort of `signal` (client gone, shutdown) stops it between stages or at the engine's next step. */
  async run(q: QueryInput, requestSignal?: AbortSignal): Promise<QueryResult> {
    const { embedder, reranker, decoder, retriever, adapters, engine, growth, cfg } = this.parts;
    // The request's signal (a hang-up, shutdown) and a stream's own (a closed stream) both stop every stage.
    const signals = [requestSignal, q.hooks?.signal].filter((x): x is AbortSignal => x !== undefined);
    const signal = signals.length > 1 ? AbortSignal.any(signals) : signals[0];
    signal?.throwIfAborted();
    let t = performance.now();
    const qv = await inSpan('embed', () => embedder.embed([q.query], undefined, signal));
    const embedMs = ms(t);
    // Retrieval and prompt assembly (a few ms of the main thread each) on turns of their own (runtime/turns.ts).
    await nextTurn();

    t = performance.now();
    // A turn between the lexical and the dense search as well (retriever.ts).
    const filter = q.filter ?? { collection: DEFAULT_COLLECTION };
    const { hits, pruned, unique } = await inSpan('search', async (span) => {
      const found = await retriever.searchPaced(qv, q.query, q.topK, filter, nextTurn);
      const kept = dedupe(found.pruned, cfg.dedupeJaccard);
      span?.setAttributes({ 'ragguard.top_k': q.topK, 'ragguard.collection': filter.collection, 'ragguard.hits': found.hits.length, 'ragguard.after_prune': found.pruned.length, 'ragguard.after_dedupe': kept.length });
      return { ...found, unique: kept };
    });
    const searchMs = ms(t);

    signal?.throwIfAborted();
    t = performance.now();
    const titled = (h: Hit) => `${h.chunk.title}\n${h.chunk.text}`;
    // Rerank off: the first stage's order and scores stand, and no pair is scored.
    const { scores, pairTokens, runs: rerankRuns } = cfg.rerank
      ? await inSpan('rerank', () => reranker.score(q.query, unique.map(titled), q.rerankBatch, signal),
        { 'ragguard.rerank.pairs': unique.length, 'ragguard.rerank.batch': q.rerankBatch ?? RERANK_BATCH })
      : { scores: unique.map((h) => h.score), pairTokens: 0, runs: [] };
    const ranked = unique
      .map((hit, i) => ({ hit, score: scores[i]! }))
      .sort((a, b) => b.score - a.score)
      .slice(0, q.rerankTopN);
    const rerankMs = ms(t);

    // Prompt assembly (a whole prompt through the tokenizer) on a turn of its own, too.
    await nextTurn();
    signal?.throwIfAborted();
    t = performance.now();
    const budget = Math.min(q.promptBudget ?? cfg.promptBudgetTokens, decoder.shape.maxPositions - q.maxNewTokens);
    // RAGGUARD_CONTEXT_SENTENCES: each chunk's sentences nearest the question only (a /query prompt, not a chat's).
    const keep = q.promptFor ? 0 : cfg.contextSentences ?? 0;
    const stems = keep > 0 ? queryStems(q.query) : undefined;
    const chunks = ranked.map((r) => ({ title: r.hit.chunk.title, text: stems ? focusText(stems, r.hit.chunk.text, keep) : r.hit.chunk.text }));
    // A turn of the event loop between two encodings of a long prompt (turns.ts).
    const prompt = await inSpan('prompt', async (span) => {
      const p = q.promptFor ? await q.promptFor(chunks, budget, nextTurn)
        : this.chat ? await chatContextPrompt(this.chat, this.template, [{ role: 'user', content: q.query }], chunks, budget, nextTurn)
          : assemblePrompt(decoder.tokenizer, this.template, this.promptBosId, q.query, chunks, budget);
      span?.setAttributes({ 'ragguard.prompt.budget_tokens': budget, 'ragguard.prompt.tokens': p.ids.length, 'ragguard.prompt.chunks': p.included.length, 'ragguard.prompt.truncated': p.truncated.length });
      return p;
    });
    const citations = prompt.included.map((i) => {
      const { hit, score } = ranked[i]!;
      return {
        doc_id: hit.chunk.docId,
        collection: hit.chunk.collection,
        title: hit.chunk.title,
        chunk_id: hit.chunk.id,
        score,
        retrieval_score: hit.score,
        text: hit.chunk.text,
        ...(hit.chunk.locator === undefined ? {} : { locator: hit.chunk.locator }),
      };
    });
    q.hooks?.onCitations?.(citations);
    // RAGGUARD_QUERY_COPY_SPAN: a /query answer (not a chat's, not a response_format's) opens with a span of these chunks.
    const copySpan = cfg.queryCopySpan && cfg.queryCopySpan !== 'off' && this.chat && !q.promptFor && q.sampling?.grammar === undefined
      ? await spanAnswerGrammar(engine.runner, prompt.included.map((i) => chunks[i]!), cfg.queryCopySpan) : undefined;
    // The adapter loads for generation only (nothing before it uses it) and is released right after.
    const { gen, lease } = await inSpan('generate', async (span) => {
      const lease = q.adapter === undefined ? undefined : await adapters.acquire(q.adapter, signal);
      let gen: Generation;
      try {
        const hooks = { ...q.hooks, signal };
        gen = await engine.generate(prompt.ids, { ...q.sampling, ...(copySpan ? { grammar: copySpan } : {}), maxNewTokens: q.maxNewTokens, temperature: q.temperature, seed: q.seed, adapter: lease?.adapter, ...(q.cacheSalt === undefined ? {} : { cacheSalt: q.cacheSalt }) }, hooks);
      } finally {
        lease?.release();
      }
      span?.setAttributes({
        'gen_ai.usage.input_tokens': prompt.ids.length, 'gen_ai.usage.output_tokens': gen.ids.length, 'gen_ai.response.finish_reasons': [gen.finishReason],
        'ragguard.cached_prompt_tokens': gen.cachedTokens ?? 0, ...(q.adapter === undefined ? {} : { 'ragguard.adapter': q.adapter }),
      });
      return { gen, lease };
    }, { 'gen_ai.request.max_tokens': q.maxNewTokens, 'gen_ai.request.temperature': q.temperature });
    const generateMs = ms(t);
    growth.record(processMemory());

    return {
      answer: gen.text,
      citations,
      finish_reason: gen.finishReason,
      usage: { prompt_tokens: prompt.ids.length, completion_tokens: gen.ids.length },
      retrieval: {
        hits: hits.length, after_prune: pruned.length, after_dedupe: unique.length, reranked: ranked.length,
        in_prompt: prompt.included.length, truncated: prompt.truncated.length,
      },
      timings_ms: { embed: embedMs, search: searchMs, rerank: rerankMs, generate: generateMs },
      shape: {
        queryTokens: embedder.inputIds(q.query).length, topK: cfg.rerank ? unique.length : 0, rerankTopN: q.rerankTopN, pairTokens,
        rerankBatch: q.rerankBatch ?? RERANK_BATCH, rerankRuns,
        promptTokens: prompt.ids.length, maxNewTokens: q.maxNewTokens, cachedTokens: gen.cachedTokens ?? 0,
      },
      ...(lease ? { adapter: { name: lease.info.name, key: lease.adapter.key } } : {}),
      ...(gen.steered ? { steered_to_close: true as const } : {}),
    };
  }
}
