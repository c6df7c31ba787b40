/**
 * The package as an application installs it: `npm pack` (its prepack builds dist/ with declarations),
 * the tarball unpacked into a fresh directory's node_modules, and there the `exports` import under node
 * and type-check under tsc. The fresh directory gets the repository's installed dependencies by symlink
 * (installing them again needs the network and setup's native builds).
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync, readdirSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { ROOT, tempDir } from './helpers.js';

test('npm pack gives a package whose exports import and type-check in a fresh directory', async () => {
  const out = await tempDir('ragguard-pack-');
  const [packed] = JSON.parse(execFileSync('npm', ['pack', '--json', '--pack-destination', out], { cwd: ROOT, encoding: 'utf8' })) as { filename: string; files: { path: string }[] }[];
  const files = packed!.files.map((f) => f.path);
  assert.ok(files.includes('dist/index.js') && files.includes('dist/index.d.ts'), 'the build is packed');
  assert.ok(!files.some((f) => f.startsWith('src/') || f.startsWith('test/')), 'sources and tests stay out');

  const app = await tempDir('ragguard-app-');
  const pkgDir = path.join(app, 'node_modules', 'ragguard');
  mkdirSync(pkgDir, { recursive: true });
  execFileSync('tar', ['-xzf', path.join(out, packed!.filename), '-C', pkgDir, '--strip-components=1']);
  for (const dep of readdirSync(path.join(ROOT, 'node_modules'))) {
    if (dep.startsWith('.') || dep === 'ragguard') continue;
    symlinkSync(path.join(ROOT, 'node_modules', dep), path.join(app, 'node_modules', dep));
  }
  writeFileSync(path.join(app, 'package.json'), JSON.stringify({ name: 'an-app', type: 'module', private: true }));

  const keys = JSON.parse(execFileSync(process.execPath, ['--input-type=module', '-e',
    "const m = await import('ragguard'); console.log(JSON.stringify(Object.keys(m).sort()))"], { cwd: app, encoding: 'utf8' })) as string[];
  for (const k of ['createRagguard', 'Ragguard', 'loadConfig', 'resolveConfig', 'RagguardError', 'TooLargeError', 'BusyError', 'ConfigError']) assert.ok(keys.includes(k), `export ${k}: ${keys.join(', ')}`);

  writeFileSync(path.join(app, 'main.ts'), [
    "import { createRagguard, resolveConfig, type Config, type QueryResult } from 'ragguard';",
    'const cfg: Config = resolveConfig({ config: { port: 0 } });',
    'export async function answer(q: string): Promise<QueryResult> {',
    '  const rg = await createRagguard({ config: { indexDir: cfg.indexDir } });',
    '  return rg.query({ query: q, maxNewTokens: 16 });',
    '}',
  ].join('\n'));
  writeFileSync(path.join(app, 'tsconfig.json'), JSON.stringify({
    compilerOptions: { module: 'NodeNext', moduleResolution: 'NodeNext', target: 'ES2023', strict: true, noEmit: true, skipLibCheck: true, types: ['node'] },
    files: ['main.ts'],
  }));
  execFileSync(process.execPath, [path.join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', app], { cwd: app, encoding: 'utf8' });
});
