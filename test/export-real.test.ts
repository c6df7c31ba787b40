/**
 * The genai converter on exports made by torch.onnx.export itself (constant folding on, its default):
 * each directory under test/fixtures/exports (scripts/gpu/export_folded.py writes them on the GPU host,
 * where torch is; random weights, a few MB) holds an Optimum-layout export and reference.json, torch's
 * greedy ids and last-position logits for a few prompts. Converted, it must generate torch's ids and
 * give its logits.
 */
import assert from 'node:assert/strict';
import { existsSync, readdirSync } from 'node:fs';
import { cp, readFile } from 'node:fs/promises';
import path from 'node:path';
import { test } from 'node:test';
import * as ort from 'onnxruntime-node';
import { DecoderModel } from '../src/backends/ort/decoder-model.js';
import { convertExport } from '../src/backends/ort/convert/export-decoder.js';
import { generate } from '../src/backends/ort/generator.js';
import { readGraph } from '../src/runtime/onnx-proto.js';
import { ROOT, tempDir } from './helpers.js';

const EXPORTS = process.env['RAGGUARD_TEST_EXPORTS'] ?? path.join(ROOT, 'test', 'fixtures', 'exports');

interface Reference {
  eos_token_id: number;
  cases: { prompt_ids: number[]; greedy_ids: number[]; last_logits: number[] }[];
}

interface Shape {
  num_hidden_layers: number;
  num_attention_heads: number;
  num_key_value_heads?: number;
  hidden_size: number;
  head_dim?: number;
}

/** A genai graph without LoRA inputs: its logits for the last position of one prompt, through onnxruntime-node. */
async function genaiLogits(dir: string, cfg: Shape, ids: number[]): Promise<Float32Array> {
  const s = await ort.InferenceSession.create(path.join(dir, 'model.onnx'));
  const kvh = cfg.num_key_value_heads ?? cfg.num_attention_heads;
  const D = cfg.head_dim ?? cfg.hidden_size / cfg.num_attention_heads;
  const n = ids.length;
  const feeds: Record<string, ort.Tensor> = {
    input_ids: new ort.Tensor('int64', BigInt64Array.from(ids, BigInt), [1, n]),
    attention_mask: new ort.Tensor('int64', new BigInt64Array(n).fill(1n), [1, n]),
  };
  for (let l = 0; l < cfg.num_hidden_layers; l++) {
    for (const kv of ['key', 'value']) feeds[`past_key_values.${l}.${kv}`] = new ort.Tensor('float32', new Float32Array(kvh * 64 * D), [1, kvh, 64, D]);
  }
  const out = await s.run(feeds, ['logits']);
  await s.release();
  return out['logits']!.data as Float32Array;
}

async function exportWithTokenizer(dir: string): Promise<string> {
  if (existsSync(path.join(dir, 'tokenizer.json'))) return dir;
  const copy = await tempDir('ragguard-export-');
  await cp(dir, copy, { recursive: true });
  await cp(path.join(ROOT, 'models', 'decoder', 'tokenizer.json'), path.join(copy, 'tokenizer.json'));
  return copy;
}

const dirs = existsSync(EXPORTS) ? readdirSync(EXPORTS).filter((d) => existsSync(path.join(EXPORTS, d, 'reference.json'))).sort() : [];

test('real folded exports are present', { skip: dirs.length > 0 ? false : `no exports under ${EXPORTS}: run python3 scripts/gpu/export_folded.py --out test/fixtures/exports where torch is` }, () => {
  assert.ok(dirs.length > 0);
});

for (const name of dirs) {
  test(`${name}: torch's folded export converts by structure, generates torch's greedy ids and gives its logits`, async () => {
    const dir = path.join(EXPORTS, name);
    const ref = JSON.parse(await readFile(path.join(dir, 'reference.json'), 'utf8')) as Reference;
    const cfg = JSON.parse(await readFile(path.join(dir, 'config.json'), 'utf8')) as Shape;
    const graph = readGraph(await readFile(path.join(dir, 'onnx', 'model.onnx')));
    // What makes it a test of the structure: no projection keeps its module name.
    assert.ok(![...graph.initializers.keys()].some((n) => /q_proj\.weight/.test(n)), 'the export has folded (renamed) projection weights');
    // The fixtures leave out the tokenizer (the shipped decoder's, as export_folded.py uses): the export a
    // user drops in has one, so it is put back beside a copy of the export.
    const src = await exportWithTokenizer(dir);
    const out = await tempDir('ragguard-gqa-');
    await convertExport(src, out, { lora: false });
    for (const c of ref.cases) {
      const got = await genaiLogits(out, cfg, c.prompt_ids);
      let worst = 0;
      for (let i = 0; i < got.length; i++) worst = Math.max(worst, Math.abs(got[i]! - c.last_logits[i]!));
      assert.ok(worst < 2e-3, `${name}: logits differ from torch's by ${worst}`);
    }
    const decoder = await DecoderModel.load(out, 'cpu');
    for (const c of ref.cases) {
      const eos = c.greedy_ids.indexOf(ref.eos_token_id);
      const expected = eos < 0 ? c.greedy_ids : c.greedy_ids.slice(0, eos);
      const g = await generate(decoder, c.prompt_ids, { maxNewTokens: c.greedy_ids.length, temperature: 0 });
      assert.deepEqual(g.ids, expected, `${name}: greedy ids`);
    }
  });
}
