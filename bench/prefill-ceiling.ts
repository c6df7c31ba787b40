/**
 * A quantized decoder's prefill ceiling on this CPU: the machine's int8 multiply-add peak (measured on
 * every core at once: src/backends/ort/int8-peak.ts; AMX's where the prefill's products run on it; the
 * nominal cores x VPDPBUSD a cycle x 64 x /proc/cpuinfo's clock beside it, and in its place where it
 * cannot be measured) over the GGUF's
 * multiply-adds a prompt token (every 2-D weight but token_embd and output: the logits are computed for
 * the last prompt token only; attention's products, which grow with the context, not counted). Shared by
 * bench:llama-server and bench:prefill-cpu.
 */
import { readFileSync } from 'node:fs';
import os from 'node:os';
import { measureInt8Peak } from '../src/backends/ort/int8-peak.js';
import { ragguardOpsAmxBf16 } from '../src/backends/ort/ragguard-ops.js';
import { GgufFile } from '../src/runtime/gguf.js';

export interface PrefillCeiling {
  /** /proc/cpuinfo's model name, family and model: the hosts of these figures have differed (Intel, AMD). */
  cpu: string;
  cores: number;
  clock_ghz: number;
  clock_source: string;
  avx512_vnni: boolean;
  vpdpbusd_per_cycle_per_core: number;
  int8_multiply_adds_per_s_nominal: number;
  int8_multiply_adds_per_s_measured: number | null;
  int8_multiply_adds_per_s_measured_one_core: number | null;
  /** Whether ragguard's products of 16 rows or more (prefills) run on AMX here (qmatmul.c's qm_amx). */
  amx: boolean;
  /** Whether its products of 128 rows or more run on AMX-BF16 (qmatmul-bf16.c): TDPBF16PS, half TDPBSUD's multiply-adds an instruction. */
  amx_bf16: boolean;
  int8_multiply_adds_per_s_amx_measured: number | null;
  int8_multiply_adds_per_s_amx_measured_one_core: number | null;
  peak_source: string;
  /** AMX's measured peak where the products run on it, else AVX512-VNNI's measured, else the nominal. */
  int8_multiply_adds_per_s: number;
  model_multiply_adds_per_token: number;
  prefill_tokens_per_s_ceiling: number;
}

/** The weights' multiply-adds a prompt token. */
function multiplyAddsPerToken(gguf: string): number {
  const f = GgufFile.open(gguf);
  let macs = 0;
  try {
    for (const t of f.tensors.values()) {
      if (t.dims.length === 2 && t.name !== 'token_embd.weight' && t.name !== 'output.weight') macs += t.dims[0]! * t.dims[1]!;
    }
  } finally {
    f.close();
  }
  return macs;
}

/** Measures the peak (about a second, every core busy: call it on a quiet machine, nothing else running). */
export function prefillCeiling(gguf: string, vnniPerCycle = 1): PrefillCeiling {
  const macs = multiplyAddsPerToken(gguf);
  const cpuinfo = readFileSync('/proc/cpuinfo', 'utf8');
  const mhz = cpuinfo.split('\n').filter((l) => l.startsWith('cpu MHz')).map((l) => Number(l.split(':')[1]));
  const clockHz = Math.max(...mhz) * 1e6;
  const cores = os.availableParallelism();
  const nominal = cores * vnniPerCycle * 64 * clockHz;
  // The nominal figure assumes the instruction rate and takes the hypervisor's clock, which the cores may
  // outrun (2026-12-06, 2 EPYC cores: 469 measured against 333 nominal at 2.6 GHz).
  const measured = measureInt8Peak(cores);
  // Where the prefill's products run on AMX, its TDPBSUD is the limit (about 10x VPDPBUSD's on one core).
  const amx = measured?.amx ?? null;
  const amxBf16 = amx !== null && ragguardOpsAmxBf16();
  const perS = amx?.multiplyAddsPerS ?? measured?.multiplyAddsPerS ?? nominal;
  const field = (name: string) => new RegExp(`^${name}\\s*:\\s*(.*)$`, 'm').exec(cpuinfo)?.[1]?.trim() ?? '?';
  return {
    cpu: `${field('model name')} (family ${field('cpu family')}, model ${field('model')})`, cores, clock_ghz: Math.round(clockHz / 1e7) / 100, clock_source: '/proc/cpuinfo cpu MHz', avx512_vnni: cpuinfo.includes(' avx512_vnni'),
    vpdpbusd_per_cycle_per_core: vnniPerCycle,
    int8_multiply_adds_per_s_nominal: nominal,
    int8_multiply_adds_per_s_measured: measured?.multiplyAddsPerS ?? null,
    int8_multiply_adds_per_s_measured_one_core: measured?.perCoreMultiplyAddsPerS ?? null,
    amx: amx !== null, amx_bf16: amxBf16, int8_multiply_adds_per_s_amx_measured: amx?.multiplyAddsPerS ?? null,
    int8_multiply_adds_per_s_amx_measured_one_core: amx?.perCoreMultiplyAddsPerS ?? null,
    peak_source: amx
      ? amxBf16
        ? `${amx.how}: the prefill's products of 128 rows or more run on AMX-BF16 here (TDPBF16PS: half this an instruction at most)`
        : `${amx.how}: the prefill's products run on AMX here (a block of 32 takes a TDPBSUD of half depth at full cost: half this at most)`
      : measured ? measured.how : 'nominal (the ops library is not built, or the CPU has no AVX512-VNNI)',
    int8_multiply_adds_per_s: perS, model_multiply_adds_per_token: macs, prefill_tokens_per_s_ceiling: Math.round(perS / macs),
  };
}
