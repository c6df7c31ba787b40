/**
 * bench/gguf.ts's workload, shared with scripts that look into it (scripts/profile-prefill-share.ts):
 * the GGUF decoder converted and loaded as the server does (its ONNX Runtime settings included), and
 * `requests` chat-formatted questions from data/questions.json as token ids.
 */
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { loadConfig, type Config } from '../src/config/config.js';
import { DecoderModel } from '../src/backends/ort/decoder-model.js';
import { ggufDecoderDir, ggufOptionsFor } from '../src/backends/ort/convert/gguf-decoder.js';
import { applySessionSettings } from '../src/backends/ort/ort-direct.js';

export interface GgufWorkload {
  cfg: Config;
  model: DecoderModel;
  prompts: number[][];
  maxPrompt: number;
}

export async function ggufWorkload(root: string, gguf: string, requests: number): Promise<GgufWorkload> {
  const cfg = loadConfig(process.env);
  // The engine's runs as the server makes them (RAGGUARD_INTRA_OP_THREADS, RAGGUARD_INTRA_OP_SPIN).
  applySessionSettings(cfg);
  const dir = await ggufDecoderDir(gguf, ggufOptionsFor(cfg, (m) => console.log(m)));
  const model = await DecoderModel.load(dir, 'cpu');
  const questions = JSON.parse(await readFile(path.join(root, 'data', 'questions.json'), 'utf8')) as { question: string }[];
  const prompts = Array.from({ length: requests }, (_, i) =>
    model.tokenizer.encode(`<|im_start|>user\n${questions[i % questions.length]!.question}<|im_end|>\n<|im_start|>assistant\n`));
  return { cfg, model, prompts, maxPrompt: Math.max(...prompts.map((p) => p.length)) };
}
