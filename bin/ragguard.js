#!/usr/bin/env node
// The package's bin: in the repository, the TypeScript CLI (src/cli/main.ts) through tsx's loader, so
// that `npx ragguard` needs no build step; in the packed package (no src/), the built dist/cli/main.js.
//
// `serve` runs with glibc's allocator tuned as `npm start` does (scripts/tuned.sh says why): the
// tunable only applies at process start, so the shim starts the server as its child with it set,
// forwarding SIGINT and SIGTERM and exiting as the child does.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';

const TUNABLE = 'glibc.malloc.mmap_threshold=2097152';
const tunables = process.env.GLIBC_TUNABLES ?? '';

if (process.argv[2] === 'serve' && !/(^|:)glibc\.malloc\.mmap_threshold=/.test(tunables)) {
  const env = { ...process.env, GLIBC_TUNABLES: tunables ? `${TUNABLE}:${tunables}` : TUNABLE };
  const child = spawn(process.execPath, [...process.execArgv, ...process.argv.slice(1)], { stdio: 'inherit', env });
  for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => child.kill(sig));
  child.on('exit', (code, signal) => process.exit(code ?? (signal ? 128 : 0)));
} else if (existsSync(new URL('../src/cli/main.ts', import.meta.url))) {
  (await import('tsx/esm/api')).register();
  await import('../src/cli/main.ts');
} else {
  await import('../dist/cli/main.js');
}
