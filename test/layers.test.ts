/**
 * The code's map holds: src/ is in layers, each importing only from its own layer or those below it,
 * and no module imports itself through a circle of others. Read from the import statements of the
 * sources (type-only imports included: a circle of types is still a circle to a reader).
 *
 *   config < runtime < generate < backends < retrieval < guards < service < server < library < index.ts < cli
 *
 * library/ is the API (the service, serve(), folders, direct ingest, the schema), index.ts its one door,
 * and cli/ (the `ragguard` command and the server's process, `npm start`) uses that door alone.
 *
 * Within backends, ort and cuda are siblings: neither imports the other. Both implement the interfaces of
 * backends/'s own top-level modules (backend.ts: DecoderBackend, EncoderBackend), which import neither.
 *
 * HTTP is server/'s alone: no layer below it (nor the library's entry) names an HTTP status or header in
 * its code. They refuse with their own error types (runtime/errors.ts and the layers' own), which
 * server/errors.ts maps to statuses.
 */
import assert from 'node:assert/strict';
import { readFileSync, readdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

const SRC = path.resolve(import.meta.dirname, '..', 'src');
const LAYERS = ['config', 'runtime', 'generate', 'backends', 'retrieval', 'guards', 'service', 'server', 'library', 'index.ts', 'cli'];

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((n) => {
    const p = path.join(dir, n);
    return statSync(p).isDirectory() ? sources(p) : n.endsWith('.ts') ? [p] : [];
  });
}

/** Relative imports of each source file, resolved to source paths. */
function importGraph(): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  for (const file of sources(SRC)) {
    const text = readFileSync(file, 'utf8');
    const deps = [...text.matchAll(/(?:^|\n)\s*(?:import|export)\s[^;]*?from\s+'(\.{1,2}\/[^']+)'|import\(\s*'(\.{1,2}\/[^']+)'\s*\)/g)]
      .map((m) => path.resolve(path.dirname(file), (m[1] ?? m[2])!).replace(/\.js$/, '.ts'));
    graph.set(file, deps);
  }
  return graph;
}

const rel = (f: string) => path.relative(SRC, f);
const layerOf = (f: string) => {
  const top = rel(f).split(path.sep)[0]!;
  const i = LAYERS.indexOf(top);
  if (i < 0) throw new Error(`${rel(f)} is in no layer (add its folder to LAYERS in test/layers.test.ts, in its place)`);
  return i;
};

test('every import goes to the same layer or one below it', () => {
  const upward: string[] = [];
  for (const [file, deps] of importGraph()) {
    for (const d of deps) {
      if (layerOf(d) > layerOf(file)) upward.push(`${rel(file)} -> ${rel(d)}`);
      const [a, b] = [rel(file).split(path.sep), rel(d).split(path.sep)];
      // Into another backend's folder: a sibling's (ort <-> cuda), or the shared interfaces' reaching down into one.
      if (a[0] === 'backends' && b[0] === 'backends' && a[1] !== b[1] && b.length > 2) upward.push(`${rel(file)} -> ${rel(d)} (sibling backends)`);
    }
  }
  assert.deepEqual(upward, []);
});

test('the CLI and the server process use the library through src/index.ts alone', () => {
  const INDEX = path.join(SRC, 'index.ts');
  const reached: string[] = [];
  for (const [file, deps] of importGraph()) {
    if (rel(file).split(path.sep)[0] !== 'cli') continue;
    for (const d of deps) if (d !== INDEX && rel(d).split(path.sep)[0] !== 'cli') reached.push(`${rel(file)} -> ${rel(d)}`);
  }
  assert.deepEqual(reached, []);
});

test('no circle of imports', () => {
  const graph = importGraph();
  const state = new Map<string, 'open' | 'done'>();
  const cycles: string[] = [];
  const visit = (f: string, stack: string[]) => {
    if (state.get(f) === 'done') return;
    if (state.get(f) === 'open') {
      cycles.push([...stack.slice(stack.indexOf(f)), f].map(rel).join(' -> '));
      return;
    }
    state.set(f, 'open');
    for (const d of graph.get(f) ?? []) visit(d, [...stack, f]);
    state.set(f, 'done');
  };
  for (const f of graph.keys()) visit(f, []);
  assert.deepEqual(cycles, []);
});

/** A source's code without its comments (string contents are kept: a status in a string is still one). */
function code(text: string): string {
  return text.replace(/\/\*[\s\S]*?\*\//g, '').replace(/(^|[^:'"`\\])\/\/.*$/gm, '$1');
}

/** What says HTTP in code: the server's error class, a status given to an error or a reply, HTTP's headers by name. */
const HTTP = [
  /\bHttpError\b/,
  /\bnew\s+\w+\(\s*[1-5]\d\d\s*,/, // new SomeError(413, ...)
  /\bstatus(Code)?\s*:\s*[1-5]\d\d\b/, // { status: 503 }
  /\.(status|writeHead)\(\s*[1-5]\d\d\b/, // res.status(404)
  /['"](Retry-After|WWW-Authenticate)['"]/i,
];

test('no HTTP status outside server/: the layers below it, and the library, refuse with their own error types', () => {
  const found: string[] = [];
  for (const file of sources(SRC)) {
    const top = rel(file).split(path.sep)[0]!;
    // server/ speaks HTTP; the CLI is an HTTP client of the server (it reads replies' statuses).
    if (top === 'server' || top === 'cli') continue;
    code(readFileSync(file, 'utf8')).split('\n').forEach((line, i) => {
      if (HTTP.some((r) => r.test(line))) found.push(`${rel(file)}:${i + 1}: ${line.trim()}`);
    });
  }
  assert.deepEqual(found, []);
});

/**
 * No `instanceof` of a backend's class (Cuda*, Ort*, the ONNX decoder) outside src/backends/: the rest
 * reaches a backend through what every backend offers (backends/backend.ts: DecoderBackend,
 * EncoderBackend). Which backend loads is picked by configuration (service/bootstrap.ts), never by class.
 */
test('no instanceof of a backend class outside backends/', () => {
  const found: string[] = [];
  for (const file of sources(SRC)) {
    if (rel(file).split(path.sep)[0] === 'backends') continue;
    code(readFileSync(file, 'utf8')).split('\n').forEach((line, i) => {
      if (/\binstanceof\s+(Cuda\w+|Ort\w+|DecoderModel)\b/.test(line)) found.push(`${rel(file)}:${i + 1}: ${line.trim()}`);
    });
  }
  assert.deepEqual(found, []);
});
