#!/usr/bin/env python3
"""Builds, on the GPU host, a Qwen2-shaped decoder of about 0.5B parameters (Qwen2-0.5B's dimensions,
random weights, float16) in the Hugging Face / Optimum layout the server loads, for speed figures:
the shipped models are too small to be bandwidth-bound. It is built where it runs and never travels.

    python3 scripts/gpu/build_qwen2_05b.py --out .gpu-models/qwen2-0.5b

Layout: config.json, generation_config.json, tokenizer.json + tokenizer_config.json (the shipped
decoder's: its ids are a subset of this vocabulary), onnx/model.onnx exported with a KV cache
(input_ids, attention_mask, position_ids, past_key_values.N.key|value -> logits, present.N.key|value;
KV [batch, kv_heads, seq, head_dim], of the model's dtype), and reference.json: greedy ids from torch on the GPU
for a few prompts, which the Node side compares its own against.

Random weights give nearly flat logits, whose argmax flips under the last bit of float16 rounding;
the final norm's weight is raised so that greedy decoding has clear winners and outputs can be
compared across implementations and batch shapes. Even so, float16's rounding, which changes with the
batch shape, flipped near-ties in 58 of 96 sequences; the float32 build (1.98 GB, under protobuf's
2 GiB) is the one whose outputs can be compared.
"""
import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.cache_utils import DynamicCache

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from kv_export import decoder_io  # noqa: E402

SHIPPED = ROOT / "models" / "decoder"


class Export(torch.nn.Module):
    """forward(input_ids, attention_mask, position_ids, *past) -> (logits, *present), past flat [k0, v0, ...]."""

    def __init__(self, model, layers):
        super().__init__()
        self.model = model
        self.layers = layers

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = DynamicCache()
        for i in range(self.layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True)
        kv = out.past_key_values
        flat = []
        for i in range(self.layers):
            if hasattr(kv, "layers"):
                flat += [kv.layers[i].keys, kv.layers[i].values]
            else:
                k, v = kv[i]
                flat += [k, v]
        return (out.logits, *flat)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    args = ap.parse_args()
    dtype = torch.float16 if args.dtype == "float16" else torch.float32
    out = Path(args.out)
    if (out / "onnx" / "model.onnx").exists():
        print("exists:", out)
        return
    (out / "onnx").mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    gen = json.loads((SHIPPED / "generation_config.json").read_text())
    bos, eos = gen["bos_token_id"], gen["eos_token_id"]
    cfg = Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=args.layers,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=bos, eos_token_id=eos, pad_token_id=eos,
        attn_implementation="eager", torch_dtype=args.dtype, use_cache=True,
    )
    torch.manual_seed(args.seed)
    model = Qwen2ForCausalLM(cfg).eval()
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        model.model.norm.weight.fill_(8.0)
    model = model.to(dtype).cuda()
    params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {params / 1e6:.1f} M", flush=True)

    nl, kvh, hd = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    names_past, names_present, axes = decoder_io(nl)
    dev = "cuda"
    past = [torch.randn(2, kvh, 3, hd, dtype=dtype, device=dev) for _ in range(2 * nl)]
    x = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]], device=dev)
    am = torch.ones(2, 7, dtype=torch.long, device=dev)
    pos = torch.arange(3, 7, device=dev)[None].expand(2, 4)
    with torch.no_grad():
        torch.onnx.export(Export(model, nl), (x, am, pos, *past), str(out / "onnx" / "model.onnx"),
                          input_names=["input_ids", "attention_mask", "position_ids", *names_past],
                          output_names=["logits", *names_present], dynamic_axes=axes, opset_version=17,
                          dynamo=False)
    print(f"exported in {time.time() - t0:.0f} s: {(out / 'onnx' / 'model.onnx').stat().st_size / 1e9:.2f} GB", flush=True)

    conf = model.config.to_dict()
    conf.update({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "torch_dtype": args.dtype,
                 "head_dim": hd, "ragguard_note": "random weights (speed figures only); final norm weight 8"})
    conf.pop("attn_implementation", None)
    conf.pop("_attn_implementation_autoset", None)
    (out / "config.json").write_text(json.dumps(conf, indent=2, default=str))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": bos, "eos_token_id": eos, "do_sample": False}))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(SHIPPED / f, out / f)

    # Reference greedy ids from torch, prompts of the shipped tokenizer's ids.
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(SHIPPED / "tokenizer.json"))
    refs = []
    model.generation_config.eos_token_id = None  # EOS is an ordinary token, as the benchmarks ignore it
    for q in ["How do I list installed packages?", "What does the sticky bit do on /tmp?", "Where are logs kept?"]:
        ids = [bos] + tok.encode(f"Question: {q}\nAnswer:", add_special_tokens=False).ids
        with torch.no_grad():
            g = model.generate(torch.tensor([ids], device=dev), max_new_tokens=24, do_sample=False, pad_token_id=eos)
        refs.append({"prompt_ids": ids, "greedy_ids": g[0, len(ids):].tolist()})
    (out / "reference.json").write_text(json.dumps({"max_new_tokens": 24, "eos_ignored": True, "cases": refs}))
    print(f"done in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
