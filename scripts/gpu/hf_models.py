#!/usr/bin/env python3
"""Builds, on the GPU host, Hugging Face checkpoints with random weights for the CUDA backend's check and
benchmarks (they are built where they run and never travel), and torch/transformers reference outputs on
the same weights:

    python3 scripts/gpu/hf_models.py --out .gpu-models MODEL ...

MODEL is one of
  qwen2-0.5b-f16, qwen2-0.5b-bf16   Qwen2-0.5B's dimensions (q/k/v biases, tied embeddings, rope_theta 1e6)
  llama-small-bf16                  a 4-layer Llama with Llama 3 rope scaling, untied head, sharded files
  qwen2-7b-bf16                     Qwen2-7B's dimensions, sharded (speed only: no reference)

Each directory gets config.json, generation_config.json, model.safetensors (or shards with
model.safetensors.index.json) and, except for 7B, reference.json: prompts (random token ids, one pair
sharing a 64-token prefix), torch's greedy ids for each with the top-1/top-2 margin of every step (a
divergence at a near-tie is rounding, not a bug), and the prompt's last-position logits (logits.f32, one
vocab-sized float32 row per prompt).

Random weights give nearly flat logits; the final norm's weight is raised (as build_qwen2_05b.py does) so
that greedy decoding has clear winners.

Each small model also gets a PEFT LoRA adapter for the CUDA backend's LoRA slots (adapters/lora: every
projection, r 8, lora_alpha 16, down_proj's alpha 32 by alpha_pattern; seeded random A and B large enough
to change the greedy ids), saved by PEFT itself, with the same reference.json and logits.f32 computed by
transformers + peft, and a byte-equal copy (adapters/lora-copy) so that a batch can hold two entries.
"""
import argparse
import json
import shutil
import time
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

NEW = 24
NORM_WEIGHT = 8.0
LORA = dict(r=8, lora_alpha=16, alpha_pattern={"down_proj": 32},
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
# Standard deviation of the random A and B: delta W = scale B A has elements of about
# scale * sqrt(r) * std^2 = 2 * 2.8 * 0.0036 = 0.02, the base weights' own (initializer_range), so the
# adapter changes the greedy ids without swamping the model.
LORA_STD = 0.06


def qwen2(layers=24, hidden=896, inter=4864, heads=14, kv=2, vocab=151936, tie=True):
    return Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=32768,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=tie, bos_token_id=1,
                       eos_token_id=2, use_sliding_window=False)


def llama_small():
    return LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                       num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=8192,
                       rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
                       eos_token_id=2,
                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 1024})


MODELS = {
    "qwen2-0.5b-f16": (lambda: (Qwen2ForCausalLM, qwen2()), torch.float16, None),
    "qwen2-0.5b-bf16": (lambda: (Qwen2ForCausalLM, qwen2()), torch.bfloat16, None),
    "llama-small-bf16": (lambda: (LlamaForCausalLM, llama_small()), torch.bfloat16, "40MB"),
    "qwen2-7b-bf16": (lambda: (Qwen2ForCausalLM, qwen2(layers=28, hidden=3584, inter=18944, heads=28, kv=4,
                                                        vocab=152064, tie=False)), torch.bfloat16, "4GB"),
}


def prompts(vocab, seed=7):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in [5, 17, 40, 100, 300]:
        out.append(torch.randint(3, vocab, (n,), generator=g).tolist())
    shared = torch.randint(3, vocab, (64,), generator=g).tolist()
    out.append(shared + torch.randint(3, vocab, (9,), generator=g).tolist())
    out.append(shared + torch.randint(3, vocab, (21,), generator=g).tolist())
    return out


@torch.no_grad()
def reference(model, vocab, out):
    cases, rows = [], []
    for ids in prompts(vocab):
        x = torch.tensor([ids], device="cuda")
        logits = model(x).logits[0, -1].float()
        rows.append(logits.cpu())
        g = model.generate(x, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, output_scores=True,
                           return_dict_in_generate=True, pad_token_id=0)
        margins = []
        for s in g.scores:
            top = torch.topk(s[0].float(), 2).values
            margins.append(float(top[0] - top[1]))
        cases.append({"prompt_ids": ids, "greedy_ids": g.sequences[0, len(ids):].tolist(), "margins": margins,
                      "logit_scale": float(logits.abs().max())})
    torch.stack(rows).numpy().astype("float32").tofile(out / "logits.f32")
    (out / "reference.json").write_text(json.dumps({"max_new_tokens": NEW, "eos_ignored": True, "cases": cases}))


def build(name, root):
    make, dtype, shard = MODELS[name]
    out = root / name
    if (out / "config.json").exists():
        print("exists:", out, flush=True)
        return
    t0 = time.time()
    cls, cfg = make()
    torch.manual_seed(0)
    torch.set_default_dtype(dtype)
    with torch.device("cuda"):
        model = cls(cfg).eval()
    torch.set_default_dtype(torch.float32)
    with torch.no_grad():
        model.model.norm.weight.fill_(NORM_WEIGHT)
    model.generation_config.eos_token_id = None  # EOS is an ordinary token: checks and benchmarks ignore it
    out.mkdir(parents=True, exist_ok=True)
    kw = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(out, safe_serialization=True, **kw)
    conf = json.loads((out / "config.json").read_text())
    conf["ragguard_note"] = f"random weights, final norm weight {NORM_WEIGHT}"
    (out / "config.json").write_text(json.dumps(conf, indent=2))
    print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters, saved in {time.time() - t0:.0f} s",
          flush=True)
    if "7b" not in name:
        reference(model, cfg.vocab_size, out)
    del model
    torch.cuda.empty_cache()


def build_adapter(name, root):
    """The LoRA adapter of a built model and transformers + peft's reference outputs with it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    _, dtype, _ = MODELS[name]
    base = root / name
    out = base / "adapters" / "lora"
    if (out / "reference.json").exists():
        print("exists:", out, flush=True)
        return
    t0 = time.time()
    # Loaded in its dtype, not cast after: Module.to(dtype) would also round the rotary inv_freq buffer,
    # which transformers keeps in float32 (as build() made it). The keyword was torch_dtype before 4.56.
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    kw = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(base, **{kw: dtype}).to("cuda").eval()
    assert next(model.parameters()).dtype == dtype, f"loaded as {next(model.parameters()).dtype}, not {dtype}"
    model.generation_config.eos_token_id = None
    model = get_peft_model(model, LoraConfig(lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", **LORA))
    g = torch.Generator().manual_seed(12)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_A" in n or "lora_B" in n:
                p.data = (torch.randn(p.shape, generator=g) * LORA_STD).to(p.device, p.dtype)
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    reference(model, model.config.vocab_size, out)
    # The same model and adapter in float32 (its weights upcast exactly): the result that both peft in the
    # model's dtype and the engine approximate. In bfloat16 peft rounds the adapter's low-rank activation
    # and its product to 8 bits each; the check measures both engines' distance from this.
    model = model.float()
    with torch.no_grad():
        rows = [model(torch.tensor([ids], device="cuda")).logits[0, -1].float().cpu() for ids in prompts(model.config.vocab_size)]
    torch.stack(rows).numpy().astype("float32").tofile(out / "logits-float32.f32")
    shutil.copytree(out, base / "adapters" / "lora-copy", dirs_exist_ok=True)
    print(f"{name}: LoRA adapter r {LORA['r']} saved with its reference in {time.time() - t0:.0f} s", flush=True)
    del model
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".gpu-models")
    ap.add_argument("models", nargs="+", choices=sorted(MODELS))
    args = ap.parse_args()
    for m in args.models:
        build(m, Path(args.out))
        if "7b" not in m:
            build_adapter(m, Path(args.out))


if __name__ == "__main__":
    main()
