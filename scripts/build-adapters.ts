/**
 * The sample LoRA adapters for the shipped decoder, in PEFT's layout (adapter_config.json,
 * adapter_model.safetensors with base_model.model.model.layers.N.<module>.lora_A|B.weight), seeded so
 * that every build writes the same bytes:
 *   tsx scripts/build-adapters.ts [out dir]     (setup: models/adapters)
 *
 *   demo-r8     every projection (q, k, v, o, gate, up, down), r 8, lora_alpha 16, alpha_pattern down_proj 32
 *   demo-qv-r4  q_proj and v_proj only, r 4, lora_alpha 8, use_rslora (scale alpha / sqrt(r))
 *
 * lora_A is uniform in +-1/sqrt(in) as PEFT initialises it; lora_B, which PEFT starts at zero (an
 * adapter that changes nothing), is drawn from N(0, 0.2) so that an adapter visibly changes answers.
 * scripts/gpu/build_adapters.py makes the same kind with PEFT itself, for a cross-check against torch.
 */
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { PROJECTION_MODULES, type PeftConfig } from '../src/generate/lora.js';
import { seededRandom } from '../src/generate/sampler.js';
import { writeSafetensors } from '../src/runtime/safetensors.js';

interface Spec extends PeftConfig {
  r: number;
  target_modules: string[];
  seed: number;
}

const SPECS: Record<string, Spec> = {
  'demo-r8': { r: 8, lora_alpha: 16, alpha_pattern: { down_proj: 32 }, target_modules: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'], seed: 8 },
  'demo-qv-r4': { r: 4, lora_alpha: 8, use_rslora: true, target_modules: ['q_proj', 'v_proj'], seed: 4 },
};

const out = process.argv[2] ?? 'models/adapters';
const cfg = JSON.parse(await readFile('models/decoder/config.json', 'utf8')) as {
  num_hidden_layers: number; hidden_size: number; intermediate_size: number; num_attention_heads: number; num_key_value_heads: number; head_dim?: number;
};
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
const modules = Object.values(PROJECTION_MODULES).flat();

for (const [name, { seed, ...spec }] of Object.entries(SPECS)) {
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
      tensors.set(`${prefix}.lora_B.weight`, { shape: [outDim, spec.r], values: Float32Array.from({ length: outDim * spec.r }, () => 0.2 * normal()) });
    }
  }
  const config: PeftConfig & Record<string, unknown> = {
    peft_type: 'LORA', task_type: 'CAUSAL_LM', base_model_name_or_path: 'ragguard/models/decoder', bias: 'none',
    lora_dropout: 0, fan_in_fan_out: false, use_dora: false, use_rslora: false, alpha_pattern: {}, rank_pattern: {}, ...spec,
  };
  const dir = path.join(out, name);
  await mkdir(dir, { recursive: true });
  await writeFile(path.join(dir, 'adapter_config.json'), `${JSON.stringify(config, null, 2)}\n`);
  await writeFile(path.join(dir, 'adapter_model.safetensors'), writeSafetensors(tensors, { format: 'pt' }));
  console.log(`[adapters] ${dir}: ${tensors.size / 2} LoRA pairs, r ${spec.r}`);
}
