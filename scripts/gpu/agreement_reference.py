#!/usr/bin/env python3
"""The float32 reference of the agreement check (scripts/check-agreement.ts), on the GPU host:

    python3 scripts/gpu/agreement_reference.py CHECKPOINT_DIR OUT_DIR

A bfloat16 (or float16) checkpoint's weights upcast exactly to float32 and run by transformers in float32:
the function every lower-precision path approximates (the bfloat16 path, the GGUF files made from the same
checkpoint, llama.cpp's and ours). Sequences: SEQS random prompts, each followed by the float32 model's own
greedy continuation of NEW tokens, so that the positions compared are the ones a generation visits. OUT_DIR gets

  sequences.txt          one line a sequence: the first position compared, then the token ids (llama_logits.cpp)
  agreement.json         {vocab, sequences: [{first, ids}], rows}
  logits-float32.f32     the float32 model's logits at every compared position (rows x vocab, float32)
  logits-torch-bf16.f32  the same from transformers in the checkpoint's own dtype (how far torch's own
                         low-precision run is from float32: a row of the table, not the reference)
"""
import json
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM

SEQS = [16, 24, 40, 64]
NEW = 32


@torch.no_grad()
def logits_at(model, seqs):
    rows = []
    for s in seqs:
        x = torch.tensor([s["ids"]], device="cuda")
        rows.append(model(x).logits[0, s["first"]:].float().cpu())
    return torch.cat(rows)


def main():
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    if (out / "logits-torch-bf16.f32").exists():
        print(json.dumps({"reference": str(out), "exists": True}))
        return
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    kw = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(src, **{kw: torch.float32}).to("cuda").eval()
    model.generation_config.eos_token_id = None
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(11)
    seqs = []
    for n in SEQS:
        prompt = torch.randint(3, vocab, (n,), generator=g).tolist()
        with torch.no_grad():
            gen = model.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=NEW, min_new_tokens=NEW,
                                 do_sample=False, pad_token_id=0)
        seqs.append({"first": n - 1, "ids": gen[0].tolist()})
    ref = logits_at(model, seqs)
    ref.numpy().astype("float32").tofile(out / "logits-float32.f32")
    dtype = json.loads((src / "config.json").read_text()).get("torch_dtype") or json.loads((src / "config.json").read_text()).get("dtype")
    low = torch.float16 if dtype == "float16" else torch.bfloat16
    del model
    torch.cuda.empty_cache()
    model = AutoModelForCausalLM.from_pretrained(src, **{kw: low}).to("cuda").eval()
    logits_at(model, seqs).numpy().astype("float32").tofile(out / "logits-torch-bf16.f32")
    (out / "sequences.txt").write_text("".join(f"{s['first']} {' '.join(map(str, s['ids']))}\n" for s in seqs))
    (out / "agreement.json").write_text(json.dumps({"vocab": vocab, "low_dtype": str(low), "rows": int(ref.shape[0]), "sequences": seqs}))
    print(json.dumps({"reference": str(out), "rows": int(ref.shape[0]), "vocab": vocab, "seconds": round(time.time() - t0)}))


if __name__ == "__main__":
    main()
