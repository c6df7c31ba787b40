/**
 * The profile run's calibration kept on disk (RAGGUARD_CALIBRATION_CACHE), so that a restart does not
 * measure again what it measured last time: the run takes 30-140 s on 2 cores, model loading 5.
 *
 * A calibration holds only for what it was measured on, so the file stores the key it was measured
 * under, and a start restores it only when its own key is the same, field for field; otherwise (or
 * when the file is missing or damaged) the profile runs and the file is rewritten. The key is
 * everything a run's peak bytes depend on:
 * - the models' bytes: every file under each configured model path, by size and content (the whole
 *   file up to FULL_HASH_BYTES, else samples at its head, middle and tail). Content, not modification
 *   times: a copy or a fresh pull of the same models (a new container) keeps its calibration, and what
 *   sets a run's memory (the graph, the tensors' shapes and types) sits in small files or at the head
 *   of large ones; weights' values change no buffer's size.
 * - ragguard's own code (every source file, by content), the native libraries it loads (build/native),
 *   and ONNX Runtime's and Node's versions;
 * - the machine: CPU model, flags and threads, and the GPUs NVML sees;
 * - the configuration that shapes a run (providers, threads, kernels, limits: CONFIG_FIELDS) and the
 *   profile's plan itself: each shape it runs with the memory model's analytic bytes for it, which
 *   changes with any setting or model that changes what the memory model predicts;
 * - the allocator's settings (GLIBC_TUNABLES), which change what resident memory measures.
 * Over-invalidating costs one profile run; a stale calibration admits requests that do not fit.
 */
import { createHash } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { open, readdir, readFile, rename, stat, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { availableParallelism, cpus } from 'node:os';
import path from 'node:path';
import type { Config } from '../config/config.js';
import type { GpuReading } from './nvml.js';
import type { CacheNote, ProfileReport } from './profile.js';

/** Bumped when the file's layout or the profile run's method changes. */
export const CALIBRATION_FORMAT = 1;
export const CALIBRATION_FILE = 'calibration.json';

/** Files up to this size are hashed whole; larger ones by SAMPLE_BYTES at their head, middle and tail. */
const FULL_HASH_BYTES = 16 << 20;
const SAMPLE_BYTES = 1 << 20;

/**
 * The configuration fields that change a profile run's peaks besides its plan (which holds the limits).
 * Not the models' paths: their files' content is in the key (the same models elsewhere keep the calibration).
 */
export const CONFIG_FIELDS = [
  'providers', 'webgpuBufferCache', 'hostMeter', 'intraOpThreads', 'intraOpSpin',
  'ggufWeights', 'cpuKernels', 'decoderLora', 'decoderConvert', 'maxLoras', 'maxLoraRank', 'kvBlockSize', 'maxNumSeqs',
  'maxNumBatchedTokens', 'promptBudgetTokens', 'maxNewTokensLimit', 'maxQueryTokens', 'maxTopK',
] as const satisfies readonly (keyof Config)[];

export interface CalibrationKey {
  format: number;
  /** Per model role: its files (relative to the configured path) and each one's fingerprint. */
  models: Record<string, Record<string, string>>;
  code: string;
  native: Record<string, string>;
  onnxruntime: string;
  node: string;
  cpu: { model: string; flags: string; threads: number };
  gpu: string;
  config: Record<string, unknown>;
  /** Adapter slots exist (RAGGUARD_ADAPTER_DIR set): the decoder's graph and workspace take their rows. */
  adapters: boolean;
  plan: unknown;
  glibcTunables: string;
}

export interface StoredCalibration {
  format: number;
  written_at: string;
  key: CalibrationKey;
  report: Extract<ProfileReport, { source: 'profile' }>;
}

/** `size:hash` of a file's bytes (whole, or sampled past FULL_HASH_BYTES). */
export async function fileFingerprint(file: string): Promise<string> {
  const fh = await open(file, 'r');
  try {
    const { size } = await fh.stat();
    const h = createHash('sha256');
    const at = size <= FULL_HASH_BYTES ? [0] : [0, Math.floor(size / 2 - SAMPLE_BYTES / 2), size - SAMPLE_BYTES];
    const len = size <= FULL_HASH_BYTES ? size : SAMPLE_BYTES;
    const buf = Buffer.alloc(len);
    for (const pos of at) {
      const { bytesRead } = await fh.read(buf, 0, len, pos);
      h.update(buf.subarray(0, bytesRead));
    }
    return `${size}:${h.digest('hex').slice(0, 32)}`;
  } finally {
    await fh.close();
  }
}

/** Every file under `p` (or `p` itself), by path relative to it, with its fingerprint; `{'': 'missing'}` when absent. */
export async function pathFingerprint(p: string): Promise<Record<string, string>> {
  const s = await stat(p).catch(() => undefined);
  if (!s) return { '': 'missing' };
  if (!s.isDirectory()) return { [path.basename(p)]: await fileFingerprint(p) };
  const out: Record<string, string> = {};
  const entries = await readdir(p, { recursive: true, withFileTypes: true });
  for (const e of entries.sort((a, b) => path.join(a.parentPath, a.name).localeCompare(path.join(b.parentPath, b.name)))) {
    const full = path.join(e.parentPath, e.name);
    if (e.isFile() || (e.isSymbolicLink() && (await stat(full).catch(() => undefined))?.isFile())) {
      out[path.relative(p, full)] = await fileFingerprint(full);
    }
  }
  return out;
}

const ROOT = path.resolve(import.meta.dirname, '..', '..');
/** ragguard's own code: the directory above this module's (src/, or the built output). */
const CODE_DIR = path.resolve(import.meta.dirname, '..');
const NATIVE_DIR = path.join(ROOT, 'build', 'native');

/** One hash over every source file of ragguard, by path and content. */
async function codeFingerprint(): Promise<string> {
  const files = await pathFingerprint(CODE_DIR);
  return createHash('sha256').update(JSON.stringify(files)).digest('hex').slice(0, 32);
}

function cpuInfo(): CalibrationKey['cpu'] {
  let model = cpus()[0]?.model ?? 'unknown';
  let flags = '';
  try {
    const first = readFileSync('/proc/cpuinfo', 'utf8').split('\n\n')[0] ?? '';
    model = /^model name\s*:\s*(.*)$/m.exec(first)?.[1] ?? model;
    flags = /^(?:flags|Features)\s*:\s*(.*)$/m.exec(first)?.[1] ?? '';
  } catch {
    // Not Linux: the model name alone.
  }
  return { model, flags, threads: availableParallelism() };
}

function onnxRuntimeVersion(): string {
  const require = createRequire(import.meta.url);
  return (require('onnxruntime-node/package.json') as { version: string }).version;
}

/** The GPUs as NVML reads them (name and total memory), or 'none'. */
export function gpuDescription(r: GpuReading): string {
  return r.source === 'nvml' ? r.gpus.map((g) => `${g.index}:${g.name}:${g.totalBytes}`).join(',') : 'none';
}

/** The key a profile run under `cfg`, with this plan, on this machine would be stored under. */
export async function calibrationKey(cfg: Config, plan: unknown, gpu: GpuReading): Promise<CalibrationKey> {
  const native: Record<string, string> = {};
  if (existsSync(NATIVE_DIR)) {
    for (const name of (await readdir(NATIVE_DIR)).filter((n) => n.endsWith('.so')).sort()) native[name] = await fileFingerprint(path.join(NATIVE_DIR, name));
  }
  return {
    format: CALIBRATION_FORMAT,
    models: {
      embedder: await pathFingerprint(cfg.embedderPath),
      reranker: await pathFingerprint(cfg.rerankerPath),
      decoder: await pathFingerprint(cfg.decoderPath),
    },
    code: await codeFingerprint(),
    native,
    onnxruntime: onnxRuntimeVersion(),
    node: process.versions.node,
    cpu: cpuInfo(),
    gpu: gpuDescription(gpu),
    config: Object.fromEntries(CONFIG_FIELDS.map((f) => [f, cfg[f] ?? null])),
    adapters: cfg.adapterDir !== '',
    plan,
    glibcTunables: process.env['GLIBC_TUNABLES'] ?? '',
  };
}

const same = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);

/**
 * The key's fields that differ, by name (a model or a configuration field named inside its group):
 * what the log says made the start profile again.
 */
export function keyDifferences(stored: CalibrationKey, now: CalibrationKey): string[] {
  const out: string[] = [];
  for (const k of Object.keys(now) as (keyof CalibrationKey)[]) {
    const a = stored[k];
    const b = now[k];
    if (same(a, b)) continue;
    if ((k === 'models' || k === 'config') && a && typeof a === 'object') {
      const inner = new Set([...Object.keys(a), ...Object.keys(b as object)]);
      for (const f of inner) if (!same((a as Record<string, unknown>)[f], (b as Record<string, unknown>)[f])) out.push(`${k}.${f}`);
    } else {
      out.push(k);
    }
  }
  return out;
}

export type CacheLookup =
  | { hit: true; stored: StoredCalibration }
  /** `damaged`: the file exists but cannot be read as a calibration (the caller warns); `why`: in words. */
  | { hit: false; why: string; damaged?: boolean };

/** The stored calibration when its key is `key`; else why not. */
export async function readCalibration(file: string, key: CalibrationKey): Promise<CacheLookup> {
  let raw: string;
  try {
    raw = await readFile(file, 'utf8');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return { hit: false, why: 'no cached calibration' };
    return { hit: false, why: `cannot read ${file}: ${(e as Error).message}`, damaged: true };
  }
  let stored: StoredCalibration;
  try {
    stored = JSON.parse(raw) as StoredCalibration;
  } catch (e) {
    return { hit: false, why: `${file} is not valid JSON (${(e as Error).message})`, damaged: true };
  }
  if (!isStored(stored)) return { hit: false, why: `${file} does not hold a calibration in format ${CALIBRATION_FORMAT}`, damaged: true };
  const changed = keyDifferences(stored.key, key);
  if (changed.length > 0) return { hit: false, why: `changed since it was measured: ${changed.join(', ')}` };
  return { hit: true, stored };
}

function isStored(x: unknown): x is StoredCalibration {
  const s = x as Partial<StoredCalibration> | null;
  if (!s || typeof s !== 'object' || s.format !== CALIBRATION_FORMAT || typeof s.written_at !== 'string') return false;
  if (!s.key || typeof s.key !== 'object' || !s.report || s.report.source !== 'profile') return false;
  const r = s.report;
  const fit = (f: unknown) => {
    const g = f as { scale?: unknown; offsetBytes?: unknown } | undefined;
    return typeof g?.scale === 'number' && Number.isFinite(g.scale) && g.scale > 0 && typeof g.offsetBytes === 'number' && Number.isFinite(g.offsetBytes);
  };
  return typeof r.headroom === 'number' && Number.isFinite(r.headroom) && Array.isArray(r.points) && !!r.calibration
    && ['embed', 'rerank', 'prefill', 'decode'].every((st) => fit((r.calibration as Record<string, unknown>)[st]));
}

/** Writes the calibration under its key, atomically (a crash leaves the old file or the new one, never half). */
export async function writeCalibration(file: string, key: CalibrationKey, report: StoredCalibration['report']): Promise<void> {
  const { cache: _cache, ...measured } = report;
  const stored: StoredCalibration = { format: CALIBRATION_FORMAT, written_at: new Date().toISOString(), key, report: measured };
  const tmp = `${file}.${process.pid}.tmp`;
  await writeFile(tmp, JSON.stringify(stored, null, 1));
  await rename(tmp, file);
}

/**
 * The profile's report from `file` when it holds one under the key `key()` computes; else `measure()`'s,
 * stored there under that key (a report of analytic figures is not: it measured nothing). The report's
 * `cache` says which happened and why; a file that cannot be written leaves the start as it is (the
 * report says why). `file` undefined: the cache is off, `measure()` as it is.
 */
export async function profileWithCache(file: string | undefined, key: () => Promise<CalibrationKey>,
  measure: () => Promise<ProfileReport>): Promise<ProfileReport> {
  if (file === undefined) return measure();
  const k = await key();
  const found = await readCalibration(file, k);
  if (found.hit) return { ...found.stored.report, cache: { file, restored: true, written_at: found.stored.written_at } };
  const report = await measure();
  if (report.source !== 'profile') return report;
  const cache: CacheNote = { file, restored: false, why: found.why, ...(found.damaged ? { damaged: true } : {}) };
  try {
    await writeCalibration(file, k, report);
  } catch (e) {
    cache.write_error = (e as Error).message;
  }
  return { ...report, cache };
}
