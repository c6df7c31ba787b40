/**
 * Reference vectors for a GGUF decoder made by llama.cpp itself (node-llama-cpp 3.21.1, prebuilt CPU
 * binaries, no build): for each prompt its token ids (special tokens parsed), then greedy decoding
 * step by step with, at each step, the top log-probabilities of the next token.
 *   tsx scripts/gguf-reference.ts [--f32-copy] <model.gguf> <out.json> [steps]
 * --f32-copy runs llama.cpp on a copy of the file with every tensor dequantized to F32 (the same
 * weights; written here, metadata as it is): llama.cpp's quantized matrix products quantize the
 * activations to 8 bits (Q8_1 blocks) as well, which moves its log-probabilities by up to about a
 * nat on a 4-bit model, whereas on F32 weights only its f16 KV cache remains between it and an
 * exact product.
 * test/gguf.test.ts checks the server's decoder against the committed files
 * (test/fixtures/gguf/smollm2-135m-q4_1*.json), so that the test needs no llama.cpp at run time.
 */
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { getLlama } from 'node-llama-cpp';
import { GGML, GgufFile, writeGguf, type GgufValue, type GgufValueType } from '../src/runtime/gguf.js';

const args = process.argv.slice(2);
const f32Copy = args[0] === '--f32-copy';
const [modelPath, out, stepsArg] = f32Copy ? args.slice(1) : args;
if (!modelPath || !out) {
  console.error('usage: tsx scripts/gguf-reference.ts <model.gguf> <out.json> [steps]');
  process.exit(2);
}
const steps = Number(stepsArg ?? 12);
const TOP = 8;

export const PROMPTS = [
  '<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n',
  '<|im_start|>system\nAnswer from the context.<|im_end|>\n<|im_start|>user\n[1] The sticky bit on /tmp lets only a file\'s owner delete it.\nWhat does the sticky bit do?<|im_end|>\n<|im_start|>assistant\n',
  'The quick brown fox jumps over',
  'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
  'Paris, Berlin, Madrid, Rome and 12345 other cities — naïve café résumé 🙂',
  '<|im_start|>user\nList three prime numbers.<|im_end|>\n<|im_start|>assistant\n',
];

async function sha256(file: string): Promise<string> {
  const h = createHash('sha256');
  for await (const chunk of createReadStream(file)) h.update(chunk as Buffer);
  return h.digest('hex');
}

/** The file with every tensor as F32 (general.file_type 0: all F32), in a temporary directory. */
async function writeF32Copy(src: string): Promise<{ file: string; dir: string }> {
  const f = GgufFile.open(src);
  try {
    const meta = [...f.metadata].map(([k, v]) => [k, f.metadataTypes.get(k)!, k === 'general.file_type' ? 0 : v] as [string, GgufValueType, GgufValue]);
    const tensors = [...f.tensors.values()].map((t) => ({ name: t.name, dims: t.dims, type: GGML.F32, data: new Uint8Array(f.floats(t).buffer) }));
    const dir = await mkdtemp(path.join(tmpdir(), 'ragguard-f32-'));
    const file = path.join(dir, 'model-f32.gguf');
    await writeFile(file, writeGguf(meta, tensors));
    return { file, dir };
  } finally {
    f.close();
  }
}

const copy = f32Copy ? await writeF32Copy(modelPath) : undefined;
const llama = await getLlama({ gpu: false, build: 'never' });
// Two threads: llama.cpp's spinning workers beyond the cores stall a shared machine (minutes, not seconds).
const model = await llama.loadModel({ modelPath: copy?.file ?? modelPath });
const cases = [];
for (const text of PROMPTS) {
  const context = await model.createContext({ contextSize: 512, sequences: 1, threads: 2 });
  const seq = context.getSequence();
  const ids = [...model.tokenize(text, true)];
  const gen: { token: number; top: [number, number][] }[] = [];
  let input: number[] = ids;
  for (let s = 0; s < steps; s++) {
    const items = input.map((t, i) => (i === input.length - 1 ? [t, { generateNext: { probabilities: true } }] as const : t));
    const res = await seq.controlledEvaluate(items as Parameters<typeof seq.controlledEvaluate>[0]);
    const probs = res[input.length - 1]!.next.probabilities!;
    const top = [...probs.entries()].slice(0, TOP).map(([t, p]) => [t, Math.log(p)] as [number, number]);
    gen.push({ token: top[0]![0], top });
    input = [top[0]![0]];
  }
  cases.push({ text, ids, steps: gen });
  console.log(`[gguf-reference] ${JSON.stringify(text.slice(0, 40))}: ${gen.map((g) => g.token).join(' ')}`);
  await context.dispose();
}
const doc = {
  reference: 'node-llama-cpp 3.21.1 (llama.cpp, CPU), greedy; top: [token, log-probability] of the next token',
  model: path.basename(modelPath), sha256: await sha256(modelPath),
  weights: f32Copy ? 'an F32 copy of the file (every tensor dequantized)' : 'as stored', cases,
};
await writeFile(out, `${JSON.stringify(doc)}\n`);
console.log(`[gguf-reference] ${cases.length} prompts x ${steps} steps -> ${out}`);
await model.dispose();
await llama.dispose();
if (copy) await rm(copy.dir, { recursive: true, force: true });
