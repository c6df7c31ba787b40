import path from 'node:path';
import { readFile } from 'node:fs/promises';
import { DecoderModel } from '../src/generate/decoder-model.js';
import { ggufDecoderDir } from '../src/generate/gguf-decoder.js';
const ROOT = path.resolve(import.meta.dirname, '..');
const gguf = path.join(ROOT, 'models/pretrained/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf');
const q = JSON.parse(await readFile(path.join(ROOT, 'data/questions.json'), 'utf8')) as { question: string }[];
const res: Record<string, { ids: number[]; gaps: number[] }> = {};
for (const kernels of ['onnxruntime', 'ragguard'] as const) {
  const m = await DecoderModel.load(await ggufDecoderDir(gguf, { cacheDir: path.join(ROOT, 'models/gguf-cache'), weights: 'nbits', kernels, lora: false }), 'cpu');
  const ids = m.tokenizer.encode(`<|im_start|>user\n${q[0]!.question}<|im_end|>\n<|im_start|>assistant\n`);
  const width = m.pastWidth([0], ids.length + 64);
  let past = m.allocPast(1, width); let len = 0; let toks = ids; const out: number[] = []; const gaps: number[] = [];
  for (let i = 0; i < 64; i++) {
    const r = await m.forward({ tokens: [toks], lengths: [len], past, width }); past = r.present; len += toks.length;
    const l = r.lastLogits; let b = 0; for (let v = 1; v < l.length; v++) if (l[v]! > l[b]!) b = v;
    let s = -Infinity; for (let v = 0; v < l.length; v++) if (v !== b && l[v]! > s) s = l[v]!;
    out.push(b); gaps.push(l[b]! - s); toks = [b];
  }
  res[kernels] = { ids: out, gaps };
}
let i = 0; while (i < 64 && res['onnxruntime']!.ids[i] === res['ragguard']!.ids[i]) i++;
console.log('first difference at', i, 'gap there (onnxruntime, ragguard):', res['onnxruntime']!.gaps[i], res['ragguard']!.gaps[i]);
console.log('smallest gap before it:', Math.min(...res['onnxruntime']!.gaps.slice(0, i)));
