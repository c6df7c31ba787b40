/**
 * Where a decode step's time goes: ONNX Runtime's own profiler (sessionOptions.enableProfiling) over
 * decode steps of a genai-layout decoder (a converted GGUF included), summed by operator type and by
 * node class (MatMulNBits by bit width and shape, the head apart), per step.
 *
 *   npx tsx scripts/profile-decode.ts [model dir or .gguf] [--rows 1,8] [--context 128] [--steps 16] [--seq 1]
 *
 * --seq n > 1 profiles prefill chunks of n tokens each (over `context` cached ones) instead.
 *
 * The session is the server's (ONNX Runtime's C API, ort-direct.ts: the KV buffers bound in place,
 * the same session options) with the profiler on; PROFILE_THREADS sets its intra-op threads. A
 * diagnostic, not a benchmark: tokens/s come from `npm run bench:gguf`.
 */
import { readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { loadConfig } from '../src/config/config.js';
import { isGguf, ggufDecoderDir, ggufOptionsFor } from '../src/backends/ort/convert/gguf-decoder.js';
import { loraSlots } from '../src/generate/lora.js';
import { readJson } from '../src/runtime/model-dir.js';
import { DirectSession, directUnavailable, type HostTensor } from '../src/backends/ort/ort-direct.js';

const args = process.argv.slice(2);
const flag = (name: string, fallback: string) => {
  const i = args.indexOf(`--${name}`);
  return i < 0 ? fallback : args.splice(i, 2)[1]!;
};
const rowsList = flag('rows', '1,8').split(',').map(Number);
const context = Number(flag('context', '128'));
const steps = Number(flag('steps', '16'));
/** New tokens a run (1: decode steps; more: prefill chunks of that many over `context` cached tokens). */
const seq = Number(flag('seq', '1'));
const cfgEnv = loadConfig(process.env);
const target = args[0] ?? 'models/pretrained/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf';
const dir = isGguf(target) ? await ggufDecoderDir(target, ggufOptionsFor(cfgEnv, console.log)) : target;

interface Cfg { num_hidden_layers: number; num_attention_heads: number; num_key_value_heads?: number; hidden_size: number; head_dim?: number; intermediate_size: number; vocab_size: number }
const cfg = await readJson<Cfg>(path.join(dir, 'config.json'));
const L = cfg.num_hidden_layers;
const kvh = cfg.num_key_value_heads ?? cfg.num_attention_heads;
const D = cfg.head_dim ?? cfg.hidden_size / cfg.num_attention_heads;
const vocab = cfg.vocab_size;

// The server's path: ONNX Runtime's C API with the KV buffers bound in place (ort-direct.ts), profiler on.
const prefix = path.join(tmpdir(), `ragguard-decode-profile-${process.pid}`);
const threads = Number(process.env['PROFILE_THREADS'] ?? 0);
const session = DirectSession.create(path.join(dir, 'model.onnx'), { profilePrefix: prefix, intraOpThreads: threads });
if (!session) throw new Error(`the C API is needed: ${directUnavailable()}`);
const names = new Set(session.inputs.map((i) => i.name));
const slots = names.has('lora_index')
  ? loraSlots({ numLayers: L, hiddenSize: cfg.hidden_size, numHeads: cfg.num_attention_heads, numKvHeads: kvh, headDim: D, intermediateSize: cfg.intermediate_size })
  : [];
const zeroLora: Record<string, HostTensor> = {};
if (slots.length) {
  const index = session.tensor('int64', [1]);
  (index.data as BigInt64Array).fill(0n);
  zeroLora['lora_index'] = index;
  for (const s of slots) {
    zeroLora[s.a] = session.tensor('float32', [1, s.inDim, 0]);
    zeroLora[s.b] = session.tensor('float32', [1, 0, s.outDim]);
  }
}

/** One decode step at `rows` rows over `len` cached tokens each (KV buffers `past`, written in place). */
async function step(rows: number, len: number, past: HostTensor[]): Promise<void> {
  const ids = session!.tensor('int64', [rows, seq]);
  (ids.data as BigInt64Array).fill(100n);
  const mask = session!.tensor('int64', [rows, len + seq]);
  (mask.data as BigInt64Array).fill(1n);
  const feeds: Record<string, HostTensor> = { input_ids: ids, attention_mask: mask, ...zeroLora };
  const fetches: Record<string, HostTensor | null> = { logits: null };
  for (let l = 0; l < L; l++) {
    for (const [j, kv] of (['key', 'value'] as const).entries()) {
      feeds[`past_key_values.${l}.${kv}`] = past[2 * l + j]!;
      fetches[`present.${l}.${kv}`] = past[2 * l + j]!;
    }
  }
  const out = await session!.run(feeds, fetches);
  out['logits']!.dispose();
  ids.dispose();
  mask.dispose();
}

for (const rows of rowsList) {
  const width = Math.ceil((context + (steps + 1) * seq + 16) / 64) * 64;
  const past = Array.from({ length: 2 * L }, () => {
    const t = session.tensor('float32', [rows, kvh, width, D]);
    (t.data as Float32Array).fill(0.01);
    return t;
  });
  await step(rows, seq === 1 ? context - 1 : context, past); // warm-up at this shape
  for (let s = 0; s < steps; s++) await step(rows, seq === 1 ? context + s : context, past);
  for (const t of past) t.dispose();
}
for (const t of Object.values(zeroLora)) t.dispose();
session.dispose(); // writes the profile
const file = path.join(tmpdir(), (await readdir(tmpdir())).filter((f) => f.startsWith(path.basename(prefix))).sort().at(-1)!);

interface Event { cat: string; name: string; dur: number; ts: number; args?: { op_name?: string; input_type_shape?: unknown } }
const events = JSON.parse(await readFile(file, 'utf8')) as Event[];
if (process.env['KEEP_PROFILE']) console.log(`profile kept: ${file}`);
else await rm(file, { force: true });
const runs = events.filter((e) => e.cat === 'Session' && e.name === 'model_run');
for (const [idx, rows] of rowsList.entries()) {
  // This shape's runs: the `steps` after its warm-up, in order.
  const allRuns = runs.slice(idx * (steps + 1) + 1, (idx + 1) * (steps + 1));
  const lo = allRuns[0]!.ts;
  const hi = allRuns.at(-1)!.ts + allRuns.at(-1)!.dur;
  const nodes = events.filter((e) => e.cat === 'Node' && e.name.endsWith('_kernel_time') && e.ts >= lo && e.ts <= hi);
  const byClass = new Map<string, number>();
  for (const e of nodes) {
    const op = e.args?.op_name ?? '?';
    let cls = op;
    if (op === 'MatMulNBits') {
      // The optimizer renames nodes: the class is the product's shape (N x K: the scales' [N, blocks] and
      // the input's width) and its bit width (packed bytes of a block against the block's length).
      const shapes = (e.args?.input_type_shape ?? []) as Record<string, number[]>[];
      const k = Object.values(shapes[0] ?? {})[0]?.at(-1);
      const n = Object.values(shapes[1] ?? {})[0]?.[0];
      const blocks = Object.values(shapes[1] ?? {})[0]?.[1];
      const zp = shapes.length > 2 && Object.keys(shapes[2] ?? {})[0] === 'uint8';
      cls = `MatMulNBits ${n} x ${k}, blocks of ${k !== undefined && blocks ? k / blocks : '?'}${zp ? ', zero points' : ''}${n === vocab ? ' (head)' : ''}`;
    }
    byClass.set(cls, (byClass.get(cls) ?? 0) + e.dur);
  }
  const runMs = allRuns.reduce((s, e) => s + e.dur, 0) / 1000 / steps;
  const nodeMs = nodes.reduce((s, e) => s + e.dur, 0) / 1000 / steps;
  console.log(`\nrows ${rows} x ${seq} new tokens, context ${context}: ${runMs.toFixed(2)} ms a run (profiler), ${nodeMs.toFixed(2)} ms in kernels`);
  for (const [k, v] of [...byClass].sort((a, b) => b[1] - a[1]).slice(0, 20)) console.log(`  ${(v / 1000 / steps).toFixed(3).padStart(9)} ms  ${k}`);
}
