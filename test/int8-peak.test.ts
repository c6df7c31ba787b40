/** The int8 multiply-add peak the benchmarks put prefill figures beside (the ops library's VPDPBUSD loop). */
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { test } from 'node:test';
import { measureInt8Peak } from '../src/backends/ort/int8-peak.js';
import { RAGGUARD_OPS_LIBRARY } from '../src/backends/ort/ort-c-api.js';

const vnni = readFileSync('/proc/cpuinfo', 'utf8').includes(' avx512_vnni');
const skip = !existsSync(RAGGUARD_OPS_LIBRARY) ? 'the ops library is not built' : !vnni ? 'no AVX512-VNNI here' : false;

test('the measured int8 peak is a physical rate: the loop runs, and no core exceeds two VPDPBUSD a cycle at 6 GHz', { skip }, () => {
  const p = measureInt8Peak(2, 1);
  assert.ok(p, 'measured');
  // A loop the compiler folded away would report rates no core reaches; one that does not run, none.
  const most = 2 * 64 * 6e9;
  assert.ok(p.perCoreMultiplyAddsPerS > 1e9 && p.perCoreMultiplyAddsPerS < most, `one core: ${p.perCoreMultiplyAddsPerS}`);
  assert.ok(p.multiplyAddsPerS > 1e9 && p.multiplyAddsPerS < 2 * most, `two threads: ${p.multiplyAddsPerS}`);
  assert.equal(p.threads, 2);
});
