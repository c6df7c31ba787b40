"""The peer of bench/gpu-encoders.ts on the same GPU: the same weights (written by the bench from the ONNX
graph as a Hugging Face checkpoint), the same texts and the same token ids, in float16 on torch.

Embedder: sentence-transformers (Transformer -> Pooling -> Normalize, `encode` from the texts), or, where
sentence-transformers is not installed, transformers' AutoModel with the same masked pooling and
normalization (the JSON's `embedder_peer` says which). From ids: the underlying BertModel over the same
length-sorted batches, padded as they are, pooled and normalized the same way.
Reranker: BERT with the test reranker's pair head (scale x cos(segment means) + classifier over the pooler),
or BertForSequenceClassification where the checkpoint has no `scale`: sentence-transformers' CrossEncoder
runs only the latter, so the pair scorer runs as transformers' BertModel plus that head in torch.

  python3 scripts/gpu/st_encoders.py SPEC.json      (the bench writes SPEC.json; the last line is JSON)
"""
import json
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import AutoTokenizer, BertForSequenceClassification, BertModel

spec = json.load(open(sys.argv[1]))
dev = torch.device("cuda")
reps = int(spec["reps"])


def best(run):
    run()  # warm-up
    torch.cuda.synchronize()
    ms = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        ms = min(ms, (time.perf_counter() - t0) * 1000)
    return ms


def pool(h, mask, mode):
    m = mask.unsqueeze(-1).to(h.dtype)
    if mode == "cls":
        e = h[:, 0]
    elif mode == "max":
        e = h.masked_fill(m == 0, float("-inf")).max(1).values
    elif mode == "lasttoken":
        e = h[torch.arange(h.shape[0], device=h.device), mask.sum(1) - 1]
    else:
        s = (h * m).sum(1)
        n = m.sum(1)
        e = s / n.clamp(min=1e-9) if mode == "mean" else s / n.sqrt()
    return F.normalize(e.float(), dim=-1)


def padded(rows, types=None):
    w = max(len(r) for r in rows)
    ids = np.zeros((len(rows), w), dtype=np.int64)
    mask = np.zeros((len(rows), w), dtype=np.int64)
    tt = np.zeros((len(rows), w), dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        mask[i, : len(r)] = 1
        if types is not None:
            tt[i, : len(r)] = types[i]
    return tuple(torch.from_numpy(a).to(dev, non_blocking=True) for a in (ids, mask, tt))


out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "dtype": "float16"}

# --- embedder
texts, ids, mode = spec["texts"], spec["ids"], spec["pooling"]
try:
    import sentence_transformers
    from sentence_transformers import SentenceTransformer, models as stm

    tr = stm.Transformer(spec["embedder_dir"], max_seq_length=spec["embed_max_tokens"])
    st_mode = "mean_sqrt_len_tokens" if mode == "mean_sqrt_len" else mode
    st = SentenceTransformer(modules=[tr, stm.Pooling(tr.get_word_embedding_dimension(), pooling_mode=st_mode), stm.Normalize()], device="cuda")
    st.half()
    bert = st[0].auto_model
    out["embedder_peer"] = f"sentence-transformers {sentence_transformers.__version__}"
except Exception as e:  # not installed, or it cannot load the checkpoint: plain transformers, said so
    st = None
    out["embedder_peer_note"] = f"sentence-transformers did not run: {e!r}"[:300]

if st is not None:

    def encode_texts(batch):
        return st.encode(texts, batch_size=batch, convert_to_numpy=True)

    def first_embeddings(n):
        return st.encode(texts[:n], batch_size=n, convert_to_numpy=True).tolist()
else:
    bert = BertModel.from_pretrained(spec["embedder_dir"], add_pooling_layer=False).half().to(dev).eval()
    tok = AutoTokenizer.from_pretrained(spec["embedder_dir"])
    out["embedder_peer"] = "transformers (sentence-transformers did not run): AutoModel + the same pooling"

    @torch.inference_mode()
    def encode_list(batch_texts, batch):
        order = sorted(range(len(batch_texts)), key=lambda i: len(batch_texts[i]))
        res = [None] * len(batch_texts)
        for s in range(0, len(order), batch):
            idx = order[s : s + batch]
            enc = tok([batch_texts[i] for i in idx], padding=True, truncation=True, max_length=spec["embed_max_tokens"], return_tensors="pt").to(dev)
            e = pool(bert(**enc).last_hidden_state, enc["attention_mask"], mode).cpu()
            for k, i in enumerate(idx):
                res[i] = e[k]
        return torch.stack(res).numpy()

    def encode_texts(batch):
        return encode_list(texts, batch)

    def first_embeddings(n):
        return encode_list(texts[:n], n).tolist()

bert.eval()


@torch.inference_mode()
def encode_ids(batch):
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    res = [None] * len(ids)
    for s in range(0, len(order), batch):
        idx = order[s : s + batch]
        i_, m_, t_ = padded([ids[i] for i in idx])
        e = pool(bert(input_ids=i_, attention_mask=m_, token_type_ids=t_).last_hidden_state, m_, mode).cpu()
        for k, i in enumerate(idx):
            res[i] = e[k]
    return res


out["embed"] = []
for b in spec["batches"]:
    text_ms = best(lambda: encode_texts(b))
    ids_ms = best(lambda: encode_ids(b))
    out["embed"].append({"batch": b, "chunks_per_s_text": round(len(texts) / (text_ms / 1000)), "chunks_per_s_ids": round(len(texts) / (ids_ms / 1000))})
out["first_embeddings"] = first_embeddings(spec["agree"])
del bert
torch.cuda.empty_cache()

# --- reranker
rdir = spec["reranker_dir"]
state = load_file(f"{rdir}/model.safetensors")
rtok = AutoTokenizer.from_pretrained(rdir)
if "scale" in state:
    out["reranker_peer"] = "transformers BertModel + the pair scorer's head in torch (sentence-transformers' CrossEncoder cannot load this head)"
    rbert = BertModel.from_pretrained(rdir, add_pooling_layer=True).half().to(dev).eval()
    cls_w = state["classifier.weight"].to(dev, torch.float16)
    cls_b = state["classifier.bias"].to(dev, torch.float16)
    scale = state["scale"].to(dev, torch.float16)

    def scorer(input_ids, attention_mask, token_type_ids):
        o = rbert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        h = o.last_hidden_state
        m = attention_mask.to(h.dtype)
        b = token_type_ids.to(h.dtype) * m
        a = m - b

        def seg(w):
            return F.normalize((h * w[..., None]).sum(1) / w.sum(1, keepdim=True).clamp(min=1.0), dim=-1)

        cos = (seg(a) * seg(b)).sum(-1, keepdim=True)
        return (scale * cos + F.linear(o.pooler_output, cls_w, cls_b))[:, 0].float()
else:
    out["reranker_peer"] = "transformers BertForSequenceClassification (what sentence-transformers' CrossEncoder runs)"
    rmodel = BertForSequenceClassification.from_pretrained(rdir).half().to(dev).eval()

    def scorer(input_ids, attention_mask, token_type_ids):
        return rmodel(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits[:, 0].float()


pairs, pair_ids, pair_types = spec["pairs"], spec["pair_ids"], spec["pair_types"]


@torch.inference_mode()
def rerank_texts(batch, n=None):
    res = []
    ps = pairs if n is None else pairs[:n]
    for s in range(0, len(ps), batch):
        chunk = ps[s : s + batch]
        enc = rtok([q for q, _ in chunk], [p for _, p in chunk], padding=True, truncation=True, max_length=spec["rerank_max_tokens"], return_tensors="pt").to(dev)
        res.append(scorer(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]).cpu())
    return torch.cat(res)


@torch.inference_mode()
def rerank_ids(batch):
    res = []
    for s in range(0, len(pair_ids), batch):
        i_, m_, t_ = padded(pair_ids[s : s + batch], pair_types[s : s + batch])
        res.append(scorer(i_, m_, t_).cpu())
    return torch.cat(res)


out["rerank"] = []
for b in spec["rerank_batches"]:
    text_ms = best(lambda: rerank_texts(b))
    ids_ms = best(lambda: rerank_ids(b))
    out["rerank"].append({"batch": b, "pairs_per_s_text": round(len(pairs) / (text_ms / 1000)), "pairs_per_s_encoded": round(len(pairs) / (ids_ms / 1000))})
with torch.inference_mode():
    n = spec["agree"]
    out["first_scores"] = scorer(*padded(pair_ids[:n], pair_types[:n])).cpu().tolist()
print(json.dumps(out))
