#!/usr/bin/env node
// The package's bin: runs the TypeScript CLI (src/cli/main.ts) through tsx's loader, so that
// `npx ragguard` works from the repository without a build step.
import { register } from 'tsx/esm/api';

register();
await import('../src/cli/main.ts');
