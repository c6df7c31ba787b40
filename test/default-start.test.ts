/**
 * The server as the README's first command serves it: `npm start` with the defaults (the default decoder,
 * Qwen2.5-Coder-1.5B, with query-focused context and its grounded adapter coder-grounded-1.5b, so LoRA
 * inputs on; ragguard's CPU kernels; the start-up profile run), not the test models the other tests use; and
 * the same with RAGGUARD_DECODER naming Qwen2.5-Coder-0.5B, whose own adapters then fit (the query adapter
 * is coder-grounded). 41e4b17 broke
 * exactly that second start (the profile run's batched steps fed the SwiGlu op a broadcast LoRA B it
 * refused, so the server never became ready) while every other test passed.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { test } from 'node:test';
import request from 'supertest';
import { loadConfig } from '../src/config/config.js';
import { QWEN_05B_GGUF, ROOT, smallCorpus, tempDir } from './helpers.js';

const GGUF = loadConfig({}).decoderPath;

const missing = (f: string) => (existsSync(f) ? false : `${f} is missing: run npm run setup`);

test('npm start with the default settings becomes ready and answers a /query', { skip: missing(GGUF) }, async () => {
  await startAndAsk({}, /Qwen2\.5-Coder-1\.5B/, 'coder-grounded-1.5b');
});

test('npm start on Qwen2.5-Coder-0.5B (setup\'s adapters, LoRA inputs) becomes ready and answers with coder-grounded', { skip: missing(QWEN_05B_GGUF) }, async () => {
  await startAndAsk({ RAGGUARD_DECODER: QWEN_05B_GGUF }, /Qwen2\.5-Coder-0\.5B/, 'coder-grounded');
});

/** npm start with only `extra` set of RAGGUARD_*; its /v1/models names `model`, and a /query answers with `adapter`. */
async function startAndAsk(extra: Record<string, string>, model: RegExp, adapter: string | null): Promise<void> {
  // Only what a test must set: a free port, its own index, a small corpus (ingesting the whole one is not
  // the subject). Every RAGGUARD_* the caller's environment carries is dropped: the defaults are the subject.
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('RAGGUARD_') && v !== undefined) env[k] = v;
  Object.assign(env, { PORT: '0', RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: await smallCorpus(4) }, extra);
  const proc = spawn('npm', ['start', '--silent'], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  proc.stdout!.on('data', (c: Buffer) => (out += c.toString()));
  proc.stderr!.on('data', (c: Buffer) => (out += c.toString()));
  const exited = new Promise<number | null>((resolve) => proc.on('exit', (code) => resolve(code)));
  try {
    const port = await new Promise<number>((resolve, reject) => {
      proc.stdout!.on('data', () => {
        const m = /ready on http:\/\/[^:]+:(\d+)/.exec(out);
        if (m) resolve(Number(m[1]));
      });
      void exited.then((code) => reject(new Error(`npm start exited (${code}) before it was ready:\n${out.slice(-4000)}`)));
    });
    const base = `http://127.0.0.1:${port}`;
    assert.equal((await request(base).get('/healthz')).status, 200);
    const models = await request(base).get('/v1/models');
    assert.equal(models.status, 200);
    assert.ok((models.body.data as { id: string }[]).some((m) => model.test(m.id)), `${model} serves: ${JSON.stringify(models.body)}`);
    const res = await request(base).post('/query').send({ query: 'Which command shows the packages a file belongs to?' });
    assert.equal(res.status, 200, JSON.stringify(res.body));
    assert.equal(typeof res.body.answer, 'string');
    assert.ok(res.body.answer.length > 0, 'an answer');
    assert.ok(Array.isArray(res.body.citations) && res.body.citations.length > 0, 'with citations');
    assert.equal((res.body.adapter as { name?: string } | undefined)?.name ?? null, adapter, 'the query adapter RAGGUARD_QUERY_ADAPTER=auto chose');
  } finally {
    proc.kill('SIGTERM');
    await exited;
  }
}
