#!/usr/bin/env python3
"""Exports small random-weight decoders as transformers' models are commonly exported (torch.onnx.export's
TorchScript exporter with its default constant folding: projection weights renamed `onnx::MatMul_N` and
stored [in, out]), with torch's own greedy ids and last-position logits as the reference, for
test/export-real.test.ts (the genai converter must find the weights by the graph's structure):

    python3 scripts/gpu/export_folded.py --out "$OUT/exports"

then copy the directories it writes into test/fixtures/exports/ (about 5 MB in all), leaving out tokenizer.json
(the shipped decoder's: the test puts it back). Torch runs on the CPU
in float32, so the reference is exact up to the exporter's own rounding. Models:

  llama3-tiny  Llama, untied head, Llama 3 rope scaling (factor 8), eager attention
  qwen2-tiny   Qwen2, q/k/v biases, tied embeddings, rope_theta 1e6, sdpa attention

Both use the shipped decoder's tokenizer (vocab 4096). Random weights give flat logits: the norms' weights
are drawn around 1 and the final norm's raised (as build_qwen2_05b.py does), biases drawn non-zero, so
that greedy decoding has clear winners and a weight or bias put in the wrong place shows.
"""
import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
from kv_export import decoder_io  # noqa: E402
from build_qwen2_05b import Export  # noqa: E402

SHIPPED = ROOT / "models" / "decoder"
NEW = 16


def models():
    common = dict(vocab_size=4096, hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-6, bos_token_id=1,
                  eos_token_id=2, pad_token_id=0)
    llama = LlamaConfig(**common, rope_theta=500000.0, tie_word_embeddings=False,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 256})
    qwen2 = Qwen2Config(**common, rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False)
    return [("llama3-tiny", LlamaForCausalLM, llama, "llama", "eager"), ("qwen2-tiny", Qwen2ForCausalLM, qwen2, "qwen2", "sdpa")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    for name, cls, cfg, model_type, attn in models():
        out = Path(args.out) / name
        shutil.rmtree(out, ignore_errors=True)
        (out / "onnx").mkdir(parents=True)
        torch.manual_seed(args.seed)
        cfg._attn_implementation = attn
        model = cls(cfg).eval()
        model.config._attn_implementation = attn
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith("norm.weight"):
                    p.uniform_(0.5, 1.5)
                elif n.endswith(".bias"):
                    p.normal_(0.0, 0.5)
            model.model.norm.weight.fill_(8.0)
        nl, kvh = cfg.num_hidden_layers, cfg.num_key_value_heads
        hd = cfg.hidden_size // cfg.num_attention_heads
        names_past, names_present, axes = decoder_io(nl)
        past = [torch.randn(2, kvh, 3, hd) for _ in range(2 * nl)]
        x = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
        am = torch.ones(2, 7, dtype=torch.long)
        pos = torch.arange(3, 7)[None].expand(2, 4)
        def export():
            with torch.no_grad():
                # The exporter's defaults otherwise: do_constant_folding=True is what renames and re-lays the weights.
                torch.onnx.export(Export(model, nl), (x, am, pos, *past), str(out / "onnx" / "model.onnx"),
                                  input_names=["input_ids", "attention_mask", "position_ids", *names_past],
                                  output_names=["logits", *names_present], dynamic_axes=axes, opset_version=17,
                                  dynamo=False)
        try:
            export()
        except Exception as e:  # noqa: BLE001 - an attention this transformers cannot trace: the eager one then
            if attn == "eager":
                raise
            print(f"{name}: {attn} attention did not export ({type(e).__name__}: {e}); eager instead", flush=True)
            attn = "eager"
            model.config._attn_implementation = attn
            export()
        conf = model.config.to_dict()
        conf.update({"architectures": [cls.__name__], "model_type": model_type, "torch_dtype": "float32", "head_dim": hd,
                     "ragguard_note": "random weights (a converter fixture); norms drawn around 1, final norm 8"})
        for k in ("attn_implementation", "_attn_implementation_autoset"):
            conf.pop(k, None)
        (out / "config.json").write_text(json.dumps(conf, indent=2, default=str))
        (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(SHIPPED / f, out / f)

        gen = torch.Generator().manual_seed(args.seed)
        cases = []
        model.generation_config.eos_token_id = None  # the whole continuation; the test stops where EOS comes
        for length in (7, 12, 20):
            ids = [1] + torch.randint(3, 4096, (length - 1,), generator=gen).tolist()
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0, -1].tolist()
                g = model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, pad_token_id=0)
            cases.append({"prompt_ids": ids, "greedy_ids": g[0, len(ids):].tolist(), "last_logits": logits})
        import transformers
        (out / "reference.json").write_text(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                                                        "attention": attn, "eos_token_id": 2, "cases": cases}))
        size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        print(f"{name}: {size / 1e6:.1f} MB in {out}", flush=True)


if __name__ == "__main__":
    main()
