import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ConfigError, configTable, loadConfig, VARIABLES } from '../src/config/config.js';

test('defaults give a complete, valid configuration', () => {
  const c = loadConfig({});
  assert.equal(c.host, '127.0.0.1');
  assert.equal(c.port, 8080);
  assert.equal(c.executionProvider, 'cpu');
  assert.ok(c.embedderPath.endsWith('models/pretrained/all-minilm-l6-v2'));
  assert.ok(c.chunkOverlapTokens < c.chunkTokens);
});

test('env values override defaults', () => {
  const c = loadConfig({ PORT: '9000', RAGGUARD_TOP_K: '7', RAGGUARD_EXECUTION_PROVIDER: 'auto', RAGGUARD_CORPUS_DIR: '' });
  assert.equal(c.port, 9000);
  assert.equal(c.defaultTopK, 7);
  assert.equal(c.executionProvider, 'auto');
  assert.equal(c.corpusDir, '');
});

test('each model may have its own execution provider; the others follow RAGGUARD_EXECUTION_PROVIDER', () => {
  assert.deepEqual(loadConfig({}).providers, { embedder: 'cpu', reranker: 'cpu', decoder: 'cpu' });
  const c = loadConfig({ RAGGUARD_EXECUTION_PROVIDER: 'webgpu', RAGGUARD_EMBEDDER_EP: 'cpu' });
  assert.deepEqual(c.providers, { embedder: 'cpu', reranker: 'webgpu', decoder: 'webgpu' });
  assert.throws(() => loadConfig({ RAGGUARD_DECODER_EP: 'tpu' }), /RAGGUARD_DECODER_EP: expected one of/);
});

test('every invalid variable is named in one error', () => {
  assert.throws(
    () => loadConfig({ PORT: 'eighty', RAGGUARD_PRUNE_MARGIN: '-1', RAGGUARD_EXECUTION_PROVIDER: 'tpu' }),
    (e: unknown) => {
      assert.ok(e instanceof ConfigError);
      assert.equal(e.problems.length, 3);
      assert.match(e.message, /PORT: expected an integer/);
      assert.match(e.message, /RAGGUARD_PRUNE_MARGIN: expected a number in \[0, 2\]/);
      assert.match(e.message, /RAGGUARD_EXECUTION_PROVIDER: expected one of cpu, webgpu, cuda, auto/);
      return true;
    },
  );
});

test('cross-variable constraints are checked', () => {
  assert.throws(() => loadConfig({ RAGGUARD_CHUNK_TOKENS: '32', RAGGUARD_CHUNK_OVERLAP: '32' }), /RAGGUARD_CHUNK_OVERLAP: must be smaller/);
  assert.throws(() => loadConfig({ RAGGUARD_TOP_K: '50', RAGGUARD_MAX_TOP_K: '10' }), /RAGGUARD_TOP_K: must not exceed/);
  assert.throws(() => loadConfig({ RAGGUARD_RRF_DENSE_WEIGHT: '0', RAGGUARD_RRF_LEXICAL_WEIGHT: '0' }), /not both 0/);
  assert.equal(loadConfig({ RAGGUARD_RETRIEVAL: 'dense', RAGGUARD_RRF_DENSE_WEIGHT: '0', RAGGUARD_RRF_LEXICAL_WEIGHT: '0' }).retrieval, 'dense');
});

test('retrieval settings: hybrid with equal weights and rerank off by default; bad values named', () => {
  const c = loadConfig({});
  assert.deepEqual([c.retrieval, c.rrfK, c.rrfDenseWeight, c.rrfLexicalWeight, c.rerank], ['hybrid', 60, 1, 1, false]);
  assert.throws(() => loadConfig({ RAGGUARD_RETRIEVAL: 'sparse' }), /RAGGUARD_RETRIEVAL: expected one of hybrid, dense, lexical/);
  assert.throws(() => loadConfig({ RAGGUARD_BM25_B: '1.5' }), /RAGGUARD_BM25_B: expected a number in \[0, 1\]/);
});

test('the README documents every variable', async () => {
  const { readFile } = await import('node:fs/promises');
  const readme = await readFile(new URL('../README.md', import.meta.url), 'utf8');
  for (const v of VARIABLES) assert.ok(readme.includes(`\`${v.name}\``), `README lacks ${v.name}`);
  assert.ok(configTable().split('\n').length === VARIABLES.length + 2);
  // The table between the markers is configTable()'s own output, defaults and meanings included.
  const table = /<!-- config-doc:begin -->\n([\s\S]*?)\n<!-- config-doc:end -->/.exec(readme)?.[1]?.trim();
  assert.equal(table, configTable(), "README's configuration table is stale: run npm run config:doc -- --write");
});
