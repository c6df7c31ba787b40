/**
 * A decoder exported in the Hugging Face / Optimum layout (config.json, tokenizer files, onnx/model.onnx
 * with past_key_values) converted into onnxruntime-genai's layout (gqa-builder.ts: GroupQueryAttention
 * with the KV buffer written in place, LoRA slots in every projection), the server's fast path.
 *
 * convertExport: the conversion itself (scripts/build-gqa-decoder.ts runs it in setup on the shipped
 *   decoder). Weights are found by the graph's structure (export-weights.ts), so a constant-folded
 *   export (`onnx::MatMul_1246`, [in, out]) converts as an unfolded one does; external data is read.
 * exportDecoderDir: what the server does with RAGGUARD_DECODER. An Optimum export dropped in is
 *   converted once and cached, as GGUF files are (gguf-decoder.ts), under the cache directory: keyed by
 *   the sha256 of the export's own bytes (graph, external data, config and tokenizer files; remembered
 *   in .digests/ while the files' sizes and times hold), the options and the converter's sources; written to a temporary directory and renamed, so a crash leaves
 *   nothing a later start would take for a whole model; a later start finds it and says so. A directory
 *   already in the genai layout is used as it is.
 */
import { createHash } from 'node:crypto';
import { createReadStream, existsSync } from 'node:fs';
import { copyFile, mkdir, open, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { externalDataReader, readJsonIfExists } from '../../../runtime/model-dir.js';
import { externalDataFiles, readGraph, writeModel } from '../../../runtime/onnx-proto.js';
import { exportWeights } from './export-weights.js';
import { buildGqaDecoder, type GqaDtype, type GqaSourceConfig } from './gqa-builder.js';

/** Files besides the graph that the converted directory carries over as they are. */
const CARRIED = ['config.json', 'generation_config.json', 'tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'chat_template.jinja'];

export interface ConvertOptions {
  dtype?: GqaDtype;
  /** LoRA paths in every projection: true, false, or 'auto' (where the model's shape allows them; the log says when not). */
  lora?: boolean | 'auto';
  /** Weights of this many bytes in all or more go into an external data file (default: past 2 GiB less 64 MiB, what one protobuf holds). */
  externalDataOver?: number;
  log?: (msg: string) => void;
}

export interface ConvertResult {
  lora: boolean;
  graphBytes: number;
  seconds: number;
}

/** Converts the Optimum export in `src` into the genai layout in `out`. */
export async function convertExport(src: string, out: string, opts: ConvertOptions = {}): Promise<ConvertResult> {
  const t0 = performance.now();
  const dtype = opts.dtype ?? 'float32';
  const cfg = JSON.parse(await readFile(path.join(src, 'config.json'), 'utf8')) as GqaSourceConfig;
  const onnxDir = path.join(src, 'onnx');
  const external = externalDataReader(onnxDir);
  let graph;
  try {
    graph = readGraph(await readFile(path.join(onnxDir, 'model.onnx')), external.read);
  } finally {
    external.close();
  }
  const weights = exportWeights(graph, cfg, `decoder ${src}`);
  const D = cfg.head_dim ?? cfg.hidden_size / cfg.num_attention_heads;
  const fits = cfg.num_attention_heads * D === cfg.hidden_size;
  const lora = opts.lora === 'auto' || opts.lora === undefined ? fits : opts.lora;
  if (!lora && opts.lora !== false) opts.log?.(`[convert] ${src}: no LoRA paths (num_attention_heads x head_dim = ${cfg.num_attention_heads * D} is not hidden_size ${cfg.hidden_size}, as the adapter slots assume)`);
  const g = buildGqaDecoder(cfg, weights, { dtype, lora });
  const bytes = g.initializers.reduce((s, t) => s + t.data.length, 0);
  await mkdir(out, { recursive: true });
  // Weights past what one protobuf holds (2 GiB) go into model.onnx.data beside the graph, each at a
  // page-aligned offset (which lets ONNX Runtime map rather than copy them).
  const over = opts.externalDataOver ?? 2 ** 31 - 2 ** 26;
  const parts: { at: number; data: Uint8Array }[] = [];
  let end = 0;
  const sink = bytes >= over ? {
    location: 'model.onnx.data',
    minBytes: 2 ** 16,
    place: (data: Uint8Array) => {
      const at = Math.ceil(end / 4096) * 4096;
      parts.push({ at, data });
      end = at + data.length;
      return at;
    },
  } : undefined;
  const model = writeModel({ name: 'decoder_gqa', ...g, opsets: { '': 17, 'com.microsoft': 1 } }, sink);
  if (sink) {
    const fh = await open(path.join(out, sink.location), 'w');
    try {
      for (const p of parts) await fh.write(p.data, 0, p.data.length, p.at);
    } finally {
      await fh.close();
    }
  }
  await writeFile(path.join(out, 'model.onnx'), model);
  await writeFile(path.join(out, 'genai_config.json'), `${JSON.stringify(g.genaiConfig, null, 2)}\n`);
  for (const f of CARRIED) {
    if (existsSync(path.join(src, f))) await copyFile(path.join(src, f), path.join(out, f));
  }
  return { lora, graphBytes: model.length + end, seconds: (performance.now() - t0) / 1000 };
}

/** A directory in the Optimum export layout (onnx/model.onnx) rather than genai's (genai_config.json). */
export function isOptimumExport(dir: string): boolean {
  return !existsSync(path.join(dir, 'genai_config.json')) && existsSync(path.join(dir, 'onnx', 'model.onnx'));
}

/** The sources whose code decides the converted bytes: a change to any of them reconverts. */
// Relative to this file (src/backends/ort/convert/).
const CONVERTER_SOURCES = ['../../../runtime/onnx-proto.ts', './export-weights.ts', './gqa-builder.ts', '../../../generate/lora.ts', './rope-scaling.ts', './export-decoder.ts'];

async function hashFile(h: ReturnType<typeof createHash>, file: string): Promise<void> {
  for await (const chunk of createReadStream(file, { highWaterMark: 4 * 2 ** 20 })) h.update(chunk as Buffer);
}

interface Digest {
  /** The export's files as stat saw them when they were hashed: path, size, modification time, inode. */
  files: [string, number, number, number][];
  sha256: string;
}

/**
 * sha256 of what the export is: its graph, external data, config and tokenizer files. Remembered in
 * `memo` with each file's size, time and inode, and hashed again only when one of those changed: at
 * about 500 MB/s on this CPU, a 14 GB export would otherwise cost half a minute every start.
 */
async function exportDigest(dir: string, memo: string): Promise<{ sha256: string; remembered: boolean }> {
  const onnx = path.join(dir, 'onnx', 'model.onnx');
  // A graph file that keeps its weights elsewhere is small; one holding them (up to 2 GiB) is not read
  // whole just to list external files it does not have (as model-dir.ts sizes a model).
  const small = (await stat(onnx)).size < 256 * 2 ** 20;
  const files = [onnx, ...(small ? externalDataFiles(await readFile(onnx)) : []).map((f) => path.join(dir, 'onnx', f))];
  for (const f of CARRIED) if (existsSync(path.join(dir, f))) files.push(path.join(dir, f));
  const seen: Digest['files'] = [];
  for (const f of files) {
    const st = await stat(f);
    seen.push([path.relative(dir, f), st.size, st.mtimeMs, st.ino]);
  }
  const old = await readJsonIfExists<Digest>(memo).catch(() => undefined);
  if (old && JSON.stringify(old.files) === JSON.stringify(seen)) return { sha256: old.sha256, remembered: true };
  const h = createHash('sha256');
  for (const f of files) {
    h.update(`${path.relative(dir, f)}\0`);
    await hashFile(h, f);
  }
  const sha256 = h.digest('hex');
  await writeFile(`${memo}.tmp-${process.pid}`, JSON.stringify({ files: seen, sha256 } satisfies Digest));
  await rename(`${memo}.tmp-${process.pid}`, memo);
  return { sha256, remembered: false };
}

/** The cache key: the export's digest, the options and the converter's sources (a change to any reconverts). */
async function cacheKey(digest: string, options: unknown): Promise<string> {
  const h = createHash('sha256').update(digest);
  const here = path.dirname(fileURLToPath(import.meta.url));
  for (const f of CONVERTER_SOURCES) {
    const file = path.join(here, f);
    await hashFile(h, existsSync(file) ? file : file.replace(/\.ts$/, '.js'));
  }
  h.update(JSON.stringify(options));
  return h.digest('hex').slice(0, 16);
}

export type ExportConvertMode = 'auto' | 'genai' | 'off';

export interface ExportDecoderOptions {
  /** Where converted models live (a directory per export and converter). */
  cacheDir: string;
  mode: ExportConvertMode;
  /** The decoder's execution provider as configured. */
  provider: string;
  log?: (msg: string) => void;
}

/** The directory to load as the decoder for `dir`: its cached genai conversion where it is an Optimum export to convert, else `dir`. */
export async function exportDecoderDir(dir: string, opts: ExportDecoderOptions): Promise<string> {
  if (!isOptimumExport(dir)) return dir;
  if (opts.mode === 'off') return dir;
  if (opts.mode === 'auto' && opts.provider !== 'cpu') {
    // WebGPU keeps an Optimum export's present KV on the device; the genai layout's in-place buffer is the CPU's path.
    opts.log?.(`[convert] ${dir}: Optimum export served as exported on the ${opts.provider} provider (conversion to the genai layout is for the CPU)`);
    return dir;
  }
  const t0 = performance.now();
  const options = { dtype: 'float32', lora: 'auto' };
  // Named by the directory (and its path, so that two exports of one name do not evict each other).
  const abs = path.resolve(dir);
  const base = `${path.basename(abs)}-${createHash('sha256').update(abs).digest('hex').slice(0, 6)}`;
  await mkdir(path.join(opts.cacheDir, '.digests'), { recursive: true });
  const digest = await exportDigest(dir, path.join(opts.cacheDir, '.digests', `${base}.json`));
  const key = await cacheKey(digest.sha256, options);
  const target = path.join(opts.cacheDir, `${base}-genai-${key}`);
  const how = digest.remembered ? 'files unchanged since hashed' : `hashed in ${((performance.now() - t0) / 1000).toFixed(1)} s`;
  if (existsSync(path.join(target, 'genai_config.json'))) {
    opts.log?.(`[convert] ${dir}: Optimum export already converted to the genai layout: ${target} (content sha256 ${digest.sha256.slice(0, 16)}, ${how})`);
    return target;
  }
  const tmp = `${target}.tmp-${process.pid}`;
  await rm(tmp, { recursive: true, force: true });
  try {
    const r = await convertExport(dir, tmp, { dtype: 'float32', lora: 'auto', log: opts.log });
    await rm(target, { recursive: true, force: true });
    await rename(tmp, target);
    // Older conversions of the same directory name (another converter, an earlier export) go: each is
    // the model's size again, and nothing would ask for them.
    for (const d of await readdir(opts.cacheDir)) {
      if (d.startsWith(`${base}-genai-`) && d !== path.basename(target) && !d.includes('.tmp-')) await rm(path.join(opts.cacheDir, d), { recursive: true, force: true });
    }
    opts.log?.(`[convert] ${dir}: Optimum export converted to the genai layout: ${target}/model.onnx (${(r.graphBytes / 2 ** 20).toFixed(1)} MiB, LoRA ${r.lora ? 'slots' : 'off'}) in ${r.seconds.toFixed(1)} s (content sha256 ${digest.sha256.slice(0, 16)}, ${how})`);
    return target;
  } catch (e) {
    await rm(tmp, { recursive: true, force: true });
    if (opts.mode === 'genai') throw e;
    opts.log?.(`[convert] ${dir}: not converted to the genai layout (${(e as Error).message}); served as exported (the slower path, without LoRA)`);
    return dir;
  }
}
