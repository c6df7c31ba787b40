/**
 * The int8 GEMV's arithmetic on the CPU (quant_gemv_i8.cuh, RAGGUARD_CUDA_QGEMV=int8): its per-type integer
 * dot products unpack nibbles, fifth bits, Q6_K's high pairs and signed offsets with byte tricks that a GPU
 * run would only show as wrong logits. test/fixtures/cuda/i8-dot-check.cc compiles those functions, cut out
 * of the header as they are, with g++ and host versions of __dp4a and __vsub4, and compares each with the unit
 * decoded to float (unit_decode's formulas) times the same int8 activations.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile, copyFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

const HEADER = 'src/backends/cuda/quant_gemv_i8.cuh';
const HARNESS = 'test/fixtures/cuda/i8-dot-check.cc';

function hasGxx(): boolean {
  try {
    execFileSync('g++', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

test('every integer type\'s dot product equals the float decode\'s, to float rounding', async (t) => {
  if (!hasGxx()) return t.skip('no g++ on this machine');
  const header = await readFile(HEADER, 'utf8');
  const from = header.indexOf('__device__ __forceinline__ int qword');
  const to = header.indexOf('// Y[r, row0 + j]');
  assert.ok(from > 0 && to > from, `${HEADER}: the dot products are not where the test cuts them`);
  const dir = await mkdtemp(path.join(tmpdir(), 'rg-i8-dot-'));
  try {
    await writeFile(path.join(dir, 'dots.inc'), header.slice(from, to));
    await copyFile(HARNESS, path.join(dir, 'check.cc'));
    execFileSync('g++', ['-O1', '-std=c++17', 'check.cc', '-o', 'check'], { cwd: dir, stdio: 'pipe' });
    const out = execFileSync(path.join(dir, 'check'), { encoding: 'utf8' });
    const worst = new Map(out.trim().split('\n').map((l) => { const w = l.split(' '); return [w[0]!, Number(w[w.length - 1])] as const; }));
    assert.deepEqual([...worst.keys()], ['Q8_0', 'Q4_0', 'Q4_1', 'Q5_0', 'Q4_K', 'Q6_K']);
    for (const [name, e] of worst) assert.ok(e < 1e-6, `${name}: worst relative error ${e}`);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
