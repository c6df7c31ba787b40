/**
 * Reference vectors for a GGUF decoder made by llama.cpp itself (node-llama-cpp 3.21.1, prebuilt CPU
 * binaries, no build): for each prompt its token ids (special tokens parsed), then greedy decoding
 * step by step with, at each step, the top log-probabilities of the next token.
 *   tsx scripts/gguf-reference.ts <model.gguf> <out.json> [steps]
 * test/gguf.test.ts checks the server's decoder against the committed file
 * (test/fixtures/gguf/smollm2-135m-q4_1.json), so that the test needs no llama.cpp at run time.
 */
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { getLlama } from 'node-llama-cpp';

const [modelPath, out, stepsArg] = process.argv.slice(2);
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

const llama = await getLlama({ gpu: false, build: 'never' });
const model = await llama.loadModel({ modelPath });
const cases = [];
for (const text of PROMPTS) {
  const context = await model.createContext({ contextSize: 512, sequences: 1 });
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
  await context.dispose();
}
const doc = {
  reference: 'node-llama-cpp 3.21.1 (llama.cpp, CPU), greedy; top: [token, log-probability] of the next token',
  model: modelPath.split('/').pop(), sha256: await sha256(modelPath), cases,
};
await writeFile(out, `${JSON.stringify(doc)}\n`);
console.log(`[gguf-reference] ${cases.length} prompts x ${steps} steps -> ${out}`);
await model.dispose();
await llama.dispose();
