"""The shipped LoRA adapters, made by PEFT itself, and PEFT's outputs with them as reference vectors.

    python3 scripts/gpu/build_adapters.py <out dir>      (the GPU host: torch, transformers, peft, onnx)

Loads the shipped decoder's weights (models/decoder/onnx/model.onnx) into transformers' LlamaForCausalLM,
wraps it with PEFT LoRA configs, gives the adapters seeded weights (PEFT initialises lora_B to zero, an
adapter that changes nothing), saves each with save_pretrained (adapter_config.json,
adapter_model.safetensors: the files a real fine-tune leaves), and writes reference.json: for a fixed
prompt, the last position's logits and 16 greedy tokens of the base model and of each adapter, as
torch computes them. test/fixtures/peft holds its output from the H200 (PEFT 0.21, torch 2.11; PEFT's
README.md files dropped), which test/adapters.test.ts checks the server's runs against through
scripts/check-adapters.ts.

  demo-r8     every projection (q, k, v, o, gate, up, down), r 8, lora_alpha 16, alpha_pattern down_proj 32
  demo-qv-r4  q_proj and v_proj only, r 4, lora_alpha 8, use_rslora (scale alpha / sqrt(r))
"""
import json
import os
import sys

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, 'models', 'adapters')
ADAPTERS = {
    'demo-r8': dict(r=8, lora_alpha=16, alpha_pattern={'down_proj': 32},
                    target_modules=['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'], seed=8),
    'demo-qv-r4': dict(r=4, lora_alpha=8, use_rslora=True, target_modules=['q_proj', 'v_proj'], seed=4),
}
# The reference prompt (after BOS, in the shipped tokenizer's ids).
PROMPT_TEXT = 'Question: How do I list the installed packages?\nAnswer:'


def base_model():
    cfg = json.load(open(os.path.join(ROOT, 'models', 'decoder', 'config.json')))
    cfg.pop('torch_dtype', None)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).float().eval()
    graph = onnx.load(os.path.join(ROOT, 'models', 'decoder', 'onnx', 'model.onnx'))
    weights = {}
    for t in graph.graph.initializer:
        name = t.name.removesuffix('_fp16')
        name = name[name.index('model.'):] if 'model.' in name else name
        weights[name] = torch.from_numpy(numpy_helper.to_array(t).astype(np.float32))
    state = model.state_dict()
    loaded = {k: weights[k] for k in state if k in weights}
    if cfg.get('tie_word_embeddings'):
        loaded['lm_head.weight'] = weights['model.embed_tokens.weight']
    missing = [k for k in state if k not in loaded and 'rotary' not in k]
    assert not missing, f'weights not found in the ONNX: {missing}'
    model.load_state_dict(loaded, strict=False)
    return model


def prompt_ids():
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(ROOT, 'models', 'decoder', 'tokenizer.json'))
    return [1] + tok.encode(PROMPT_TEXT, add_special_tokens=False).ids


@torch.no_grad()
def reference(model, ids):
    x = torch.tensor([ids])
    logits = model(input_ids=x).logits[0, -1].tolist()
    out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=16, do_sample=False,
                         eos_token_id=None, pad_token_id=0, min_new_tokens=16)
    return {'last_logits': [round(v, 6) for v in logits], 'greedy': out[0, len(ids):].tolist()}


def main():
    torch.manual_seed(0)
    ids = prompt_ids()
    ref = {'prompt_text': PROMPT_TEXT, 'prompt_ids': ids, 'base': reference(base_model(), ids), 'adapters': {}}
    for name, spec in ADAPTERS.items():
        spec = dict(spec)
        seed = spec.pop('seed')
        model = get_peft_model(base_model(), LoraConfig(lora_dropout=0.0, bias='none', task_type='CAUSAL_LM', **spec))
        g = torch.Generator().manual_seed(seed)
        for n, p in model.named_parameters():
            if 'lora_A' in n:
                bound = 1 / p.shape[1] ** 0.5
                p.data = (torch.rand(p.shape, generator=g) * 2 - 1) * bound
            elif 'lora_B' in n:
                p.data = torch.randn(p.shape, generator=g) * 0.2
        model.eval()
        model.save_pretrained(os.path.join(OUT, name))
        ref['adapters'][name] = reference(model, ids)
        print(name, 'greedy', ref['adapters'][name]['greedy'], 'base', ref['base']['greedy'])
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, 'reference.json'), 'w') as f:
        json.dump(ref, f)
    print(json.dumps({'adapters': list(ADAPTERS), 'prompt_tokens': len(ids)}))


if __name__ == '__main__':
    main()
