/**
 * Converts an exported decoder (Optimum layout: config.json, tokenizer files, onnx/model.onnx) into
 * onnxruntime-genai's layout with GroupQueryAttention (src/generate/gqa-builder.ts):
 *   tsx scripts/build-gqa-decoder.ts <source dir> <output dir> [float32|float16]
 * Every projection gets a LoRA path (adapters per request, src/generate/lora.ts) unless
 * RAGGUARD_GQA_LORA=false. Setup runs it on the shipped decoder (models/decoder -> models/decoder-gqa, the server's default).
 */
import { copyFile, mkdir, readFile, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { buildGqaDecoder, type GqaDtype, type GqaSourceConfig } from '../src/generate/gqa-builder.js';
import { externalDataReader } from '../src/runtime/model-dir.js';
import { readInitializers, writeModel } from '../src/runtime/onnx-proto.js';

const [src, out, dtypeArg] = process.argv.slice(2);
if (!src || !out) {
  console.error('usage: tsx scripts/build-gqa-decoder.ts <source dir> <output dir> [float32|float16]');
  process.exit(2);
}
const dtype = (dtypeArg ?? 'float32') as GqaDtype;
if (dtype !== 'float32' && dtype !== 'float16') throw new Error(`dtype ${dtype}: float32 or float16`);
const t0 = performance.now();
const cfg = JSON.parse(await readFile(path.join(src, 'config.json'), 'utf8')) as GqaSourceConfig;
// Weights kept outside the graph file (external data, as exports over 2 GiB keep them) are read too.
const external = externalDataReader(path.join(src, 'onnx'));
const weights = readInitializers(await readFile(path.join(src, 'onnx', 'model.onnx')), external.read);
external.close();
const g = buildGqaDecoder(cfg, weights, { dtype, lora: process.env['RAGGUARD_GQA_LORA'] !== 'false' });
await mkdir(out, { recursive: true });
const model = writeModel({ name: 'decoder_gqa', ...g, opsets: { '': 17, 'com.microsoft': 1 } });
await writeFile(path.join(out, 'model.onnx'), model);
await writeFile(path.join(out, 'genai_config.json'), `${JSON.stringify(g.genaiConfig, null, 2)}\n`);
for (const f of ['config.json', 'generation_config.json', 'tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json']) {
  if (existsSync(path.join(src, f))) await copyFile(path.join(src, f), path.join(out, f));
}
console.log(`[gqa] ${src} -> ${out}/model.onnx (${dtype}, ${(model.length / 2 ** 20).toFixed(1)} MiB) in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
