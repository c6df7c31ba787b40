/**
 * Writes the shipped decoder (an Optimum export whose initializers keep their module names) as a Hugging
 * Face checkpoint: config.json, model.safetensors (float32, torch's layouts), tokenizer and generation
 * config. The CUDA backend reads that layout, so the same trained model (and the sample LoRA adapters
 * trained for it) runs on the ONNX Runtime paths and on the GPU, and their outputs can be compared.
 *
 *   npx tsx scripts/export-hf-checkpoint.ts [models/decoder] [out dir, default models/decoder-hf]
 */
import { existsSync } from 'node:fs';
import { copyFile, mkdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { halfsToFloats } from '../src/runtime/float16.js';
import { externalDataReader } from '../src/runtime/model-dir.js';
import { ONNX_FLOAT, ONNX_FLOAT16, readInitializers } from '../src/runtime/onnx-proto.js';
import { writeSafetensors } from '../src/runtime/safetensors.js';

const [src = 'models/decoder', out = 'models/decoder-hf'] = process.argv.slice(2);
const external = externalDataReader(path.join(src, 'onnx'));
const all = readInitializers(await readFile(path.join(src, 'onnx', 'model.onnx')), external.read);
external.close();
const tensors = new Map<string, { shape: number[]; values: Float32Array }>();
for (const t of all.values()) {
  // Module names, whatever wrapper prefix or '_fp16' suffix the export gave them; other initializers
  // (constants of the graph) are not weights.
  const name = t.name.replace(/_fp16$/, '');
  const at = name.search(/(^|\.)(model\.|lm_head\.)/);
  if (at < 0 || !/\.weight$|\.bias$/.test(name)) continue;
  const key = name.slice(name[at] === '.' ? at + 1 : at);
  const bytes = new Uint8Array(t.data);
  const values = t.dataType === ONNX_FLOAT ? new Float32Array(bytes.slice().buffer)
    : t.dataType === ONNX_FLOAT16 ? halfsToFloats(new Uint16Array(bytes.slice().buffer)) : undefined;
  if (!values) throw new Error(`${t.name}: element type ${t.dataType}, float32 or float16 expected`);
  tensors.set(key, { shape: t.dims.map(Number), values });
}
if (!tensors.has('model.embed_tokens.weight')) throw new Error(`${src}: no model.embed_tokens.weight among the initializers (not a by-name export)`);
await mkdir(out, { recursive: true });
await writeFile(path.join(out, 'model.safetensors'), writeSafetensors(tensors, { format: 'pt' }));
for (const f of ['config.json', 'generation_config.json', 'tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json']) {
  if (existsSync(path.join(src, f))) await copyFile(path.join(src, f), path.join(out, f));
}
console.log(`[hf] ${src} -> ${out}: ${tensors.size} tensors`);
