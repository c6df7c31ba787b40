/** The int8 multiply-add peak the benchmarks put prefill figures beside (the ops library's VPDPBUSD loop). */
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { test } from 'node:test';
import koffi from 'koffi';
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

test("AMX's peak is measured where the products run on it, and is a physical rate: no core past one full TDPBSUD in 16 cycles at 6 GHz", { skip }, () => {
  const p = measureInt8Peak(2, 1);
  assert.ok(p, 'measured');
  const flags = readFileSync('/proc/cpuinfo', 'utf8');
  if (!flags.includes(' amx_int8') || !flags.includes(' amx_tile')) {
    assert.equal(p.amx, null, 'no AMX on this CPU: no AMX peak');
    return;
  }
  // The CPU has AMX; Linux (or the hypervisor) may still refuse the tile state: a peak exactly where the
  // products run on AMX (the library's own answer).
  const amxRuns = (koffi.load(RAGGUARD_OPS_LIBRARY).func('int qm_amx(void)') as () => number)() === 1;
  assert.equal(p.amx !== null, amxRuns, `an AMX peak ${p.amx ? 'measured' : 'missing'} where the products ${amxRuns ? 'run' : 'do not run'} on AMX`);
  if (p.amx === null) return;
  const most = (16 * 16 * 64 / 16) * 6e9;
  assert.ok(p.amx.perCoreMultiplyAddsPerS > 1e10 && p.amx.perCoreMultiplyAddsPerS < most, `one core: ${p.amx.perCoreMultiplyAddsPerS}`);
  assert.ok(p.amx.multiplyAddsPerS > 1e10 && p.amx.multiplyAddsPerS < 2 * most, `two threads: ${p.amx.multiplyAddsPerS}`);
});
