/**
 * The `ragguard` command (bin/ragguard.js runs this through tsx):
 *
 *   ragguard serve                     the HTTP server (serve.ts, as npm start; configured by RAGGUARD_* variables)
 *   ragguard ingest <folder> [opts]    a tree of .txt, .md and .html files into a RUNNING server, over
 *                                      HTTP (PUT /documents/:id per file: ingesting the tree again
 *                                      replaces what it ingested before); a progress bar on stderr,
 *                                      then what was created, replaced, failed and skipped, and why
 *   ragguard ingest <folder> --direct  the same straight into the index on disk (RAGGUARD_INDEX_DIR), for
 *                                      when no server runs on it (the library's ingestDirect): one snapshot write
 *   ragguard query "question" [opts]  asks a running server (POST /query): the answer and its citations
 *   ragguard rerank --query Q doc...   scores documents against Q with a running server's reranker
 *                                      (POST /v1/rerank): most relevant first, with their scores
 *   ragguard migrate [--status]        brings the Postgres store's schema (RAGGUARD_STORE) to this
 *                                      build's version (migrate.ts), with a role that owns the schema
 *
 * The commands are users of the library (src/index.ts) and of nothing else in src/: over HTTP, or its calls.
 *
 * Options: --url URL (else RAGGUARD_URL, else http://$HOST:$PORT with the server's defaults),
 * --key KEY (else RAGGUARD_ADMIN_KEY for ingest, RAGGUARD_API_KEY for query), --json (the report or
 * reply as JSON on stdout), for query --top-k N, --rerank-top-n N, --max-tokens N, for rerank --top-n N.
 * Exit status: 0 done, 1 a request failed (or a file could not be ingested), 2 bad usage.
 */
import { parseArgs } from 'node:util';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { ingestDirect, readFolder, type Skipped } from '../index.js';
import { migrateCommand, MigrateUsageError } from './migrate.js';
import { ProgressBar } from './progress.js';

const USAGE = `usage:
  ragguard serve
  ragguard ingest <folder> [--url URL] [--key KEY] [--json]
  ragguard ingest <folder> --direct [--json]      (into RAGGUARD_INDEX_DIR, no server running on it)
  ragguard query "question" [--url URL] [--key KEY] [--top-k N] [--rerank-top-n N] [--max-tokens N] [--json]
  ragguard rerank --query "question" doc1 doc2 ... [--url URL] [--key KEY] [--top-n N] [--json]
  ragguard migrate [--store URL] [--dimension N] [--grant ROLE] [--status] [--json]   (the Postgres schema, RAGGUARD_STORE)`;

class UsageError extends Error {}

function baseUrl(given: string | undefined): string {
  const env = process.env;
  const url = given ?? env['RAGGUARD_URL'] ?? `http://${env['HOST'] ?? '127.0.0.1'}:${env['PORT'] ?? '8080'}`;
  return url.replace(/\/+$/, '');
}

interface Reply {
  status: number;
  body: Record<string, unknown>;
}

async function call(url: string, method: string, key: string | undefined, body?: unknown): Promise<Reply> {
  let res: Response;
  try {
    res = await fetch(url, {
      method,
      headers: { ...(body !== undefined ? { 'Content-Type': 'application/json' } : {}), ...(key ? { Authorization: `Bearer ${key}` } : {}) },
      ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
    });
  } catch (e) {
    const cause = (e as { cause?: { code?: string } }).cause?.code ?? (e as Error).message;
    throw new Error(`cannot reach the server at ${url} (${cause}): is 'ragguard serve' running there? (--url, RAGGUARD_URL)`);
  }
  const text = await res.text();
  let parsed: Record<string, unknown>;
  try {
    parsed = JSON.parse(text) as Record<string, unknown>;
  } catch {
    parsed = { error: { code: 'not_json', message: text.slice(0, 200) } };
  }
  return { status: res.status, body: parsed };
}

const errorText = (r: Reply) => {
  const e = r.body['error'] as { code?: string; message?: string } | undefined;
  return `${r.status} ${e?.code ?? ''}: ${e?.message ?? JSON.stringify(r.body)}`;
};

async function ingest(args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args, allowPositionals: true, options: { url: { type: 'string' }, key: { type: 'string' }, json: { type: 'boolean' }, direct: { type: 'boolean' } } });
  if (positionals.length !== 1) throw new UsageError('ingest takes one folder');
  if (values.direct && (values.url !== undefined || values.key !== undefined)) throw new UsageError('--direct writes the index on disk: no --url or --key');
  const folder = path.resolve(positionals[0]!);
  const url = baseUrl(values.url);
  const key = values.key ?? process.env['RAGGUARD_ADMIN_KEY'] ?? process.env['RAGGUARD_API_KEY'];
  const maxBytes = Number(process.env['RAGGUARD_MAX_DOCUMENT_BYTES'] ?? 2000000);
  const { documents, skipped } = await readFolder(folder, maxBytes);
  if (values.direct) {
    const bar = new ProgressBar(documents.length);
    bar.update(0, `${documents.length} documents from ${folder}: embedding`);
    const r = await ingestDirect(documents, (done, label) => bar.update(done, label), { env: process.env });
    bar.end();
    const report = { folder, index_dir: r.indexDir, created: r.created.length, replaced: r.replaced.length, chunks: r.chunks, failed: [], skipped };
    if (values.json) process.stdout.write(`${JSON.stringify(report)}\n`);
    else {
      const lines = [`ingested ${documents.length} documents from ${folder} into the index at ${r.indexDir}: ${r.created.length} new, ${r.replaced.length} replaced, ${r.chunks} chunks`];
      if (skipped.length) lines.push(`skipped (${skipped.length}):`, ...skipped.map((s) => `  ${s.file}: ${s.reason}`));
      process.stdout.write(`${lines.join('\n')}\n`);
    }
    return 0;
  }
  const created: string[] = [];
  const replaced: string[] = [];
  const failed: Skipped[] = [];
  let chunks = 0;
  const bar = new ProgressBar(documents.length);
  bar.update(0, `${documents.length} documents from ${folder} into ${url}`);
  for (const [i, d] of documents.entries()) {
    // The file itself, read by the server as it reads any upload (its pages and sections kept).
    const file = { content: (await readFile(d.fullPath)).toString('base64'), filename: path.basename(d.file) };
    const r = await call(`${url}/documents/${encodeURIComponent(d.docId)}`, 'PUT', key, file);
    if (r.status === 200 || r.status === 201) {
      (r.status === 201 ? created : replaced).push(d.file);
      chunks += Number((r.body['document'] as { chunks?: number } | undefined)?.chunks ?? 0);
    } else {
      failed.push({ file: d.file, reason: errorText(r) });
      // Nothing more can go in without the right key or a server: stop at the first such reply.
      if (r.status === 401 || r.status === 403) {
        bar.end();
        break;
      }
    }
    bar.update(i + 1, d.file);
  }
  bar.end();
  const report = { folder, url, created: created.length, replaced: replaced.length, chunks, failed, skipped };
  if (values.json) {
    process.stdout.write(`${JSON.stringify(report)}\n`);
  } else {
    const lines = [`ingested ${created.length + replaced.length} of ${documents.length} documents from ${folder} into ${url}: ${created.length} new, ${replaced.length} replaced, ${chunks} chunks`];
    if (failed.length) lines.push(`failed (${failed.length}):`, ...failed.map((f) => `  ${f.file}: ${f.reason}`));
    if (skipped.length) lines.push(`skipped (${skipped.length}):`, ...skipped.map((s) => `  ${s.file}: ${s.reason}`));
    process.stdout.write(`${lines.join('\n')}\n`);
  }
  return failed.length > 0 ? 1 : 0;
}

async function query(args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args, allowPositionals: true,
    options: { url: { type: 'string' }, key: { type: 'string' }, json: { type: 'boolean' }, 'top-k': { type: 'string' }, 'rerank-top-n': { type: 'string' }, 'max-tokens': { type: 'string' } },
  });
  if (positionals.length !== 1 || positionals[0]!.trim() === '') throw new UsageError('query takes one quoted question');
  const int = (name: string, v: string | undefined) => {
    if (v === undefined) return undefined;
    if (!/^\d+$/.test(v)) throw new UsageError(`--${name} takes a positive integer`);
    return Number(v);
  };
  const body = {
    query: positionals[0],
    top_k: int('top-k', values['top-k']), rerank_top_n: int('rerank-top-n', values['rerank-top-n']), max_new_tokens: int('max-tokens', values['max-tokens']),
  };
  const r = await call(`${baseUrl(values.url)}/query`, 'POST', values.key ?? process.env['RAGGUARD_API_KEY'], body);
  return printReply('query', r, values.json, () => {
    const citations = (r.body['citations'] as { doc_id: string; title: string; score: number }[] | undefined) ?? [];
    return [String(r.body['answer']), '', ...citations.map((c, i) => `[${i + 1}] ${c.title} (${c.doc_id}, score ${c.score.toFixed(2)})`)];
  });
}

/** A reply on stdout (its JSON with --json, else `lines`) and exit 0, or its error on stderr and exit 1. */
function printReply(cmd: string, r: Reply, json: boolean | undefined, lines: () => string[]): number {
  if (r.status !== 200) {
    process.stderr.write(`ragguard ${cmd}: ${errorText(r)}\n`);
    return 1;
  }
  process.stdout.write(`${json ? JSON.stringify(r.body) : lines().join('\n')}\n`);
  return 0;
}

async function rerank(args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args, allowPositionals: true,
    options: { url: { type: 'string' }, key: { type: 'string' }, json: { type: 'boolean' }, query: { type: 'string' }, 'top-n': { type: 'string' } },
  });
  if (values.query === undefined || values.query.trim() === '') throw new UsageError('rerank needs --query "question"');
  if (positionals.length === 0) throw new UsageError('rerank takes one or more documents after --query');
  const topN = values['top-n'];
  if (topN !== undefined && !/^[1-9]\d*$/.test(topN)) throw new UsageError('--top-n takes a positive integer');
  const body = { query: values.query, documents: positionals, ...(topN !== undefined ? { top_n: Number(topN) } : {}) };
  const r = await call(`${baseUrl(values.url)}/v1/rerank`, 'POST', values.key ?? process.env['RAGGUARD_API_KEY'], body);
  return printReply('rerank', r, values.json, () => {
    const results = r.body['results'] as { index: number; relevance_score: number; document?: { text: string } }[];
    return results.map((x) => `${x.relevance_score.toFixed(4)}  [${x.index + 1}] ${x.document?.text ?? positionals[x.index]}`);
  });
}

async function main(argv: string[]): Promise<number> {
  const [cmd, ...rest] = argv;
  switch (cmd) {
    case 'serve':
      if (rest.length > 0) throw new UsageError('serve takes no arguments: configure it with RAGGUARD_* variables (README)');
      await import('./serve.js');
      return -1; // the server runs on; its own signals end the process
    case 'ingest':
      return ingest(rest);
    case 'query':
      return query(rest);
    case 'rerank':
      return rerank(rest);
    case 'migrate':
      return migrateCommand(rest);
    case 'help':
    case '--help':
    case '-h':
      process.stdout.write(`${USAGE}\n`);
      return 0;
    default:
      throw new UsageError(cmd === undefined ? 'a command is needed' : `unknown command '${cmd}'`);
  }
}

main(process.argv.slice(2)).then(
  (code) => {
    if (code >= 0) process.exitCode = code;
  },
  (e: unknown) => {
    if (e instanceof UsageError || e instanceof MigrateUsageError || (e as { code?: string }).code?.startsWith('ERR_PARSE_ARGS')) {
      process.stderr.write(`ragguard: ${(e as Error).message}\n${USAGE}\n`);
      process.exitCode = 2;
    } else {
      process.stderr.write(`ragguard: ${(e as Error).message}\n`);
      process.exitCode = 1;
    }
  },
);
