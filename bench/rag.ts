/**
 * RAG benchmark: retrieval and answers on data/questions.json over data/corpus, with the models the
 * configuration names (the defaults, or RAGGUARD_EMBEDDER / RAGGUARD_RERANKER / RAGGUARD_DECODER), in one
 * run on a fresh temporary index.
 *
 * Retrieval, every question, by split (tune, heldout) and overall; a question is found at rank r when
 * the r-th chunk hit is the first one from its document (R@1: r = 1; R@5: r <= 5):
 *   dense          embedder + faiss
 *   bm25           the server's lexical index (MiniSearch BM25)
 *   bm25_baseline  bench/bm25.ts (the project's own BM25, lengths in terms)
 *   fused          dense and BM25 by reciprocal-rank fusion, as configured (RAGGUARD_RRF_*)
 *   fused_rerank   the fused top_k, deduplicated, reranked by the cross-encoder (as the server does)
 * Answers, held-out split by default: each question through POST /query on a real HTTP server on loopback
 * (the server's defaults: top_k, rerank_top_n, max_new_tokens, greedy), one at a time, judged per split:
 *   exact_fact      the answer contains the gold fact (bench/answers.ts: normalised token match of the
 *                   gold answer or an accepted variant: the command, package, path or value)
 *   unreadable      empty, looping or gibberish (bench/answers.ts)
 *   echoed          the answer repeats a run of 5+ words of the prompt's instruction (prompt.ts)
 *   gold_doc_cited  the answering document is among the citations; gold_doc_first: it is the first one
 *   fact_in_context the gold fact occurs in the cited chunks' titles and texts (what a copied span can reach)
 *   length          words of the answer (p50, mean, p95), completion tokens (mean), and the fraction cut
 *                   at max_new_tokens (finish_reason length)
 *   /query latency  p50, p95
 *
 * BENCH_RAG_ADAPTER=name answers every chosen question twice, with the base model and with that LoRA adapter
 * (a name under RAGGUARD_ADAPTER_DIR; e.g. coder-grounded, trained on the tune split), in turn, judged the same
 * way: `answers` is the base model's (asked for with `adapter: null`), `answers_adapter` the adapter's, and
 * `adapter_gain` the difference in correct answers. Without it the questions go as a user's would, naming no
 * adapter: `answers` is what the server's RAGGUARD_QUERY_ADAPTER gives (`query_adapter` names it).
 *
 * BENCH_RAG_ANSWERS=0 skips the answers (retrieval only); BENCH_RAG_RETRIEVAL=0 the retrieval tables (answers only). For prompt work on the tuning split (never the
 * held-out one): BENCH_RAG_SPLIT=tune answers the tuning questions instead (all: both splits, each reported
 * apart), BENCH_RAG_LIMIT=n the first n of each, BENCH_RAG_IDS=id,id,... only those questions (of the chosen split), BENCH_RAG_INDEX_DIR=dir keeps the index there (built on the first run, loaded after: the
 * corpus and embedder must not change in between), BENCH_RAG_LOG=file.jsonl writes every answer (each as it comes).
 * A decoding policy per request: BENCH_RAG_MAX_NEW_TOKENS=n sends max_new_tokens, BENCH_RAG_STOP a stop
 * sequence (a JSON array for several, e.g. '["\n\n"]'); left out, the server's defaults answer.
 * BENCH_RAG_CONCURRENCY=n (default 1) asks the chosen questions n at a time, as n clients would, each taking the
 * next question when its last one is answered: the latencies are then those at n concurrent (answers_wall_s: the
 * whole pass). A run of its own, not a second pass after the one-at-a-time answers: those would leave every
 * prompt in the prefix cache, and the second pass would skip its prefills. Batched decoding may change a greedy
 * answer in the last bits, so its exact_fact can differ slightly from one at a time.
 * RAGGUARD_QUERY_COPY_SPAN=off|first|ticks (the server's setting, config.ts) constrains the answers' code spans to
 * the cited chunks (src/generate/span-answer.ts); the JSON line names it (query_copy_span). RAGGUARD_CONTEXT_SENTENCES=n
 * keeps n sentences of each chunk in the prompt (src/retrieval/focus.ts; context_sentences in the JSON line;
 * fact_in_context still reads the whole cited chunks). bench/tune-query.ts sweeps such settings on the tuning split.
 * Prints tables; the last line is JSON.
 */
import { appendFile, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { loadConfig } from '../src/config/config.js';
import { RagService, readCorpus } from '../src/service/rag.js';
import { dedupe } from '../src/retrieval/prune.js';
import { Retriever } from '../src/retrieval/retriever.js';
import { FaissStore } from '../src/retrieval/faiss-store.js';
import type { Hit } from '../src/retrieval/retrieval-store.js';
import { createApp } from '../src/server/app.js';
import { decodingPolicy, echoes, isCorrect, isUnreadable, words } from './answers.js';
import { Bm25 } from './bm25.js';
import { parseQuestions, type Question, type Split } from './questions.js';

const ALL = { collection: 'default' };
const ROOT = path.resolve(import.meta.dirname, '..');
const K = 5;
const GOAL_R5 = 0.97;
const METHODS = ['dense', 'bm25', 'bm25_baseline', 'fused', 'fused_rerank'] as const;
type Method = (typeof METHODS)[number];

const round = (x: number, d = 4) => Math.round(x * 10 ** d) / 10 ** d;
const quantile = (xs: readonly number[], q: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)]! : NaN;
};

interface Recall { r1: number; r5: number; n: number }

function recall(ranks: readonly number[]): Recall {
  return { r1: ranks.filter((r) => r === 1).length / ranks.length, r5: ranks.filter((r) => r >= 1 && r <= K).length / ranks.length, n: ranks.length };
}

const rankOf = (docIds: readonly string[], want: string) => docIds.indexOf(want) + 1;

interface Answered { ms: number; answer: string; cited: boolean; first: boolean; tokens: number; cut: boolean; context: string }

interface Tally { lat: number[]; words: number[]; tokens: number[]; correct: number; unreadable: number; echoed: number; cited: number; first: number; cut: number; inContext: number; samples: string[] }

const newTally = (): Tally => ({ lat: [], words: [], tokens: [], correct: 0, unreadable: 0, echoed: 0, cited: 0, first: 0, cut: 0, inContext: 0, samples: [] });

function summarize(t: Tally) {
  const n = t.lat.length;
  const mean = (xs: readonly number[]) => xs.reduce((a, b) => a + b, 0) / (xs.length || 1);
  return {
    n, exact_fact: round(t.correct / n), unreadable: round(t.unreadable / n), echoed: round(t.echoed / n),
    gold_doc_cited: round(t.cited / n), gold_doc_first: round(t.first / n), fact_in_context: round(t.inContext / n),
    words_p50: quantile(t.words, 0.5), words_mean: round(mean(t.words), 1), words_p95: quantile(t.words, 0.95),
    completion_tokens_mean: round(mean(t.tokens), 1), cut_at_limit: round(t.cut / n),
    p50_ms: round(quantile(t.lat, 0.5), 1), p95_ms: round(quantile(t.lat, 0.95), 1),
  };
}

async function main(): Promise<void> {
  const questions = parseQuestions(JSON.parse(await readFile(path.join(ROOT, 'data', 'questions.json'), 'utf8')));
  const withAnswers = process.env['BENCH_RAG_ANSWERS'] !== '0';
  const answerSplit = process.env['BENCH_RAG_SPLIT'] ?? 'heldout';
  if (answerSplit !== 'heldout' && answerSplit !== 'tune' && answerSplit !== 'all') throw new Error(`BENCH_RAG_SPLIT must be heldout, tune or all, not '${answerSplit}'`);
  const answerSplits: Split[] = answerSplit === 'all' ? ['heldout', 'tune'] : [answerSplit];
  const limit = Number(process.env['BENCH_RAG_LIMIT'] ?? Infinity);
  const policy = decodingPolicy(process.env);
  const keptIndex = process.env['BENCH_RAG_INDEX_DIR'];
  if (keptIndex) await mkdir(keptIndex, { recursive: true });
  const indexDir = keptIndex ?? await mkdtemp(path.join(tmpdir(), 'ragguard-bench-rag-'));
  try {
    // The embedded store: its chunk table is read whole below (bench:retrieval compares the stores).
    const cfg = loadConfig({ ...process.env, RAGGUARD_INDEX_DIR: indexDir, RAGGUARD_CORPUS_DIR: 'data/corpus', RAGGUARD_STORE: 'faiss' });
    let t = performance.now();
    const service = await RagService.start(cfg);
    const startS = (performance.now() - t) / 1000;
    const { models } = service;
    const store = service.store as FaissStore;
    const { embedder, reranker } = models;
    const missing = questions.filter((q) => !store.has(q.doc_id));
    if (missing.length) throw new Error(`questions name unknown documents: ${missing.map((q) => `${q.id}:${q.doc_id}`).join(', ')}`);

    const depth = Math.max(cfg.defaultTopK, cfg.retrievalDepth);
    const dense = new Retriever(store, { ...cfg, retrieval: 'dense', pruneMargin: 2 });
    const lexical = new Retriever(store, { ...cfg, retrieval: 'lexical' });
    const hybrid = new Retriever(store, { ...cfg, retrieval: 'hybrid' });
    const chunkDoc: string[] = [];
    const texts: string[] = [];
    for (const c of store.allChunks()) {
      chunkDoc.push(c.docId);
      texts.push(`${c.title}\n${c.text}`);
    }
    const baseline = new Bm25(texts, { k1: cfg.bm25K1, b: cfg.bm25B });
    const titled = (h: Hit) => `${h.chunk.title}\n${h.chunk.text}`;
    const docsOf = (hits: readonly Hit[]) => hits.map((h) => h.chunk.docId);

    const ranks: Record<Method, Map<string, number>> = Object.fromEntries(METHODS.map((m) => [m, new Map()])) as Record<Method, Map<string, number>>;
    let rerankFixed = 0;
    let rerankBroke = 0;
    t = performance.now();
    const withRetrieval = process.env['BENCH_RAG_RETRIEVAL'] !== '0';
    for (const q of withRetrieval ? questions : []) {
      const qv = await embedder.embed([q.question]);
      ranks.dense.set(q.id, rankOf(docsOf((await dense.search(qv, q.question, cfg.defaultTopK, ALL)).hits), q.doc_id));
      ranks.bm25.set(q.id, rankOf(docsOf((await lexical.search(qv, q.question, cfg.defaultTopK, ALL)).hits), q.doc_id));
      ranks.bm25_baseline.set(q.id, rankOf(baseline.search(q.question, cfg.defaultTopK).map((h) => chunkDoc[h.index]!), q.doc_id));
      const fused = (await hybrid.search(qv, q.question, cfg.defaultTopK, ALL)).hits;
      const fusedRank = rankOf(docsOf(fused), q.doc_id);
      ranks.fused.set(q.id, fusedRank);
      const unique = dedupe(fused, cfg.dedupeJaccard);
      const { scores } = await reranker.score(q.question, unique.map(titled));
      const reranked = unique.map((hit, i) => ({ hit, score: scores[i]! })).sort((a, b) => b.score - a.score).map((r) => r.hit);
      const rr = rankOf(docsOf(reranked), q.doc_id);
      ranks.fused_rerank.set(q.id, rr);
      if (fusedRank !== 1 && rr === 1) rerankFixed++;
      if (fusedRank === 1 && rr !== 1) rerankBroke++;
    }
    const retrievalS = (performance.now() - t) / 1000;

    const splits = { all: questions, tune: questions.filter((q) => q.split === 'tune'), heldout: questions.filter((q) => q.split === 'heldout') };
    const table: Record<string, Record<Method, Recall>> = {};
    for (const [name, qs] of withRetrieval ? Object.entries(splits) : []) {
      table[name] = Object.fromEntries(METHODS.map((m) => [m, recall(qs.map((q) => ranks[m].get(q.id)!))])) as Record<Method, Recall>;
    }

    console.log(`rag benchmark: ${questions.length} questions (${splits.tune.length} tune, ${splits.heldout.length} held out), ` +
      `${store.documentCount} documents, ${store.chunkCount} chunks; embedder ${path.relative(ROOT, cfg.embedderPath)}, ` +
      `reranker ${path.relative(ROOT, cfg.rerankerPath)}, decoder ${path.relative(ROOT, cfg.decoderPath)}; provider ${embedder.provider}`);
    console.log(`start + ingest ${startS.toFixed(1)} s; retrieval over every question ${retrievalS.toFixed(1)} s; ` +
      `top_k ${cfg.defaultTopK}, fusion depth ${depth}, rrf k ${cfg.rrfK}, weights dense ${cfg.rrfDenseWeight} / bm25 ${cfg.rrfLexicalWeight}`);
    console.log('');
    if (withRetrieval) {
      console.log(`${'method'.padEnd(14)}  ${Object.keys(splits).map((s) => `${s} R@1  ${s} R@5`.padStart(22)).join('  ')}`);
      for (const m of METHODS) {
        console.log(`${m.padEnd(14)}  ${Object.keys(splits).map((s) => `${table[s]![m].r1.toFixed(3)}  ${table[s]![m].r5.toFixed(3)}`.padStart(22)).join('  ')}`);
      }
      console.log(`rerank over fused, top hit: fixed ${rerankFixed}, broke ${rerankBroke} (of ${questions.length})`);
    }

    type Summary = ReturnType<typeof summarize>;
    let answers: Summary | null = null;
    let adapterAnswers: Summary | null = null;
    const bySplit: Partial<Record<Split, { base: Summary; adapter?: Summary }>> = {};
    const adapter = process.env['BENCH_RAG_ADAPTER'] || undefined;
    let asked = 0;
    const concurrency = Math.max(1, Math.floor(Number(process.env['BENCH_RAG_CONCURRENCY'] ?? 1)));
    let wallS = 0;
    if (withAnswers) {
      const vocabulary = new Set<string>();
      for (const d of await readCorpus(cfg.corpusDir)) for (const w of words(`${d.title}\n${d.text}`)) vocabulary.add(w);
      const instruction = service.template.system;
      const server = createApp(service).listen(0, '127.0.0.1');
      await new Promise<void>((resolve) => server.once('listening', () => resolve()));
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/query`;
      const ask = async (q: Question, adapter?: string | null): Promise<Answered> => {
        const t0 = performance.now();
        const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ query: q.question, ...policy, ...(adapter === undefined ? {} : { adapter }) }) });
        const body = (await res.json()) as { answer?: string; citations?: { doc_id: string; title: string; text: string }[]; finish_reason?: string; usage?: { completion_tokens?: number }; error?: { code: string } };
        if (res.status !== 200) throw new Error(`/query ${q.id}: ${res.status} ${JSON.stringify(body.error)}`);
        const citations = body.citations ?? [];
        return {
          ms: performance.now() - t0, answer: body.answer ?? '', cited: citations.some((c) => c.doc_id === q.doc_id), first: citations[0]?.doc_id === q.doc_id,
          tokens: body.usage?.completion_tokens ?? 0, cut: body.finish_reason === 'length', context: citations.map((c) => `${c.title}\n${c.text}`).join('\n'),
        };
      };
      const only = process.env['BENCH_RAG_IDS'] ? new Set(process.env['BENCH_RAG_IDS'].split(',').map((x) => x.trim())) : undefined;
      const chosen = answerSplits.flatMap((sp) => splits[sp].filter((q) => !only || only.has(q.id)).slice(0, limit));
      asked = chosen.length;
      // Written as answered (a long run can be read, or stopped, midway).
      const logFile = process.env['BENCH_RAG_LOG'];
      if (logFile) await writeFile(logFile, '');
      try {
        // Alone, the server's own choice (RAGGUARD_QUERY_ADAPTER's adapter where it has one); beside an
        // adapter, the base model asked for by name (null) so that the two are the base and the adapter.
        const runs: { adapter: string | null | undefined }[] = adapter ? [{ adapter: null }, { adapter }] : [{ adapter: undefined }];
        for (const run of runs) await ask(chosen[0]!, run.adapter); // warm-up, not counted
        const tally = new Map<string, Tally>();
        // BENCH_RAG_CONCURRENCY workers, each taking the next question when its last one is answered.
        let next = 0;
        const t1 = performance.now();
        await Promise.all(Array.from({ length: concurrency }, async () => {
          for (let i = next++; i < chosen.length; i = next++) {
            const q = chosen[i]!;
            for (const run of runs) {
              const r = await ask(q, run.adapter);
              const key = `${q.split}|${run.adapter ?? ''}`;
              const t = tally.get(key) ?? newTally();
              tally.set(key, t);
              t.lat.push(r.ms);
              t.words.push(r.answer.trim().split(/\s+/).filter(Boolean).length);
              t.tokens.push(r.tokens);
              const ok = isCorrect(r.answer, q.answer, q.accept);
              if (ok) t.correct++;
              const bad = isUnreadable(r.answer, vocabulary);
              if (bad) t.unreadable++;
              const echoed = instruction !== '' && echoes(r.answer, instruction);
              if (echoed) t.echoed++;
              if (r.cited) t.cited++;
              if (r.first) t.first++;
              if (r.cut) t.cut++;
              const inContext = isCorrect(r.context, q.answer, q.accept);
              if (inContext) t.inContext++;
              const entry = JSON.stringify({ id: q.id, split: q.split, ...(run.adapter ? { adapter: run.adapter } : {}), correct: ok, unreadable: bad, echoed, cited: r.cited, in_context: inContext, cut: r.cut, ms: Math.round(r.ms), tokens: r.tokens, question: q.question, gold: q.answer, answer: r.answer });
              if (logFile) await appendFile(logFile, `${entry}\n`);
              if (t.samples.length < 5) t.samples.push(`  ${q.id} ${ok ? 'correct' : 'wrong  '} ${JSON.stringify(r.answer.slice(0, 120))} (gold: ${q.answer})`);
            }
          }
        }));
        wallS = round((performance.now() - t1) / 1000, 1);
        for (const sp of answerSplits) {
          for (const run of runs) {
            const t = tally.get(`${sp}|${run.adapter ?? ''}`);
            if (!t) continue;
            const a = summarize(t);
            bySplit[sp] = { ...bySplit[sp]!, [run.adapter ? 'adapter' : 'base']: a };
            console.log('');
            console.log(`answers${run.adapter ? ` with adapter ${run.adapter}` : ''} (${sp === 'heldout' ? 'held out' : 'tuning split'}, ${a.n}): exact fact ${a.exact_fact}, unreadable ${a.unreadable}, ` +
              `instruction echoed ${a.echoed}, gold document cited ${a.gold_doc_cited} (first ${a.gold_doc_first}); words p50 ${a.words_p50}, mean ${a.words_mean}, p95 ${a.words_p95}, ` +
              `cut at the token limit ${a.cut_at_limit}; /query latency p50 ${a.p50_ms} ms, p95 ${a.p95_ms} ms`);
            console.log(t.samples.join('\n'));
          }
        }
        const main = bySplit[answerSplits[0]!];
        answers = main?.base ?? null;
        adapterAnswers = main?.adapter ?? null;
      } finally {
        await new Promise<void>((resolve) => server.close(() => resolve()));
      }
    }

    const h = table['heldout'];
    const a = table['all'];
    const best = a && (cfg.rerank ? a.fused_rerank : a.fused);
    console.log('');
    if (a && best) console.log(`goal R@5 >= ${GOAL_R5} and >= bm25's (all questions, the served first stage ${cfg.rerank ? 'fused + rerank' : 'fused'}): ` +
      `${best.r5 >= GOAL_R5 && best.r5 >= a.bm25.r5 ? 'met' : 'NOT met'} (${best.r5.toFixed(3)} vs bm25 ${a.bm25.r5.toFixed(3)})`);
    const flat = (s: Record<Method, Recall>) => Object.fromEntries(METHODS.flatMap((m) => [[`${m}_r1`, round(s[m].r1)], [`${m}_r5`, round(s[m].r5)]]));
    console.log(JSON.stringify({
      questions: questions.length, heldout_questions: splits.heldout.length, documents: store.documentCount, chunks: store.chunkCount,
      embedder: path.relative(ROOT, cfg.embedderPath), reranker: path.relative(ROOT, cfg.rerankerPath), decoder: path.relative(ROOT, cfg.decoderPath),
      query_adapter: adapter ? null : service.queryAdapter ?? null, retrieval: cfg.retrieval, rerank: cfg.rerank, query_copy_span: cfg.queryCopySpan, context_sentences: cfg.contextSentences, rerank_top_n: cfg.defaultRerankTopN,
      ...(a && h ? { all: flat(a), heldout: flat(h), tune: flat(table['tune']!), rerank_fixed_top1: rerankFixed, rerank_broke_top1: rerankBroke } : {}),
      answers, ...(adapter ? { adapter, answers_adapter: adapterAnswers, adapter_gain: answers && adapterAnswers ? round(adapterAnswers.exact_fact - answers.exact_fact) : null } : {}),
      ...(concurrency > 1 ? { concurrency } : {}), ...(answers ? { answers_wall_s: wallS } : {}),
      ...(answerSplits.length > 1 ? { answers_by_split: bySplit } : {}),
      ...(Object.keys(policy).length ? { decoding: policy } : {}),
      ...(answers && (answerSplit !== 'heldout' || asked < splits.heldout.length) ? { answers_split: answerSplit, answered: asked } : {}),
      start_s: round(startS, 1), ...(keptIndex ? { index_kept: true } : {}), // kept: start_s is a load, not an ingest
      where: embedder.provider,
    }));
  } finally {
    if (!keptIndex) await rm(indexDir, { recursive: true, force: true });
  }
}

await main();
