/**
 * The sample LoRA adapters, in PEFT's layout (adapter_config.json, adapter_model.safetensors with
 * base_model.model.model.layers.N.<module>.lora_A|B.weight), seeded so that every build writes the same
 * bytes, and the trained ones shipped in models/shipped-adapters copied beside them:
 *   tsx scripts/build-adapters.ts [out dir]     (setup: models/adapters)
 *
 * For the shipped self-trained decoder (models/decoder):
 *   demo-r8          every projection (q, k, v, o, gate, up, down), r 8, lora_alpha 16, alpha_pattern down_proj 32
 *   demo-qv-r4       q_proj and v_proj only, r 4, lora_alpha 8, use_rslora (scale alpha / sqrt(r))
 * For Qwen2.5-Coder-0.5B-Instruct (the default decoder until 2026-12-06; setup fetches it beside the 1.5B):
 *   coder-random-r8  every projection, r 8, lora_alpha 16: random, for mixing adapters in a batch
 *   coder-grounded   (shipped, trained: models/shipped-adapters/README.md) q_proj and v_proj, r 8
 * For the default decoder, Qwen2.5-Coder-1.5B-Instruct:
 *   coder-grounded-1.5b  (shipped, trained) q_proj and v_proj, r 8
 *
 * lora_A is uniform in +-1/sqrt(in) as PEFT initialises it; lora_B, which PEFT starts at zero (an
 * adapter that changes nothing), is drawn from N(0, sigma) so that an adapter visibly changes answers.
 * The 0.5B's shape is written here rather than read from its GGUF: setup builds the adapters
 * before it fetches the GGUF, whose conversion then finds them (RAGGUARD_DECODER_LORA=auto); a test
 * checks the two agree. scripts/gpu/build_adapters.py makes the same kind with PEFT itself, for a
 * cross-check against torch.
 */
import { cp, mkdir, readdir, readFile, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { PROJECTION_MODULES, type PeftConfig } from '../src/generate/lora.js';
import { seededRandom } from '../src/generate/sampler.js';
import { writeSafetensors } from '../src/runtime/safetensors.js';

/** A decoder's shape in transformers' names. */
interface BaseShape {
  num_hidden_layers: number; hidden_size: number; intermediate_size: number; num_attention_heads: number; num_key_value_heads: number; head_dim?: number;
}

/** Qwen2.5-Coder-0.5B-Instruct's shape (its config.json; the GGUF's metadata says the same). */
const CODER_SHAPE: BaseShape = { num_hidden_layers: 24, hidden_size: 896, intermediate_size: 4864, num_attention_heads: 14, num_key_value_heads: 2, head_dim: 64 };

interface Spec extends PeftConfig {
  r: number;
  target_modules: string[];
  seed: number;
  /** lora_B's standard deviation. */
  sigma: number;
  base: 'decoder' | 'coder';
}

const ALL = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'];
const SPECS: Record<string, Spec> = {
  'demo-r8': { base: 'decoder', r: 8, lora_alpha: 16, alpha_pattern: { down_proj: 32 }, target_modules: ALL, seed: 8, sigma: 0.2 },
  'demo-qv-r4': { base: 'decoder', r: 4, lora_alpha: 8, use_rslora: true, target_modules: ['q_proj', 'v_proj'], seed: 4, sigma: 0.2 },
  // Smaller than the small decoder's: at 0.2 the 0.5B model's answers turn to noise (it is for mixing, not reading).
  'coder-random-r8': { base: 'coder', r: 8, lora_alpha: 16, target_modules: ALL, seed: 32, sigma: 0.02 },
};
const BASE_NAMES = { decoder: 'ragguard/models/decoder', coder: 'Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf' };

const out = process.argv[2] ?? 'models/adapters';
const SHIPPED = 'models/shipped-adapters';
const shapes: Record<Spec['base'], BaseShape> = {
  decoder: JSON.parse(await readFile('models/decoder/config.json', 'utf8')) as BaseShape,
  coder: CODER_SHAPE,
};
const modules = Object.values(PROJECTION_MODULES).flat();

for (const [name, { seed, sigma, base, ...spec }] of Object.entries(SPECS)) {
  const cfg = shapes[base];
  const D = cfg.head_dim ?? cfg.hidden_size / cfg.num_attention_heads;
  const dims: Record<string, [number, number]> = {
    q_proj: [cfg.hidden_size, cfg.num_attention_heads * D],
    k_proj: [cfg.hidden_size, cfg.num_key_value_heads * D],
    v_proj: [cfg.hidden_size, cfg.num_key_value_heads * D],
    o_proj: [cfg.num_attention_heads * D, cfg.hidden_size],
    gate_proj: [cfg.hidden_size, cfg.intermediate_size],
    up_proj: [cfg.hidden_size, cfg.intermediate_size],
    down_proj: [cfg.intermediate_size, cfg.hidden_size],
  };
  const random = seededRandom(seed);
  // Box-Muller from the seeded uniform stream.
  const normal = () => Math.sqrt(-2 * Math.log(1 - random())) * Math.cos(2 * Math.PI * random());
  const tensors = new Map<string, { shape: number[]; values: Float32Array }>();
  for (let l = 0; l < cfg.num_hidden_layers; l++) {
    for (const module of modules) {
      const short = module.split('.')[1]!;
      if (!spec.target_modules.includes(short)) continue;
      const [inDim, outDim] = dims[short]!;
      const bound = 1 / Math.sqrt(inDim);
      const prefix = `base_model.model.model.layers.${l}.${module}`;
      tensors.set(`${prefix}.lora_A.weight`, { shape: [spec.r, inDim], values: Float32Array.from({ length: spec.r * inDim }, () => (2 * random() - 1) * bound) });
      tensors.set(`${prefix}.lora_B.weight`, { shape: [outDim, spec.r], values: Float32Array.from({ length: outDim * spec.r }, () => sigma * normal()) });
    }
  }
  const config: PeftConfig & Record<string, unknown> = {
    peft_type: 'LORA', task_type: 'CAUSAL_LM', base_model_name_or_path: BASE_NAMES[base], bias: 'none',
    lora_dropout: 0, fan_in_fan_out: false, use_dora: false, use_rslora: false, alpha_pattern: {}, rank_pattern: {}, ...spec,
  };
  const dir = path.join(out, name);
  await mkdir(dir, { recursive: true });
  await writeFile(path.join(dir, 'adapter_config.json'), `${JSON.stringify(config, null, 2)}\n`);
  await writeFile(path.join(dir, 'adapter_model.safetensors'), writeSafetensors(tensors, { format: 'pt' }));
  console.log(`[adapters] ${dir}: ${tensors.size / 2} LoRA pairs, r ${spec.r}`);
}

// The trained adapters, as they are in git.
if (existsSync(SHIPPED)) {
  for (const name of (await readdir(SHIPPED, { withFileTypes: true })).filter((d) => d.isDirectory()).map((d) => d.name).sort()) {
    const dir = path.join(out, name);
    await mkdir(dir, { recursive: true });
    for (const f of ['adapter_config.json', 'adapter_model.safetensors']) await cp(path.join(SHIPPED, name, f), path.join(dir, f));
    console.log(`[adapters] ${dir}: copied from ${SHIPPED}/${name}`);
  }
}
