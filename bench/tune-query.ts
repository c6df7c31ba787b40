/**
 * Prompt-size and decoding-policy sweep for /query on the TUNING split only (issue 41): one server (the
 * configured decoder, RAGGUARD_DECODER), one kept index, several settings in turn over the same questions,
 * each question through POST /query one at a time, judged as bench:rag judges (bench/answers.ts).
 *
 *   TUNE_GRID   JSON array of settings, each {name, budget?, sentences?, rerank_top_n?, max_new_tokens?, stop?}:
 *               budget is RAGGUARD_PROMPT_BUDGET and sentences RAGGUARD_CONTEXT_SENTENCES for that pass (the
 *               running server's config is changed between passes); the others are sent with each request.
 *   TUNE_LIMIT  the first n tuning questions (default all 122); TUNE_OFFSET skips that many first.
 *   TUNE_INDEX_DIR  the kept index (built on the first run); TUNE_LOG a JSONL file of every answer.
 *
 * Run with RAGGUARD_PREFIX_CACHING=false so that a pass never finds an earlier pass' prompt cached (each
 * latency is a whole prefill). Never run it on the held-out split: that one is for bench:rag's report.
 * Prints one JSON line per setting: exact_fact, fact in the prompt's chunks, prompt tokens (mean), latency
 * p50/p95, completion tokens (mean).
 */
import { appendFile, mkdir, readFile, writeFile } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { loadConfig } from '../src/config/config.js';
import { RagService } from '../src/service/rag.js';
import { createApp } from '../src/server/app.js';
import { echoes, isCorrect } from './answers.js';
import { parseQuestions } from './questions.js';

const ROOT = path.resolve(import.meta.dirname, '..');

interface Setting { name: string; budget?: number; sentences?: number; rerank_top_n?: number; max_new_tokens?: number; stop?: string | string[] }

const quantile = (xs: readonly number[], q: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)]! : NaN;
};

async function main(): Promise<void> {
  const grid = JSON.parse(process.env['TUNE_GRID'] ?? '[{"name":"default"}]') as Setting[];
  const offset = Number(process.env['TUNE_OFFSET'] ?? 0);
  const limit = Number(process.env['TUNE_LIMIT'] ?? Infinity);
  const questions = parseQuestions(JSON.parse(await readFile(path.join(ROOT, 'data', 'questions.json'), 'utf8')))
    .filter((q) => q.split === 'tune').slice(offset, offset + limit);
  const indexDir = process.env['TUNE_INDEX_DIR'] ?? '/tmp/ragguard-tune-index';
  await mkdir(indexDir, { recursive: true });
  const cfg = loadConfig({ ...process.env, RAGGUARD_INDEX_DIR: indexDir, RAGGUARD_CORPUS_DIR: 'data/corpus', RAGGUARD_STORE: 'faiss' });
  const defaultBudget = cfg.promptBudgetTokens;
  const defaultSentences = cfg.contextSentences;
  const service = await RagService.start(cfg);
  const server = createApp(service).listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/query`;
  const logFile = process.env['TUNE_LOG'];
  if (logFile) await writeFile(logFile, '');
  const instruction = service.template.system;
  try {
    for (const s of grid) {
      service.cfg.promptBudgetTokens = s.budget ?? defaultBudget;
      service.cfg.contextSentences = s.sentences ?? defaultSentences;
      const body = (q: string) => JSON.stringify({ query: q, ...(s.rerank_top_n ? { rerank_top_n: s.rerank_top_n } : {}), ...(s.max_new_tokens ? { max_new_tokens: s.max_new_tokens } : {}), ...(s.stop ? { stop: s.stop } : {}) });
      await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: body('warm-up: what is apt?') });
      const lat: number[] = []; const prompt: number[] = []; const completion: number[] = [];
      let correct = 0, inContext = 0, echoed = 0, cited = 0;
      for (const q of questions) {
        const t0 = performance.now();
        const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: body(q.question) });
        const r = (await res.json()) as { answer: string; citations: { doc_id: string; title: string; text: string }[]; usage: { prompt_tokens: number; completion_tokens: number } };
        if (res.status !== 200) throw new Error(`${q.id}: ${res.status} ${JSON.stringify(r)}`);
        const ms = performance.now() - t0;
        const ok = isCorrect(r.answer, q.answer, q.accept);
        const ctx = isCorrect(r.citations.map((c) => `${c.title}\n${c.text}`).join('\n'), q.answer, q.accept);
        const ranks = r.citations.map((c) => c.doc_id === q.doc_id);
        const ech = instruction !== '' && echoes(r.answer, instruction);
        lat.push(ms); prompt.push(r.usage.prompt_tokens); completion.push(r.usage.completion_tokens);
        if (ok) correct++;
        if (ctx) inContext++;
        if (ech) echoed++;
        if (ranks.some(Boolean)) cited++;
        if (logFile) {
          await appendFile(logFile, `${JSON.stringify({ setting: s.name, id: q.id, correct: ok, in_context: ctx, gold_ranks: ranks, fact_per_chunk: r.citations.map((c) => isCorrect(`${c.title}\n${c.text}`, q.answer, q.accept)), ms: Math.round(ms), prompt_tokens: r.usage.prompt_tokens, tokens: r.usage.completion_tokens, gold: q.answer, answer: r.answer })}\n`);
        }
      }
      const n = questions.length;
      const mean = (xs: number[]) => Math.round((xs.reduce((a, b) => a + b, 0) / xs.length) * 10) / 10;
      console.log(JSON.stringify({
        setting: s, decoder: cfg.decoderPath, n, correct, exact_fact: Math.round((correct / n) * 1000) / 1000, fact_in_context: Math.round((inContext / n) * 1000) / 1000,
        gold_doc_cited: Math.round((cited / n) * 1000) / 1000, echoed, prompt_tokens_mean: mean(prompt), completion_tokens_mean: mean(completion),
        p50_ms: Math.round(quantile(lat, 0.5)), p95_ms: Math.round(quantile(lat, 0.95)),
      }));
    }
  } finally {
    server.close();
    await service.close();
  }
}

await main();
