/**
 * What a running server reports, read by a bench: /metrics parsed into samples (the guard's decisions and
 * reshapes, preemptions, failed requests), counters' differences, /debug/memory's device figures, and a wait
 * until nothing is running, waiting or reserved.
 */
import { getJson } from './http-client.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export interface Sample { name: string; labels: Record<string, string>; value: number }
function parseMetrics(text: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([^{\s]+)(?:\{(.*)\})?\s+(\S+)$/.exec(line);
    if (!m) continue;
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]!] = l[2]!;
    out.push({ name: m[1]!, labels, value: Number(m[3]) });
  }
  return out;
}
export async function metrics(port: number): Promise<Sample[]> {
  const r = await fetch(`http://127.0.0.1:${port}/metrics`, { signal: AbortSignal.timeout(10_000) });
  return parseMetrics(await r.text());
}
function byLabel(samples: Sample[], name: string, label: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const s of samples) if (s.name === `ragguard:${name}`) out[s.labels[label] ?? ''] = (out[s.labels[label] ?? ''] ?? 0) + s.value;
  return out;
}
export function diff(after: Record<string, number>, before: Record<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const k of new Set([...Object.keys(after), ...Object.keys(before)])) {
    const d = (after[k] ?? 0) - (before[k] ?? 0);
    if (d !== 0) out[k] = d;
  }
  return out;
}
export const guardCounts = (s: Sample[]) => ({
  decisions: byLabel(s, 'guard_admissions_total', 'decision'),
  reshapes: byLabel(s, 'guard_reshapes_total', 'field'),
  preemptions: byLabel(s, 'num_preemptions_total', '')[''] ?? 0,
  engine_failed: byLabel(s, 'request_failed_total', '')[''] ?? 0,
});

interface DebugMemory {
  budget: { bytes: number; source: string; gpu_total_bytes: number | null; kv_pool_bytes: number; workspace_bytes: number; workspace_reserved_bytes: number; requests_waiting_for_memory: number };
  components: { name: string; bytes: number; detail?: string }[];
  kv: { total_blocks: number; used_blocks: number; cached_blocks: number };
  queue: { running: number; waiting: number; max_concurrent: number; max_waiting: number };
  gpu: { gpus: { name: string; used_bytes: number; total_bytes: number }[] } | null;
  gpu_unavailable_reason?: string;
}
/** /debug/memory's device figures, compact. */
export async function deviceFigures(port: number): Promise<Record<string, unknown>> {
  const m = await getJson<DebugMemory>(port, '/debug/memory');
  return {
    budget_bytes: m.budget.bytes, budget_source: m.budget.source, gpu_total_bytes: m.budget.gpu_total_bytes,
    kv_pool_bytes: m.budget.kv_pool_bytes, workspace_bytes: m.budget.workspace_bytes, workspace_reserved_bytes: m.budget.workspace_reserved_bytes,
    components: Object.fromEntries(m.components.map((c) => [c.name, c.bytes])),
    kv_blocks: m.kv,
    queue: m.queue,
    nvml_used_bytes: m.gpu?.gpus[0]?.used_bytes ?? null,
    ...(m.gpu_unavailable_reason ? { gpu_unavailable_reason: m.gpu_unavailable_reason } : {}),
  };
}
/** Polls /debug/memory until nothing is running, waiting or reserved (at most `maxMs`). */
export async function waitIdle(port: number, maxMs = 60_000): Promise<{ idle: boolean; waited_ms: number }> {
  const t0 = performance.now();
  while (performance.now() - t0 < maxMs) {
    const m = await getJson<DebugMemory>(port, '/debug/memory').catch(() => undefined);
    if (m && m.queue.running === 0 && m.queue.waiting === 0 && m.budget.workspace_reserved_bytes === 0 && m.budget.requests_waiting_for_memory === 0) {
      return { idle: true, waited_ms: Math.round(performance.now() - t0) };
    }
    await sleep(100);
  }
  return { idle: false, waited_ms: Math.round(performance.now() - t0) };
}
