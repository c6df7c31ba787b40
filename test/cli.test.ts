/**
 * The `ragguard` CLI, spawned as a user runs it (node bin/ragguard.js): ingest a folder tree into a
 * running server over HTTP (titles, HTML stripped, skips reported, a second run replaces), query it,
 * keys, usage errors, and `ragguard serve` starting a server that logs its capacity and answers.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdir, symlink, writeFile } from 'node:fs/promises';
import type { Server } from 'node:http';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { loadModels, RagService, type Models } from '../src/service/rag.js';
import { createApp } from '../src/server/app.js';
import { createLogger } from '../src/server/logging.js';
import { parseHtmlText } from '../src/retrieval/files/html.js';
import { parseMarkdownText } from '../src/retrieval/files/markdown.js';
import { ROOT, smallCorpus, tempDir, TEST_ENV, testConfig, faiss } from './helpers.js';

const BIN = path.join(ROOT, 'bin', 'ragguard.js');
const ADMIN = 'admin-key-for-cli-tests';
let models: Models;
let service: RagService;
const servers: Server[] = [];
let url: string;
let keyedUrl: string;
let tree: string;

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

function ragguard(args: string[], env: Record<string, string> = {}): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BIN, ...args], { cwd: ROOT, env: { ...process.env, ...TEST_ENV, ...env } });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

function listen(s: RagService): Promise<string> {
  return new Promise((resolve) => {
    const server = createApp(s, { logger: createLogger('silent') }).listen(0, '127.0.0.1', () => {
      const a = server.address();
      resolve(`http://127.0.0.1:${typeof a === 'object' && a ? a.port : 0}`);
    });
    servers.push(server);
  });
}

before(async () => {
  const cfg = testConfig({ RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: '', RAGGUARD_PROFILE_RUN: 'false' });
  models = await loadModels(cfg);
  service = await RagService.start(cfg, models);
  url = await listen(service);
  const keyed = await RagService.start(testConfig({ RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: '', RAGGUARD_PROFILE_RUN: 'false', RAGGUARD_ADMIN_KEY: ADMIN }), models);
  keyedUrl = await listen(keyed);

  tree = await tempDir('ragguard-tree-');
  await mkdir(path.join(tree, 'guide', 'deep'), { recursive: true });
  await mkdir(path.join(tree, '.git'));
  await writeFile(path.join(tree, 'readme.md'), '# Lighthouse keeping\n\nThe keeper winds the clockwork lens every four hours through the night.\n');
  await writeFile(path.join(tree, 'guide', 'tides.html'),
    '<html><head><title>Tide tables</title><style>p{color:red}</style><script>var x = "never indexed";</script></head>' +
    '<body><h1>Tides</h1><p>Spring tides at the harbour rise 4&nbsp;metres &amp; flood the quay.</p><!-- hidden comment --></body></html>');
  await writeFile(path.join(tree, 'guide', 'deep', 'fog-signals.txt'), 'Fog signals sound two blasts every minute when visibility drops below one mile.\n');
  await writeFile(path.join(tree, 'guide', 'empty.md'), '');
  await writeFile(path.join(tree, 'guide', 'markup-only.html'), '<html><body><div><span></span></div></body></html>');
  await writeFile(path.join(tree, 'photo.png'), Buffer.from([0x89, 0x50, 0x4e, 0x47, 0, 1, 2]));
  await writeFile(path.join(tree, 'binary.txt'), Buffer.from([0x41, 0, 0x42]));
  await writeFile(path.join(tree, '.secret.md'), '# no');
  await writeFile(path.join(tree, '.git', 'HEAD'), 'ref: refs/heads/main');
  await symlink(path.join(tree, 'guide'), path.join(tree, 'loop'));
});

after(() => {
  for (const s of servers) s.close();
});

describe('ragguard ingest', () => {
  test('a tree of .txt, .md and .html goes in over HTTP; what is skipped is reported with why', async () => {
    const r = await ragguard(['ingest', tree, '--url', url, '--json']);
    assert.equal(r.code, 0, r.stderr);
    const report = JSON.parse(r.stdout) as { created: number; replaced: number; chunks: number; failed: unknown[]; skipped: { file: string; reason: string }[] };
    assert.equal(report.created, 3);
    assert.equal(report.replaced, 0);
    assert.deepEqual(report.failed, []);
    const why = Object.fromEntries(report.skipped.map((s) => [s.file, s.reason]));
    assert.deepEqual(Object.keys(why).sort(), ['.git', '.secret.md', 'binary.txt', 'guide/empty.md', 'guide/markup-only.html', 'loop', 'photo.png']);
    assert.match(why['photo.png']!, /unsupported type '\.png'/);
    assert.match(why['guide/empty.md']!, /empty file/);
    assert.match(why['guide/markup-only.html']!, /empty after stripping/);
    assert.match(why['binary.txt']!, /binary/);
    assert.match(why['.git']!, /hidden/);
    assert.match(why['loop']!, /symbolic link to a directory/);
    // The progress bar, on stderr.
    assert.match(r.stderr, /\[#{30}\] 3\/3 100%/);

    const docs = Object.fromEntries([...faiss(service).documents(0, 100)].map((d) => [d.docId, d]));
    assert.deepEqual(Object.keys(docs).sort(), ['guide.deep.fog-signals', 'guide.tides', 'readme']);
    assert.equal(docs['readme']!.title, 'Lighthouse keeping');
    assert.equal(docs['guide.tides']!.title, 'Tide tables');
    assert.equal(docs['guide.deep.fog-signals']!.title, 'fog-signals');
    const tides = faiss(service).chunk(docs['guide.tides']!.chunkIds[0]!).text;
    assert.match(tides, /Spring tides at the harbour rise 4 metres & flood the quay\./);
    assert.ok(!/never indexed|color:red|hidden comment|</.test(tides), tides);
  });

  test('ingesting the tree again replaces, never duplicates; the human report names the skips', async () => {
    const r = await ragguard(['ingest', tree, '--url', url]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /ingested 3 of 3 documents .*: 0 new, 3 replaced/);
    assert.match(r.stdout, /skipped \(7\):\n/);
    assert.match(r.stdout, /photo\.png: unsupported type/);
    assert.equal(faiss(service).documentCount, 3);
  });

  test('a server with an admin key: none sent is a failure (exit 1) and nothing goes in; the key from the environment works', async () => {
    const denied = await ragguard(['ingest', tree, '--url', keyedUrl, '--json']);
    assert.equal(denied.code, 1);
    const report = JSON.parse(denied.stdout) as { created: number; failed: { reason: string }[] };
    assert.equal(report.created, 0);
    assert.equal(report.failed.length, 1, 'stops at the first 401');
    assert.match(report.failed[0]!.reason, /^401 unauthorized/);
    const ok = await ragguard(['ingest', tree, '--url', keyedUrl, '--json'], { RAGGUARD_ADMIN_KEY: ADMIN });
    assert.equal(ok.code, 0, ok.stderr);
    assert.equal((JSON.parse(ok.stdout) as { created: number }).created, 3);
  });
});

describe('ragguard ingest --direct', () => {
  test('into the index on disk without a server; a server started on it then serves the documents', async () => {
    const dir = await tempDir();
    const r = await ragguard(['ingest', tree, '--direct', '--json'], { RAGGUARD_INDEX_DIR: dir });
    assert.equal(r.code, 0, r.stderr);
    const report = JSON.parse(r.stdout) as { created: number; replaced: number; chunks: number; index_dir: string; skipped: unknown[] };
    assert.equal(report.created, 3);
    assert.equal(report.index_dir, dir);
    assert.equal(report.skipped.length, 7);
    assert.match(r.stderr, /3\/3 100%/);
    const again = await ragguard(['ingest', tree, '--direct', '--json'], { RAGGUARD_INDEX_DIR: dir });
    assert.equal((JSON.parse(again.stdout) as { replaced: number }).replaced, 3);
    const s = await RagService.start(testConfig({ RAGGUARD_INDEX_DIR: dir, RAGGUARD_CORPUS_DIR: '', RAGGUARD_PROFILE_RUN: 'false' }), models);
    assert.deepEqual(faiss(s).documents(0, 10).map((d) => d.docId).sort(), ['guide.deep.fog-signals', 'guide.tides', 'readme']);
    assert.equal(faiss(s).chunkCount, report.chunks);
    const v = await models.embedder.embed(['spring tides flood the quay']);
    assert.equal(faiss(s).search(v, 1)[0]!.chunk.docId, 'guide.tides');
    assert.equal((await ragguard(['ingest', tree, '--direct', '--url', url])).code, 2);
  });
});

describe('ragguard query and usage', () => {
  test('query prints the answer and its citations; --json the whole reply', async () => {
    const r = await ragguard(['query', 'How often does the keeper wind the lens?', '--url', url, '--max-tokens', '6', '--rerank-top-n', '1']);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /\n\[1\] Lighthouse keeping \(readme, score -?\d+\.\d\d\)\n$/);
    const j = await ragguard(['query', 'When do fog signals sound?', '--url', url, '--max-tokens', '4', '--json']);
    assert.equal(j.code, 0, j.stderr);
    const body = JSON.parse(j.stdout) as { answer: string; citations: { doc_id: string }[]; usage: { completion_tokens: number } };
    assert.equal(body.citations[0]!.doc_id, 'guide.deep.fog-signals');
    assert.ok(body.usage.completion_tokens <= 4);
  });

  test('errors: a server error reply is exit 1 with its code; usage errors are exit 2; no server is a clear message', async () => {
    const bad = await ragguard(['query', 'x', '--url', url, '--top-k', '100000']);
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /400 invalid_body: top_k/);
    for (const args of [[], ['frobnicate'], ['query'], ['ingest'], ['query', 'q', '--top-k', 'many'], ['query', 'q', '--nope']]) {
      const r = await ragguard(args);
      assert.equal(r.code, 2, `${args.join(' ')}: ${r.stderr}`);
      assert.match(r.stderr, /usage:/);
    }
    const gone = await ragguard(['query', 'anything', '--url', 'http://127.0.0.1:9']);
    assert.equal(gone.code, 1);
    assert.match(gone.stderr, /cannot reach the server at http:\/\/127\.0\.0\.1:9/);
  });
});

describe('ragguard rerank', () => {
  test('scores the documents against the query with the server\'s reranker: most relevant first; --json the reply; usage errors exit 2', async () => {
    const docs = ['The cron daemon runs scheduled jobs.', 'Fog signals sound when visibility drops below two miles.'];
    const r = await ragguard(['rerank', '--query', 'When do fog signals sound?', ...docs, '--url', url]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /^[01]\.\d{4} {2}\[2\] Fog signals[^\n]*\n[01]\.\d{4} {2}\[1\] The cron daemon[^\n]*\n$/);
    const j = await ragguard(['rerank', '--query', 'When do fog signals sound?', ...docs, '--url', url, '--top-n', '1', '--json']);
    assert.equal(j.code, 0, j.stderr);
    assert.deepEqual((JSON.parse(j.stdout) as { results: { index: number }[] }).results.map((x) => x.index), [1]);
    for (const args of [['rerank', 'doc'], ['rerank', '--query', 'q'], ['rerank', '--query', 'q', 'd', '--top-n', '0']]) {
      assert.equal((await ragguard(args)).code, 2, args.join(' '));
    }
  });
});

describe('ragguard serve', () => {
  test('starts the server: JSON logs with the capacity summary, then it answers', async () => {
    const corpus = await smallCorpus(0, ['quotas']);
    const child = spawn(process.execPath, [BIN, 'serve'], {
      cwd: ROOT,
      env: { ...process.env, ...TEST_ENV, GLIBC_TUNABLES: '', PORT: '0', RAGGUARD_INDEX_DIR: await tempDir(), RAGGUARD_CORPUS_DIR: corpus, RAGGUARD_PROFILE_RUN: 'false' },
    });
    const logs: Record<string, unknown>[] = [];
    let buf = '';
    const listening = new Promise<string>((resolve, reject) => {
      child.stdout.on('data', (d: Buffer) => {
        buf += d.toString();
        let nl;
        while ((nl = buf.indexOf('\n')) >= 0) {
          const line = JSON.parse(buf.slice(0, nl)) as Record<string, unknown>;
          buf = buf.slice(nl + 1);
          logs.push(line);
          // The server listens at once and says so; this waits for the line that says it is ready.
          if (typeof line['port'] === 'number' && /^ragguard ready on /.test(String(line['msg']))) resolve(`http://127.0.0.1:${line['port']}`);
        }
      });
      child.on('close', (code) => reject(new Error(`serve exited with ${code}: ${buf}`)));
    });
    try {
      const base = await listening;
      const health = await fetch(`${base}/healthz`);
      assert.equal(health.status, 200);
      assert.equal(((await health.json()) as { documents: number }).documents, 1);
      const cap = logs.find((l) => l['capacity'])?.['capacity'] as Record<string, number> | undefined;
      assert.ok(cap, 'a capacity summary');
      assert.ok(cap['kv_blocks']! > 0 && cap['seqs_at_prompt_limit']! >= 1 && cap['budget_bytes']! > cap['kv_pool_bytes']!);
      assert.ok(logs.some((l) => /^# KV blocks: \d+/.test(String(l['msg']))));
      // Which adapter a /query naming none runs with, and why (the test decoder: none fits it, auto says so).
      assert.ok(logs.some((l) => l['query_adapter'] === null && /^query adapter: none \(RAGGUARD_QUERY_ADAPTER=auto: /.test(String(l['msg']))), JSON.stringify(logs.map((l) => l['msg'])));
      assert.ok(logs.some((l) => /maximum concurrency for \d+ tokens per request/.test(String(l['msg']))));
      assert.ok(logs.some((l) => /^ingesting 1 documents/.test(String(l['msg']))));
      assert.ok(logs.some((l) => /^models loaded/.test(String(l['msg']))));
      // The shim started it with scripts/tuned.sh's allocator setting, as npm start does.
      assert.ok(!logs.some((l) => /GLIBC_TUNABLES/.test(String(l['msg']))), 'no allocator warning');
    } finally {
      // Nothing left running: the server closes on SIGTERM.
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGTERM');
      await exited;
    }
  });
});

describe('folder conversion', () => {
  test('HTML to text and titles', () => {
    const html = parseHtmlText('<h2>A &lt;b&gt;</h2><p>x&#39;s &#x263A;<br>y</p>');
    assert.deepEqual(html, { title: 'A <b>', metadata: {}, sections: [{ locator: 'section: A <b>', text: "A <b>\n\nx's \u263A\ny" }] });
    assert.equal(parseMarkdownText('intro\n\n```\n# not a title\n```\n## Real one ##\n').title, 'Real one');
    assert.equal(parseMarkdownText('Setext title\n============\n').title, 'Setext title');
    assert.equal(parseMarkdownText('no heading at all').title, undefined);
  });
});
