/**
 * Structured outputs on the default model: how often a `json_schema` reply parses and validates, with
 * the constraint and without it (the same prompts), and what the constraint costs in decode tokens/s,
 * through the official `openai` client against the real server on loopback (RagService + the express
 * app, an index of the shipped corpus in a temporary directory).
 *
 * Prompts: the first BENCH_N (default 100) questions of data/questions.json, the k-th paired with
 * schema variant k % 5 (SCHEMAS below: an answer with a confidence, a command list, a yes/no verdict, a
 * list of steps as objects, a file-and-command object with a nullable field and an enum), as a system
 * message asking for JSON with those fields and the question as the user message; greedy,
 * max_tokens BENCH_MAX_TOKENS (default 192). A reply counts as valid when it parses and validates
 * against its schema (json-schema.ts's validator of the subset).
 *
 * Phases, in this order:
 *   constrained_1  each prompt with response_format json_schema, one at a time
 *   free_1         the same prompts without response_format, one at a time
 *   mixed_8        every prompt constrained, interleaved with the same prompts free, 8 in flight (so
 *                  each step's batch mixes constrained and free rows)
 *   constrained_8, free_8   each set alone at 8 in flight
 * Streamed (stream_options.include_usage), so that decode tokens/s is the tokens after the first over
 * the time from the first to the last content chunk, summed over requests (per stream); aggregate
 * tokens/s is all completion tokens over the phase's wall time.
 *
 * Last line of stdout: JSON with valid counts (constrained alone, in the mixed batches, free), decode
 * and aggregate tokens/s per phase, the ratios constrained / free at 1 and 8 (goal >= 0.9), and the
 * machine's load average before and after.
 */
import type { AddressInfo } from 'node:net';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { loadConfig } from '../src/config/config.js';
import { validates } from '../src/generate/structured/json-schema.js';
import { RagService } from '../src/service/rag.js';
import { createApp } from '../src/server/app.js';

const ROOT = path.resolve(import.meta.dirname, '..');
const N = Number(process.env['BENCH_N'] ?? 100);
const MAX_TOKENS = Number(process.env['BENCH_MAX_TOKENS'] ?? 192);
const BATCH = 8;

const SCHEMAS: { name: string; schema: Record<string, unknown> }[] = [
  { name: 'answer', schema: { type: 'object', properties: { answer: { type: 'string' }, confidence: { type: 'number' } }, required: ['answer', 'confidence'], additionalProperties: false } },
  { name: 'commands', schema: { type: 'object', properties: { commands: { type: 'array', items: { type: 'string' } }, needs_root: { type: 'boolean' } }, required: ['commands', 'needs_root'], additionalProperties: false } },
  { name: 'verdict', schema: { type: 'object', properties: { verdict: { enum: ['yes', 'no', 'depends'] }, reason: { type: 'string' } }, required: ['verdict', 'reason'], additionalProperties: false } },
  { name: 'steps', schema: { type: 'object', properties: { steps: { type: 'array', items: { type: 'object', properties: { n: { type: 'integer' }, action: { type: 'string' } }, required: ['n', 'action'], additionalProperties: false } } }, required: ['steps'], additionalProperties: false } },
  { name: 'config', schema: { type: 'object', properties: { file: { type: ['string', 'null'] }, command: { type: 'string' }, kind: { enum: ['package', 'service', 'file', 'user', 'other'] } }, required: ['file', 'command', 'kind'], additionalProperties: false } },
];

const indexDir = await mkdtemp(path.join(tmpdir(), 'ragguard-bench-structured-'));
const cfg = loadConfig({ ...process.env, PORT: '0', RAGGUARD_INDEX_DIR: indexDir, RAGGUARD_MAX_CONCURRENT: '64', RAGGUARD_QUEUE_LENGTH: '512' });
const service = await RagService.start(cfg);
const server = createApp(service).listen(0, '127.0.0.1');
await new Promise((r) => server.once('listening', r));
const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 600_000 });
const model = path.basename(cfg.decoderPath);
const questions = (JSON.parse(await readFile(path.join(ROOT, 'data', 'questions.json'), 'utf8')) as { question: string }[]).map((q) => q.question);
if (questions.length < N) throw new Error(`data/questions.json has ${questions.length} questions, BENCH_N is ${N}`);

interface Prompt {
  k: number;
  schema: (typeof SCHEMAS)[number];
  messages: { role: 'system' | 'user'; content: string }[];
}

const prompts: Prompt[] = Array.from({ length: N }, (_, k) => {
  const schema = SCHEMAS[k % SCHEMAS.length]!;
  return {
    k, schema,
    messages: [
      { role: 'system', content: `Reply with a JSON object only, matching this JSON Schema:\n${JSON.stringify(schema.schema)}` },
      { role: 'user', content: questions[k]! },
    ],
  };
});

interface Result {
  valid: boolean;
  tokens: number;
  /** From the first content chunk to the last, ms. */
  decodeMs: number;
  finish: string;
}

async function one(p: Prompt, constrained: boolean): Promise<Result> {
  const stream = await client.chat.completions.create({
    model, messages: p.messages, max_tokens: MAX_TOKENS, temperature: 0, stream: true, stream_options: { include_usage: true },
    ...(constrained ? { response_format: { type: 'json_schema' as const, json_schema: { name: p.schema.name, schema: p.schema.schema, strict: true } } } : {}),
  });
  let text = '';
  let first: number | undefined;
  let last = 0;
  let tokens = 0;
  let finish = '';
  for await (const chunk of stream) {
    if (chunk.usage) tokens = chunk.usage.completion_tokens;
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.finish_reason) finish = c.finish_reason;
    if (c.delta.content) {
      const now = performance.now();
      first ??= now;
      last = now;
      text += c.delta.content;
    }
  }
  let valid = false;
  try {
    valid = validates(JSON.parse(text), p.schema.schema);
  } catch {
    valid = false;
  }
  return { valid, tokens, decodeMs: first === undefined ? 0 : last - first, finish };
}

interface Phase {
  valid: number;
  requests: number;
  tokens: number;
  seconds: number;
  decodeTokensPerS: number;
  aggregateTokensPerS: number;
  finishLength: number;
}

async function phase(name: string, jobs: { p: Prompt; constrained: boolean }[], concurrency: number, count: (j: { constrained: boolean }) => boolean = () => true): Promise<Phase> {
  const results: (Result & { counted: boolean })[] = [];
  let next = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < jobs.length) {
      const j = jobs[next++]!;
      results.push({ ...(await one(j.p, j.constrained)), counted: count(j) });
    }
  }));
  const seconds = (performance.now() - t0) / 1000;
  const mine = results.filter((r) => r.counted);
  const tokens = results.reduce((s, r) => s + r.tokens, 0);
  const decodeTokens = mine.reduce((s, r) => s + Math.max(0, r.tokens - 1), 0);
  const decodeMs = mine.reduce((s, r) => s + r.decodeMs, 0);
  const out: Phase = {
    valid: mine.filter((r) => r.valid).length, requests: mine.length, tokens, seconds: +seconds.toFixed(1),
    decodeTokensPerS: +(decodeTokens / (decodeMs / 1000)).toFixed(1), aggregateTokensPerS: +(tokens / seconds).toFixed(1),
    finishLength: mine.filter((r) => r.finish === 'length').length,
  };
  console.log(`[bench:structured] ${name}: ${out.valid}/${out.requests} valid, ${out.decodeTokensPerS} decode tokens/s a stream, ${out.aggregateTokensPerS} tokens/s in all, ${out.finishLength} cut at max_tokens (${out.seconds} s)`);
  return out;
}

const load0 = loadavg()[0]!;
// Warm-up: the first requests pay for the vocabulary's masks and the runtime's first allocations.
await one(prompts[0]!, true);
await one(prompts[0]!, false);

const constrained1 = await phase('constrained_1', prompts.map((p) => ({ p, constrained: true })), 1);
const free1 = await phase('free_1', prompts.map((p) => ({ p, constrained: false })), 1);
const mixed8 = await phase('mixed_8 (constrained rows)', prompts.flatMap((p) => [{ p, constrained: true }, { p, constrained: false }]), BATCH, (j) => j.constrained);
const constrained8 = await phase('constrained_8', prompts.map((p) => ({ p, constrained: true })), BATCH);
const free8 = await phase('free_8', prompts.map((p) => ({ p, constrained: false })), BATCH);

server.closeAllConnections();
await new Promise((r) => server.close(r));
await rm(indexDir, { recursive: true, force: true });

const ratio = (a: number, b: number) => +(a / b).toFixed(3);
console.log(JSON.stringify({
  bench: 'structured', model, prompts: N, max_tokens: MAX_TOKENS, schemas: SCHEMAS.map((s) => s.name),
  valid: { constrained_alone: `${constrained1.valid}/${N}`, constrained_mixed_batch_of_8: `${mixed8.valid}/${N}`, unconstrained: `${free1.valid}/${N}` },
  phases: { constrained_1: constrained1, free_1: free1, mixed_8: mixed8, constrained_8: constrained8, free_8: free8 },
  decode_ratio_constrained_over_free: { at_1: ratio(constrained1.decodeTokensPerS, free1.decodeTokensPerS), at_8: ratio(constrained8.decodeTokensPerS, free8.decodeTokensPerS) },
  aggregate_ratio_constrained_over_free: { at_1: ratio(constrained1.aggregateTokensPerS, free1.aggregateTokensPerS), at_8: ratio(constrained8.aggregateTokensPerS, free8.aggregateTokensPerS) },
  goal: 'decode ratio >= 0.9',
  load_avg_1m: { before: +load0.toFixed(2), after: +loadavg()[0]!.toFixed(2) },
}));
process.exit(0);
