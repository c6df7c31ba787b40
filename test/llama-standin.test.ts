/**
 * scripts/gpu/llama-standin.sh's llama-server stand-in answers what bench:rag-gpu's dry run sends it
 * (BENCH_RAG_GPU_STANDIN=1): /health, and /v1/chat/completions streamed as OpenAI chunks, max_tokens pieces
 * of content, a usage chunk with stream_options.include_usage, then [DONE].
 */
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

test('the llama-server stand-in streams chat completions with usage', async () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'ragguard-standin-test-'));
  execFileSync('bash', ['scripts/gpu/llama-standin.sh', dir]);
  const port = 20000 + Math.floor(Math.random() * 20000);
  const proc = spawn(path.join(dir, 'llama-server'), ['-m', 'x.gguf', '--port', String(port)], { stdio: 'ignore' });
  try {
    const base = `http://127.0.0.1:${port}`;
    for (let i = 0; ; i++) {
      if (await fetch(`${base}/health`).then((r) => r.ok, () => false)) break;
      // A generous wait: a loaded 2-core machine can take seconds to start a node process.
      assert.ok(i < 1200, 'the stand-in did not answer /health in 2 minutes');
      await new Promise((r) => setTimeout(r, 100));
    }
    const r = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 3, stream: true, stream_options: { include_usage: true } }),
    });
    assert.match(r.headers.get('content-type') ?? '', /text\/event-stream/);
    const data = (await r.text()).split('\n\n').filter((b) => b.startsWith('data: ')).map((b) => b.slice(6));
    assert.equal(data.at(-1), '[DONE]');
    const chunks = data.slice(0, -1).map((d) => JSON.parse(d) as { choices: { delta?: { content?: string } }[]; usage?: { completion_tokens: number } });
    assert.equal(chunks.filter((c) => c.choices[0]?.delta?.content).length, 3);
    assert.equal(chunks.at(-1)?.usage?.completion_tokens, 3);
  } finally {
    proc.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
});
