/**
 * A GGUF decoder (llama or qwen2) as a Hugging Face checkpoint in float32: config.json and
 * model.safetensors (or, past 2 GiB, transformers' shards and model.safetensors.index.json: one array
 * cannot hold a 1.5B model's 7 GB) with transformers' module names and layouts, the weights dequantized by the same
 * reader the server converts with (gguf-weights.ts: llama's q/k row permutation undone). Training a
 * LoRA adapter for the GGUF decoder starts from it (scripts/train-grounded-lora.py), so that the
 * adapter's modules and shapes are the ones the converted graph's LoRA inputs take.
 *
 *   npx tsx scripts/export-gguf-hf.ts <model.gguf> <out dir>
 */
import { mkdir, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { GgufFile } from '../src/runtime/gguf.js';
import { writeSafetensors } from '../src/runtime/safetensors.js';
import { ggufModel } from '../src/backends/ort/convert/gguf-weights.js';

const [src, out] = process.argv.slice(2);
if (!src || !out) throw new Error('usage: tsx scripts/export-gguf-hf.ts <model.gguf> <out dir>');
const file = GgufFile.open(src);
try {
  const m = ggufModel(file);
  const c = m.config;
  if (m.rotary.linearFactor !== undefined || m.rotary.freqFactors !== undefined) throw new Error(`${src}: rotary scaling is not exported`);
  const names = ['model.embed_tokens.weight', 'model.norm.weight', ...(c.tie_word_embeddings ? [] : ['lm_head.weight'])];
  for (let l = 0; l < c.num_hidden_layers; l++) {
    const p = `model.layers.${l}`;
    names.push(`${p}.input_layernorm.weight`, `${p}.post_attention_layernorm.weight`);
    for (const proj of ['q', 'k', 'v', 'o']) names.push(`${p}.self_attn.${proj}_proj.weight`, `${p}.self_attn.${proj}_proj.bias`);
    for (const proj of ['gate', 'up', 'down']) names.push(`${p}.mlp.${proj}_proj.weight`);
  }
  const q = c.num_attention_heads * c.head_dim!;
  const kv = c.num_key_value_heads! * c.head_dim!;
  const shapeOf = (name: string): number[] => {
    if (name === 'model.embed_tokens.weight' || name === 'lm_head.weight') return [c.vocab_size, c.hidden_size];
    if (name.endsWith('norm.weight')) return [c.hidden_size];
    const mod = /(q|k|v|o|gate|up|down)_proj\.(weight|bias)$/.exec(name)!;
    const dims: Record<string, [number, number]> = {
      q: [q, c.hidden_size], k: [kv, c.hidden_size], v: [kv, c.hidden_size], o: [c.hidden_size, q],
      gate: [c.intermediate_size, c.hidden_size], up: [c.intermediate_size, c.hidden_size], down: [c.hidden_size, c.intermediate_size],
    };
    const [o, i] = dims[mod[1]!]!;
    return mod[2] === 'bias' ? [o] : [o, i];
  };
  const tensors = new Map<string, { shape: number[]; values: Float32Array }>();
  for (const name of names) {
    const values = m.source.floats(name);
    if (!values) {
      if (name.endsWith('.bias')) continue; // llama: no biases
      throw new Error(`${src}: no tensor for ${name}`);
    }
    const shape = shapeOf(name);
    if (values.length !== shape.reduce((x, y) => x * y, 1)) throw new Error(`${name}: ${values.length} values for shape ${shape.join('x')}`);
    tensors.set(name, { shape, values });
  }
  const config = {
    architectures: [m.arch === 'qwen2' ? 'Qwen2ForCausalLM' : 'LlamaForCausalLM'], model_type: m.arch, torch_dtype: 'float32', hidden_act: 'silu',
    vocab_size: c.vocab_size, hidden_size: c.hidden_size, intermediate_size: c.intermediate_size, num_hidden_layers: c.num_hidden_layers,
    num_attention_heads: c.num_attention_heads, num_key_value_heads: c.num_key_value_heads, head_dim: c.head_dim, rms_norm_eps: c.rms_norm_eps,
    rope_theta: c.rope_theta, max_position_embeddings: c.max_position_embeddings, tie_word_embeddings: c.tie_word_embeddings,
    bos_token_id: c.bos_token_id, eos_token_id: c.eos_token_id, pad_token_id: c.pad_token_id,
    ...(m.arch === 'llama' ? { attention_bias: tensors.has('model.layers.0.self_attn.q_proj.bias'), mlp_bias: false } : { use_sliding_window: false }),
    ragguard_source: { gguf: path.resolve(src) },
  };
  await mkdir(out, { recursive: true });
  // Shards of at most 2 GiB, in the tensors' order, named as transformers names them.
  const SHARD = 2 ** 31;
  const shards: Map<string, { shape: number[]; values: Float32Array }>[] = [new Map()];
  let size = 0;
  let total = 0;
  for (const [name, t] of tensors) {
    if (size > 0 && size + t.values.byteLength > SHARD) { shards.push(new Map()); size = 0; }
    shards.at(-1)!.set(name, t);
    size += t.values.byteLength;
    total += t.values.byteLength;
  }
  await rm(path.join(out, 'model.safetensors'), { force: true });
  await rm(path.join(out, 'model.safetensors.index.json'), { force: true });
  if (shards.length === 1) {
    await writeFile(path.join(out, 'model.safetensors'), writeSafetensors(tensors, { format: 'pt' }));
  } else {
    const weightMap: Record<string, string> = {};
    for (const [i, shard] of shards.entries()) {
      const name = `model-${String(i + 1).padStart(5, '0')}-of-${String(shards.length).padStart(5, '0')}.safetensors`;
      await writeFile(path.join(out, name), writeSafetensors(shard, { format: 'pt' }));
      for (const t of shard.keys()) weightMap[t] = name;
    }
    await writeFile(path.join(out, 'model.safetensors.index.json'), `${JSON.stringify({ metadata: { total_size: total }, weight_map: weightMap }, null, 2)}\n`);
  }
  // config.json last: scripts/grounded-lora.sh takes its presence for a finished export.
  await writeFile(path.join(out, 'config.json'), `${JSON.stringify(config, null, 2)}\n`);
  console.log(`[export] ${src} -> ${out}: ${tensors.size} tensors, ${[...tensors.values()].reduce((s, t) => s + t.values.length, 0)} parameters`);
} finally {
  file.close();
}
