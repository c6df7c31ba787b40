/**
 * Training examples for the grounded-answer adapter (scripts/train-grounded-lora.py), one JSON line per
 * question of data/questions.json's tune split (never the held-out one): the prompt exactly as POST
 * /query builds it for the question with the configured decoder (retrieval, rerank, the decoder's chat
 * template, RAGGUARD_CONTEXT_SENTENCES and the RAG template, in a budget of `--budget` tokens) and the gold answer's tokens
 * followed by the decoder's end of turn:
 *
 *   {"id": "q001", "prompt": [ids...], "target": [ids...]}
 *
 *   npx tsx scripts/grounded-lora-data.ts <out.jsonl> [--budget 320]
 *
 * A smaller budget than the server's (RAGGUARD_PROMPT_BUDGET) keeps the sequences short enough to train on
 * two CPU cores: the best-ranked chunks stay, the rest are cut as the server cuts them.
 */
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { parseQuestions } from '../bench/questions.js';
import { loadConfig } from '../src/config/config.js';
import { chatContextPrompt } from '../src/generate/chat-prompt.js';
import { assemblePrompt } from '../src/generate/prompt.js';
import { focusText, queryStems } from '../src/retrieval/focus.js';
import { RagService } from '../src/service/rag.js';

const { values, positionals } = parseArgs({ allowPositionals: true, options: { budget: { type: 'string', default: '320' } } });
const out = positionals[0];
if (!out) throw new Error('usage: tsx scripts/grounded-lora-data.ts <out.jsonl> [--budget 320]');
const budget = Number(values.budget);
const ROOT = path.resolve(import.meta.dirname, '..');
const questions = parseQuestions(JSON.parse(await readFile(path.join(ROOT, 'data', 'questions.json'), 'utf8'))).filter((q) => q.split === 'tune');
const indexDir = await mkdtemp(path.join(tmpdir(), 'ragguard-lora-data-'));
try {
  const cfg = loadConfig({ ...process.env, RAGGUARD_INDEX_DIR: indexDir, RAGGUARD_CORPUS_DIR: 'data/corpus', RAGGUARD_PROFILE_RUN: 'false' });
  const service = await RagService.start(cfg);
  const { decoder } = service.models;
  // The end of the assistant's turn as the engine stops on it (Qwen's <|im_end|> comes first).
  const eot = [...service.engine.runner.eosIds][0];
  if (eot === undefined) throw new Error('the decoder names no end-of-sequence token');
  const lines: string[] = [];
  for (const q of questions) {
    let prompt: number[] | undefined;
    // The server's own path to the prompt (retrieval, rerank, template); one token generated and dropped.
    await service.query({
      query: q.question, topK: cfg.defaultTopK, rerankTopN: cfg.defaultRerankTopN, maxNewTokens: 1, temperature: 0, promptBudget: budget,
      promptFor: async (whole, b, between) => {
        // A promptFor turns the server's RAGGUARD_CONTEXT_SENTENCES off (chats keep whole chunks), so the
        // focusing a plain /query does is done here, as the pipeline does it.
        const stems = cfg.contextSentences > 0 ? queryStems(q.question) : undefined;
        const chunks = stems ? whole.map((c) => ({ ...c, text: focusText(stems, c.text, cfg.contextSentences) })) : whole;
        const p = service.chat ? await chatContextPrompt(service.chat, service.template, [{ role: 'user', content: q.question }], chunks, b, between)
          : assemblePrompt(decoder.tokenizer, service.template, service.promptBosId, q.question, chunks, b);
        prompt = p.ids;
        return p;
      },
    });
    const target = [...decoder.tokenizer.encode(q.answer), eot];
    lines.push(JSON.stringify({ id: q.id, prompt, target }));
  }
  await writeFile(out, `${lines.join('\n')}\n`);
  const lengths = lines.map((l) => { const x = JSON.parse(l) as { prompt: number[]; target: number[] }; return x.prompt.length + x.target.length; });
  console.log(`[lora-data] ${questions.length} tune questions -> ${out}; sequence length max ${Math.max(...lengths)}, mean ${(lengths.reduce((a, b) => a + b, 0) / lengths.length).toFixed(0)}`);
} finally {
  await rm(indexDir, { recursive: true, force: true });
}
