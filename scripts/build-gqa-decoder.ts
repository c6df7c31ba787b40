/**
 * Converts an exported decoder (Optimum layout: config.json, tokenizer files, onnx/model.onnx) into
 * onnxruntime-genai's layout with GroupQueryAttention (src/backends/ort/convert/export-decoder.ts, gqa-builder.ts):
 *   tsx scripts/build-gqa-decoder.ts <source dir> <output dir> [float32|float16]
 * Weights are found by the graph's structure (export-weights.ts), so constant-folded exports convert
 * too. Every projection gets a LoRA path (adapters per request, src/generate/lora.ts) unless
 * RAGGUARD_GQA_LORA=false. Setup runs it on the shipped decoder (models/decoder -> models/decoder-gqa,
 * the server's default); the server converts a dropped-in export by itself (RAGGUARD_DECODER_CONVERT).
 */
import { convertExport } from '../src/backends/ort/convert/export-decoder.js';
import type { GqaDtype } from '../src/backends/ort/convert/gqa-builder.js';

const [src, out, dtypeArg] = process.argv.slice(2);
if (!src || !out) {
  console.error('usage: tsx scripts/build-gqa-decoder.ts <source dir> <output dir> [float32|float16]');
  process.exit(2);
}
const dtype = (dtypeArg ?? 'float32') as GqaDtype;
if (dtype !== 'float32' && dtype !== 'float16') throw new Error(`dtype ${dtype}: float32 or float16`);
const r = await convertExport(src, out, { dtype, lora: process.env['RAGGUARD_GQA_LORA'] !== 'false' });
console.log(`[gqa] ${src} -> ${out}/model.onnx (${dtype}, ${(r.graphBytes / 2 ** 20).toFixed(1)} MiB) in ${r.seconds.toFixed(1)} s`);
