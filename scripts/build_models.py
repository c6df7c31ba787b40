#!/usr/bin/env python3
"""Builds ragguard's three embedded default models from the shipped corpus, reproducibly.

No weights can be downloaded, so the defaults are trained here, small, on data/corpus:
  embedder  BERT encoder (mean pooling + L2 norm), contrastive (InfoNCE) on pseudo-queries
  reranker  BERT cross-encoder (one logit), listwise on embedder hard negatives
  decoder   Llama-style (RoPE, GQA, RMSNorm, SwiGLU), language modelling plus a grounded-answer task:
            given numbered context chunks and a question, copy the sentence that answers it

Output is the Hugging Face / Optimum export layout, so a real export drops in by changing a path:
  <out>/<model>/config.json, tokenizer.json, tokenizer_config.json, onnx/model.onnx
plus <out>/testvectors.json: reference outputs computed here in torch (fp32 arithmetic on the
fp16-rounded weights that the ONNX files store) that the Node/ONNX Runtime path must reproduce.

The modules below are written out (rather than taken from transformers) so that their export is
fully under our control; their parameter names are those of transformers' BertModel,
BertForSequenceClassification and LlamaForCausalLM, and the script cross-checks its logits against
those classes when transformers is importable.

Runs on the GPU host (torch, tokenizers, onnx, onnxruntime are there):
  python3 scripts/build_models.py --out /tmp/models [--smoke]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from kv_export import decoder_io  # scripts/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parent.parent
T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


# ----------------------------------------------------------------------------------------------
# corpus
# ----------------------------------------------------------------------------------------------

def load_corpus(corpus_dir: Path):
    docs = []
    for p in sorted(corpus_dir.glob("*.txt")):
        text = p.read_text(encoding="utf-8")
        lines = text.split("\n", 1)
        title = lines[0].strip()
        body = lines[1] if len(lines) > 1 else ""
        docs.append({"doc_id": p.stem, "title": title, "body": body})
    return docs


def chunk_tokens(body: str, count, size: int, overlap: int):
    """The server's chunker (src/retrieval/chunker.ts): windows of whole words holding at most `size`
    embedder tokens, each repeating at least `overlap` tokens of the previous one."""
    words = [(m.start(), m.end(), count(m.group())) for m in re.finditer(r"\S+", body)]
    out, first = [], 0
    while first < len(words):
        last, tokens = first, words[first][2]
        while last + 1 < len(words) and tokens + words[last + 1][2] <= size:
            last += 1
            tokens += words[last][2]
        out.append(body[words[first][0]:words[last][1]])
        if last + 1 >= len(words):
            break
        nxt, back = last + 1, 0
        while nxt - 1 > first and back < overlap:
            nxt -= 1
            back += words[nxt][2]
        first = nxt
    return out


SENT_RE = re.compile(r"(?<=[.!?])\s+")


def sentences(text: str):
    return [s.strip() for s in SENT_RE.split(text) if len(s.split()) >= 6]


TEMPLATES = ["how do i", "how can i", "what is", "what does", "which", "how to", "why does", "when",
             "where is", "can i", "what are", "how does", "is there a way to", "what happens if",
             "which option", "which command", "how do you"]
PUNCT_RE = re.compile(r"[^\w\s\-./]")


def pseudo_query(sentence: str, title: str, rng: random.Random) -> str:
    words = PUNCT_RE.sub(" ", sentence.lower()).split()
    if not words:
        words = sentence.lower().split()
    n = len(words)
    length = rng.randint(min(3, n), min(10, n))
    start = rng.randint(0, n - length)
    span = words[start:start + length]
    kept = [w for w in span if rng.random() > 0.15] or span[:2]
    q = " ".join(kept)
    if rng.random() < 0.3:
        tw = PUNCT_RE.sub(" ", title.lower()).split()
        if tw:
            q = q + " " + " ".join(tw[: rng.randint(1, min(3, len(tw)))])
    if rng.random() < 0.6:
        q = rng.choice(TEMPLATES) + " " + q
    if rng.random() < 0.5:
        q += "?"
    return q


# ----------------------------------------------------------------------------------------------
# tokenizers
# ----------------------------------------------------------------------------------------------

def train_wordpiece(texts, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, clean_text=True, handle_chinese_chars=True,
                                                strip_accents=None)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials, min_frequency=2)
    tok.train_from_iterator(texts, trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def train_bytelevel_bpe(texts, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2)
    tok.train_from_iterator(texts, trainer)
    return tok


# ----------------------------------------------------------------------------------------------
# BERT (names as transformers' BertModel)
# ----------------------------------------------------------------------------------------------

class BertEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c["vocab_size"], c["hidden_size"], padding_idx=c["pad_token_id"])
        self.position_embeddings = nn.Embedding(c["max_position_embeddings"], c["hidden_size"])
        self.token_type_embeddings = nn.Embedding(c["type_vocab_size"], c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])

    def forward(self, input_ids, token_type_ids):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos) + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x)


class BertSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.n = c["num_attention_heads"]
        self.d = h // self.n
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)

    def forward(self, x, bias):
        b, s, _ = x.shape
        q = self.query(x).view(b, s, self.n, self.d).transpose(1, 2)
        k = self.key(x).view(b, s, self.n, self.d).transpose(1, 2)
        v = self.value(x).view(b, s, self.n, self.d).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d) + bias
        att = torch.softmax(att, dim=-1)
        return torch.matmul(att, v).transpose(1, 2).reshape(b, s, self.n * self.d)


class DenseNorm(nn.Module):
    def __init__(self, i, o, eps):
        super().__init__()
        self.dense = nn.Linear(i, o)
        self.LayerNorm = nn.LayerNorm(o, eps=eps)

    def forward(self, x, residual):
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self = BertSelfAttention(c)
        self.output = DenseNorm(c["hidden_size"], c["hidden_size"], c["layer_norm_eps"])

    def forward(self, x, bias):
        return self.output(self.self(x, bias), x)


class BertIntermediate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["intermediate_size"])

    def forward(self, x):
        return F.gelu(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = BertAttention(c)
        self.intermediate = BertIntermediate(c)
        self.output = DenseNorm(c["intermediate_size"], c["hidden_size"], c["layer_norm_eps"])

    def forward(self, x, bias):
        a = self.attention(x, bias)
        return self.output(self.intermediate(a), a)


class BertEncoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(c) for _ in range(c["num_hidden_layers"])])

    def forward(self, x, bias):
        for layer in self.layer:
            x = layer(x, bias)
        return x


class BertPooler(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["hidden_size"])

    def forward(self, x):
        return torch.tanh(self.dense(x[:, 0]))


class BertModel(nn.Module):
    def __init__(self, c, pooler=False):
        super().__init__()
        self.embeddings = BertEmbeddings(c)
        self.encoder = BertEncoder(c)
        if pooler:
            self.pooler = BertPooler(c)

    def forward(self, input_ids, attention_mask, token_type_ids):
        bias = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * torch.finfo(torch.float32).min
        return self.encoder(self.embeddings(input_ids, token_type_ids), bias)


class BertForSequenceClassification(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bert = BertModel(c, pooler=True)
        self.classifier = nn.Linear(c["hidden_size"], 1)

    def forward(self, input_ids, attention_mask, token_type_ids):
        h = self.bert(input_ids, attention_mask, token_type_ids)
        return self.classifier(self.bert.pooler(h))


class PairScorer(nn.Module):
    """A cross-encoder with the bge-reranker contract (pair in, one logit out) whose score starts
    from the bi-encoder's: scale * cos(mean of segment A, mean of segment B) plus a classifier on
    the pooled [CLS] token that starts at zero. Both segments are encoded jointly, so attention
    across them can refine the score; but unlike a plain [CLS] head it does not have to discover
    token matching from nothing, which a from-scratch 2-layer CLS cross-encoder failed to do
    within this script's budget (its listwise loss stayed at ln 8 with learning rates 5e-4 to 2e-3, random or
    embedder initialisation, an easy-negatives curriculum, or distillation from the bi-encoder)."""

    def __init__(self, c):
        super().__init__()
        self.bert = BertModel(c, pooler=True)
        self.classifier = nn.Linear(c["hidden_size"], 1)
        nn.init.zeros_(self.classifier.weight)
        nn.init.zeros_(self.classifier.bias)
        self.scale = nn.Parameter(torch.tensor(20.0))

    def forward(self, input_ids, attention_mask, token_type_ids):
        h = self.bert(input_ids, attention_mask, token_type_ids)
        m = attention_mask.to(h.dtype)
        b = token_type_ids.to(h.dtype) * m
        a = m - b

        def seg_mean(w):
            return F.normalize((h * w[..., None]).sum(1) / w.sum(1, keepdim=True).clamp(min=1.0), dim=-1)

        cos = (seg_mean(a) * seg_mean(b)).sum(-1, keepdim=True)
        return self.scale * cos + self.classifier(self.bert.pooler(h))


def mean_pool(h, mask):
    m = mask.unsqueeze(-1).to(h.dtype)
    e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return F.normalize(e, dim=-1)


class EmbedderExport(nn.Module):
    """Optimum's feature-extraction export: last_hidden_state; pooling happens in the server."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.m(input_ids, attention_mask, token_type_ids)


# ----------------------------------------------------------------------------------------------
# Llama (names as transformers' LlamaForCausalLM)
# ----------------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, h, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.n, self.kv, self.d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.q_proj = nn.Linear(h, self.n * self.d, bias=False)
        self.k_proj = nn.Linear(h, self.kv * self.d, bias=False)
        self.v_proj = nn.Linear(h, self.kv * self.d, bias=False)
        self.o_proj = nn.Linear(self.n * self.d, h, bias=False)

    def forward(self, x, cos, sin, past_k=None, past_v=None, bias=None):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.n, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv, self.d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if past_k is not None:
            k = torch.cat([past_k, k], dim=2)
            v = torch.cat([past_v, v], dim=2)
        present = (k, v)
        g = self.n // self.kv
        if bias is None:  # training: causal, no padding inside a sequence
            kk = k.repeat_interleave(g, dim=1)
            vv = v.repeat_interleave(g, dim=1)
            o = F.scaled_dot_product_attention(q, kk, vv, is_causal=True)
        else:
            t = k.shape[2]
            kk = k[:, :, None].expand(b, self.kv, g, t, self.d).reshape(b, self.n, t, self.d)
            vv = v[:, :, None].expand(b, self.kv, g, t, self.d).reshape(b, self.n, t, self.d)
            att = torch.matmul(q, kk.transpose(-1, -2)) / math.sqrt(self.d) + bias
            o = torch.matmul(torch.softmax(att, dim=-1), vv)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, self.n * self.d)), present


class LlamaMLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = LlamaAttention(c)
        self.mlp = LlamaMLP(c)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, cos, sin, past_k=None, past_v=None, bias=None):
        a, present = self.self_attn(self.input_layernorm(x), cos, sin, past_k, past_v, bias)
        x = x + a
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, present


class LlamaModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([LlamaDecoderLayer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class LlamaForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = LlamaModel(c)
        d = c["head_dim"]
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        self.register_buffer("inv_freq", inv, persistent=False)

    def rope(self, position_ids):
        freqs = position_ids[..., None].to(torch.float32) * self.inv_freq[None, None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos()[:, None], emb.sin()[:, None]

    def logits(self, h):
        return F.linear(self.model.norm(h), self.model.embed_tokens.weight)  # tied

    def forward_train(self, input_ids):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand_as(input_ids)
        cos, sin = self.rope(pos)
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x, _ = layer(x, cos, sin)
        return self.logits(x)

    def forward_cached(self, input_ids, attention_mask, position_ids, past):
        """past: flat [k0, v0, k1, v1, ...], each [b, kv_heads, past_len, head_dim]."""
        b, s = input_ids.shape
        t = past[0].shape[2] + s
        q_pos = torch.arange(s, device=input_ids.device) + (t - s)
        k_pos = torch.arange(t, device=input_ids.device)
        allowed = (k_pos[None, :] <= q_pos[:, None])[None, None] & (attention_mask[:, None, None, :] > 0)
        bias = torch.where(allowed, torch.zeros((), dtype=torch.float32),
                           torch.full((), torch.finfo(torch.float32).min, dtype=torch.float32))
        cos, sin = self.rope(position_ids)
        x = self.model.embed_tokens(input_ids)
        presents = []
        for i, layer in enumerate(self.model.layers):
            x, (k, v) = layer(x, cos, sin, past[2 * i], past[2 * i + 1], bias)
            presents += [k, v]
        return (self.logits(x), *presents)


class DecoderExport(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask, position_ids, *past):
        return self.m.forward_cached(input_ids, attention_mask, position_ids, list(past))


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------

def optimize(name, step, total, loss, opt, sched, clip=None):
    """One training step: backward, optional gradient clipping of `clip`'s parameters, optimiser and
    schedule steps; logs the loss every 200 steps and at the last."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(clip.parameters(), 1.0)
    opt.step()
    sched.step()
    if step % 200 == 0 or step == total - 1:
        log(f"{name} step {step} loss {loss.item():.4f}")


def round_fp16_(model: nn.Module):
    """The ONNX files store fp16 weights (size budget); make torch's reference use the same values."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())


def fp16_initializers(path: Path, min_elems: int = 256):
    """Stores large float initializers as fp16 followed by a Cast back to float: half the file size,
    fp32 arithmetic at run time (ORT folds the Casts when the session loads)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    m = onnx.load(str(path))
    g = m.graph
    casts, keep, new = [], [], []
    for init in g.initializer:
        n = int(np.prod(init.dims)) if len(init.dims) else 1
        if init.data_type == TensorProto.FLOAT and n >= min_elems:
            arr = numpy_helper.to_array(init).astype(np.float16)
            new.append(numpy_helper.from_array(arr, init.name + "_fp16"))
            casts.append(helper.make_node("Cast", [init.name + "_fp16"], [init.name], to=TensorProto.FLOAT,
                                          name=init.name + "_cast"))
        else:
            keep.append(init)
    del g.initializer[:]
    g.initializer.extend(keep + new)
    nodes = casts + list(g.node)
    del g.node[:]
    g.node.extend(nodes)
    onnx.checker.check_model(m)
    onnx.save(m, str(path))


def load_state_from_onnx(module: nn.Module, path: Path, prefix: str):
    """Weights of a model this script exported earlier (names are the module's, '_fp16' aside)."""
    import onnx
    from onnx import numpy_helper
    sd = {}
    for init in onnx.load(str(path)).graph.initializer:
        name = init.name[:-5] if init.name.endswith("_fp16") else init.name
        if name.startswith(prefix):
            sd[name[len(prefix):]] = torch.from_numpy(numpy_helper.to_array(init).astype(np.float32))
    missing, _ = module.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.endswith("inv_freq")]
    if missing:
        raise RuntimeError(f"{path} lacks {missing[:5]}")


def param_count(m):
    return sum(p.numel() for p in m.parameters())


def pad_batch(seqs, pad_id, max_len=None):
    L = max(len(s) for s in seqs)
    if max_len:
        L = min(L, max_len)
    ids = np.full((len(seqs), L), pad_id, dtype=np.int64)
    mask = np.zeros((len(seqs), L), dtype=np.int64)
    for i, s in enumerate(seqs):
        s = s[:L]
        ids[i, :len(s)] = s
        mask[i, :len(s)] = 1
    return ids, mask


def write_json(path: Path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")


# ----------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpus", default=str(ROOT / "data" / "corpus"))
    ap.add_argument("--questions", default=str(ROOT / "data" / "questions.json"))
    ap.add_argument("--smoke", action="store_true", help="a few steps of everything, to check the pipeline")
    ap.add_argument("--embed-steps", type=int, default=4000)
    ap.add_argument("--rerank-steps", type=int, default=2000)
    ap.add_argument("--decoder-steps", type=int, default=6000)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--reuse", default="", help="comma list of embedder,decoder to load from --reuse-from instead of training")
    ap.add_argument("--reuse-from", default=str(ROOT / "models"))
    ap.add_argument("--rerank-lr", type=float, default=1e-3)
    ap.add_argument("--rerank-head", choices=["pair", "cls"], default="pair",
                    help="pair: PairScorer (default); cls: BertForSequenceClassification")
    args = ap.parse_args()
    reuse = {x for x in args.reuse.split(",") if x}
    reuse_dir = Path(args.reuse_from)
    if args.smoke:
        args.embed_steps, args.rerank_steps, args.decoder_steps = 20, 20, 20

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    log("device", dev, torch.__version__, torch.cuda.get_device_name(0) if dev.type == "cuda" else "")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"seed": args.seed, "smoke": args.smoke, "device": str(dev)}

    docs = load_corpus(Path(args.corpus))
    questions = json.loads(Path(args.questions).read_text())
    log(f"corpus: {len(docs)} docs, {sum(len(d['body']) for d in docs)} chars; {len(questions)} questions")

    rng = random.Random(args.seed)

    # ---------------- tokenizers
    all_text = [d["title"] + "\n" + d["body"] for d in docs]
    from tokenizers import Tokenizer
    wp = Tokenizer.from_file(str(reuse_dir / "embedder" / "tokenizer.json")) if "embedder" in reuse \
        else train_wordpiece(all_text, 4096)
    bpe = Tokenizer.from_file(str(reuse_dir / "decoder" / "tokenizer.json")) if "decoder" in reuse \
        else train_bytelevel_bpe(all_text, 4096)
    log("tokenizers: wordpiece", wp.get_vocab_size(), "bpe", bpe.get_vocab_size())

    # Chunks as the server makes them: 128 embedder tokens, 32 shared with the previous chunk.
    counts = {}

    def count(word):
        if word not in counts:
            counts[word] = len(wp.encode(word, add_special_tokens=False).ids)
        return counts[word]

    chunks = []  # (doc_index, text)
    for di, d in enumerate(docs):
        for c in chunk_tokens(d["body"], count, 128, 32):
            chunks.append((di, c))
    chunk_text = [f"{docs[di]['title']}\n{c}" for di, c in chunks]
    chunk_sents = [sentences(c) for _, c in chunks]
    trainable = [i for i, s in enumerate(chunk_sents) if s]
    log(f"{len(chunks)} training chunks, {len(trainable)} with sentences")
    PAD, CLS, SEP = wp.token_to_id("[PAD]"), wp.token_to_id("[CLS]"), wp.token_to_id("[SEP]")
    BOS, EOS, BPAD = bpe.token_to_id("<s>"), bpe.token_to_id("</s>"), bpe.token_to_id("<pad>")

    bert_cfg = {"vocab_size": wp.get_vocab_size(), "hidden_size": 128, "num_hidden_layers": 2,
                "num_attention_heads": 4, "intermediate_size": 512, "max_position_embeddings": 512,
                "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": PAD}

    def wp_encode(texts, max_len):
        encs = wp.encode_batch(texts)
        seqs = [e.ids[:max_len - 1] + ([SEP] if len(e.ids) > max_len else []) for e in encs]
        return pad_batch(seqs, PAD)

    def wp_encode_pairs(pairs, max_len):
        encs = wp.encode_batch(pairs)
        ids, tts = [], []
        for e in encs:
            i, t = e.ids, e.type_ids
            if len(i) > max_len:
                i, t = i[:max_len - 1] + [SEP], t[:max_len - 1] + [1]
            ids.append(i)
            tts.append(t)
        a, m = pad_batch(ids, PAD)
        tt = np.zeros_like(a)
        for r, t in enumerate(tts):
            tt[r, :len(t)] = t
        return a, m, tt

    def T(x):
        return torch.from_numpy(x).to(dev)

    doc_of_chunk = torch.tensor([di for di, _ in chunks], device=dev)

    # ---------------- embedder
    emb = BertModel(bert_cfg).to(dev)
    log("embedder params", param_count(emb))
    opt = torch.optim.AdamW(emb.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=args.embed_steps, pct_start=max(0.06, 2 / args.embed_steps))
    B = 512
    t_stage = time.time()
    if "embedder" in reuse:
        load_state_from_onnx(emb, reuse_dir / "embedder" / "onnx" / "model.onnx", "m.")
        emb.to(dev)
    for step in range(0 if "embedder" in reuse else args.embed_steps):
        idx = rng.sample(trainable, B)
        qs = [pseudo_query(rng.choice(chunk_sents[i]), docs[chunks[i][0]]["title"], rng) for i in idx]
        qi, qm = wp_encode(qs, 32)
        pi, pm = wp_encode([chunk_text[i] for i in idx], 192)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            qe = mean_pool(emb(T(qi), T(qm), torch.zeros_like(T(qi))).float(), T(qm))
            pe = mean_pool(emb(T(pi), T(pm), torch.zeros_like(T(pi))).float(), T(pm))
        sim = qe @ pe.T / 0.05
        # chunks of one document are not negatives of each other's queries
        d = doc_of_chunk[idx]
        same = (d[:, None] == d[None, :]) & ~torch.eye(B, dtype=torch.bool, device=dev)
        sim = sim.masked_fill(same, -1e4)
        lbl = torch.arange(B, device=dev)
        loss = (F.cross_entropy(sim, lbl) + F.cross_entropy(sim.T, lbl)) / 2
        optimize("embed", step, args.embed_steps, loss, opt, sched)
    report["embed_train_s"] = time.time() - t_stage
    emb.eval()
    round_fp16_(emb)

    @torch.no_grad()
    def embed_texts(texts, max_len, bs=512):
        outs = []
        for i in range(0, len(texts), bs):
            a, m = wp_encode(texts[i:i + bs], max_len)
            outs.append(mean_pool(emb(T(a), T(m), torch.zeros_like(T(a))), T(m)))
        return torch.cat(outs)

    chunk_emb = embed_texts(chunk_text, 192)
    doc_index = {d["doc_id"]: i for i, d in enumerate(docs)}
    q_texts = [q["question"] for q in questions]
    q_docs = [doc_index.get(q["doc_id"], -1) for q in questions]
    q_emb = embed_texts(q_texts, 32)
    top = (q_emb @ chunk_emb.T).topk(20, dim=1).indices
    hits5 = [int(q_docs[i] in doc_of_chunk[top[i, :5]].tolist()) for i in range(len(questions))]
    report["eval_embed_recall_at_5"] = float(np.mean(hits5))
    distinct = [list(dict.fromkeys(doc_of_chunk[top[i]].tolist()))[:5] for i in range(len(questions))]
    report["eval_embed_recall_at_5_distinct_docs"] = float(np.mean([q_docs[i] in distinct[i] for i in range(len(questions))]))
    log("embedder recall@5 over distinct documents:", report["eval_embed_recall_at_5_distinct_docs"])
    log("embedder recall@5 (chunks, training split) on questions:", report["eval_embed_recall_at_5"])

    # ---------------- reranker
    rr = (PairScorer if args.rerank_head == "pair" else BertForSequenceClassification)(bert_cfg).to(dev)
    with torch.no_grad():  # start from the embedder's encoder: it already knows the corpus
        rr.bert.load_state_dict(emb.state_dict(), strict=False)
    opt = torch.optim.AdamW(rr.parameters(), lr=args.rerank_lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.rerank_lr, total_steps=args.rerank_steps, pct_start=max(0.06, 2 / args.rerank_steps))
    G, NEG = 48, 7
    t_stage = time.time()
    for step in range(args.rerank_steps):
        idx = rng.sample(trainable, G)
        sents = [rng.choice(chunk_sents[i]) for i in idx]
        qs = [pseudo_query(s, docs[chunks[i][0]]["title"], rng) for s, i in zip(sents, idx)]
        with torch.no_grad():
            qe = embed_texts(qs, 32)
            cand = (qe @ chunk_emb.T).topk(24, dim=1).indices.tolist()
        pairs = []
        for g, i in enumerate(idx):
            negs = [c for c in cand[g] if c != i and sents[g] not in chunks[c][1]]
            rng.shuffle(negs)
            negs = negs[:NEG - 2] + rng.sample(range(len(chunks)), 2)
            while len(negs) < NEG:
                negs.append(rng.randrange(len(chunks)))
            pairs += [(qs[g], chunk_text[c]) for c in [i] + negs]
        a, m, tt = wp_encode_pairs(pairs, 256)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits = rr(T(a), T(m), T(tt)).float().view(G, NEG + 1)
        loss = F.cross_entropy(logits, torch.zeros(G, dtype=torch.long, device=dev))
        optimize("rerank", step, args.rerank_steps, loss, opt, sched)
    report["rerank_train_s"] = time.time() - t_stage
    rr.eval()
    round_fp16_(rr)
    with torch.no_grad():
        hits = []
        for i, q in enumerate(q_texts):
            cands = top[i].tolist()
            a, m, tt = wp_encode_pairs([(q, chunk_text[c]) for c in cands], 256)
            s = rr(T(a), T(m), T(tt)).view(-1)
            order = [cands[j] for j in s.argsort(descending=True).tolist()]
            hits.append(int(q_docs[i] in [chunks[c][0] for c in order[:5]]))
    report["eval_rerank_recall_at_5"] = float(np.mean(hits))
    log("embed top-20 + rerank recall@5:", report["eval_rerank_recall_at_5"])

    # ---------------- decoder
    dec_cfg = {"vocab_size": bpe.get_vocab_size(), "hidden_size": 256, "intermediate_size": 768,
               "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
               "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 4096}
    dec = LlamaForCausalLM(dec_cfg).to(dev)
    with torch.no_grad():
        for n, p in dec.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02)
    log("decoder params", param_count(dec))

    # The server assembles the prompt from separately encoded segments, so training does too:
    #   <s> "Context:\n" ("[i] " "title: text\n")* "\nQuestion: q\nAnswer:"  ->  " sentence" </s>
    enc = lambda s: bpe.encode(s).ids
    ctx_head = enc("Context:\n")
    markers = [enc(f"[{i}] ") for i in range(1, 17)]
    chunk_bpe = [enc(f"{docs[di]['title']}: {c}\n") for di, c in chunks]
    corpus_ids = []
    for d in docs:
        corpus_ids += [BOS] + enc(d["title"] + "\n" + d["body"]) + [EOS]
    corpus_ids = np.array(corpus_ids, dtype=np.int64)
    log("bpe corpus tokens", len(corpus_ids))
    SEQ = 768

    def rag_example(i, n_ctx, rnd, neighbours):
        sent = rnd.choice(chunk_sents[i])
        q = pseudo_query(sent, docs[chunks[i][0]]["title"], rnd)
        others = [c for c in neighbours if c != i and sent not in chunks[c][1]][: n_ctx - 1]
        tail = enc(f"\nQuestion: {q}\nAnswer:")
        ans = enc(" " + " ".join(sent.split()[:40]))[:64] + [EOS]
        budget = SEQ + 1 - 1 - len(ctx_head) - len(tail) - len(ans)
        # like the server's prompt budget: drop the lowest-ranked distractors until the prompt fits
        while others and sum(len(markers[0]) + min(200, len(chunk_bpe[c])) for c in others + [i]) > budget:
            others.pop()
        ctx = others + [i]
        rnd.shuffle(ctx)
        ids = [BOS] + ctx_head
        for k, c in enumerate(ctx):
            ids += markers[k] + chunk_bpe[c][:200]
        return ids + tail, ans

    opt = torch.optim.AdamW(dec.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=args.decoder_steps, pct_start=max(0.05, 2 / args.decoder_steps))
    BR, BL = 48, 16  # rag rows, language-model rows per step
    t_stage = time.time()
    if "decoder" in reuse:
        load_state_from_onnx(dec, reuse_dir / "decoder" / "onnx" / "model.onnx", "m.")
        dec.to(dev)
    for step in range(0 if "decoder" in reuse else args.decoder_steps):
        idx = rng.sample(trainable, BR)
        with torch.no_grad():
            qs_e = chunk_emb[idx]
            neigh = (qs_e @ chunk_emb.T).topk(8, dim=1).indices.tolist()
        rows, masks = [], []
        for g, i in enumerate(idx):
            n_ctx = rng.randint(1, 5)
            pool = neigh[g][1:] if rng.random() < 0.7 else rng.sample(range(len(chunks)), 8)
            p, a = rag_example(i, n_ctx, rng, pool)
            seq = (p + a)[-SEQ - 1:]
            lm = [0] * (len(seq) - len(a)) + [1] * len(a)
            rows.append(seq)
            masks.append(lm[-len(seq):])
        for _ in range(BL):
            s = rng.randrange(0, len(corpus_ids) - SEQ - 1)
            rows.append(corpus_ids[s:s + SEQ + 1].tolist())
            masks.append([1] * (SEQ + 1))
        L = max(len(r) for r in rows)
        ids = np.full((len(rows), L), BPAD, dtype=np.int64)
        lw = np.zeros((len(rows), L), dtype=np.float32)
        for r, (s, m) in enumerate(zip(rows, masks)):
            ids[r, :len(s)] = s
            lw[r, :len(m)] = m
        x, w = T(ids), T(lw)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits = dec.forward_train(x[:, :-1]).float()
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="none")
        ww = w[:, 1:].reshape(-1)
        rag_w = ww.view(len(rows), -1)[:BR].sum()
        loss = (ce * ww).view(len(rows), -1)[:BR].sum() / rag_w.clamp(min=1) \
            + 0.5 * (ce * ww).view(len(rows), -1)[BR:].sum() / ww.view(len(rows), -1)[BR:].sum().clamp(min=1)
        optimize("decoder", step, args.decoder_steps, loss, opt, sched, clip=dec)
    report["decoder_train_s"] = time.time() - t_stage
    dec.eval()
    round_fp16_(dec)

    # ---------------- reference outputs (fp32 torch on fp16-rounded weights)
    @torch.no_grad()
    def greedy(prompt_ids, n_new):
        ids = list(prompt_ids)
        out = []
        margins = []
        for _ in range(n_new):
            x = torch.tensor([ids], device=dev)
            past = [torch.zeros(1, dec_cfg["num_key_value_heads"], 0, dec_cfg["head_dim"], device=dev)
                    for _ in range(2 * dec_cfg["num_hidden_layers"])]
            logits = dec.forward_cached(x, torch.ones_like(x), torch.arange(len(ids), device=dev)[None], past)[0]
            last = logits[0, -1]
            nxt = int(last.argmax())
            top2 = last.topk(2).values
            margins.append(float(top2[0] - top2[1]))
            out.append(nxt)
            ids.append(nxt)
            if nxt == EOS:
                break
        greedy.min_margin = min(margins)
        return out

    rnd = random.Random(7)
    vectors = {"embedder": [], "reranker": [], "decoder": [], "tokenizers": {}}
    emb_texts = [q["question"] for q in questions[:4]] + [chunk_text[0][:300], "Hello, World! naïve café 123"]
    with torch.no_grad():
        for t in emb_texts:
            a, m = wp_encode([t], 512)
            e = mean_pool(emb(T(a), T(m), torch.zeros_like(T(a))), T(m))[0]
            vectors["embedder"].append({"text": t, "input_ids": a[0].tolist(), "embedding": e.tolist()})
        for i in range(3):
            q = questions[i]["question"]
            c = chunk_text[top[i, 0].item()]
            a, m, tt = wp_encode_pairs([(q, c)], 512)
            s = rr(T(a), T(m), T(tt)).view(-1)[0].item()
            vectors["reranker"].append({"query": q, "passage": c, "input_ids": a[0].tolist(),
                                        "token_type_ids": tt[0].tolist(), "logit": s})
    answers = []
    for i in range(min(24, len(questions))):
        q = questions[i]
        ctx = top[i, :3].tolist()
        ids = [BOS] + ctx_head
        for k, c in enumerate(ctx):
            ids += markers[k] + chunk_bpe[c][:200]
        ids += enc(f"\nQuestion: {q['question']}\nAnswer:")
        gen = greedy(ids, 40)
        text = bpe.decode([t for t in gen if t != EOS])
        answers.append({"question": q["question"], "answer": text})
        if i < 4:
            vectors["decoder"].append({"prompt_ids": ids, "greedy_ids": gen, "text": text,
                                       "min_top2_logit_margin": greedy.min_margin})
    report["sample_answers"] = answers[:12]
    for a in answers[:8]:
        log("Q:", a["question"], "\n    A:", a["answer"])
    vectors["decoder_eos_token_id"] = EOS
    samples = ["How do I sort a file numerically?", "naïve café: tabs\tand  spaces\nnew line", "[1] x: y\n"]
    vectors["tokenizers"] = {
        "embedder": [{"text": s, "ids": wp.encode(s).ids} for s in samples],
        "embedder_pairs": [{"a": s, "b": samples[0], "ids": wp.encode(s, samples[0]).ids,
                            "type_ids": wp.encode(s, samples[0]).type_ids} for s in samples[1:]],
        "decoder": [{"text": s, "ids": bpe.encode(s).ids, "decoded": bpe.decode(bpe.encode(s).ids)} for s in samples],
    }

    # ---------------- cross-check against transformers' own classes (names and maths)
    try:
        import transformers
        from transformers import BertConfig, LlamaConfig
        hf = transformers.LlamaForCausalLM(LlamaConfig(**{k: v for k, v in dec_cfg.items()},
                                                       tie_word_embeddings=True, attn_implementation="eager"))
        missing = hf.load_state_dict({k: v.cpu() for k, v in dec.state_dict().items()}, strict=False)
        hf.eval()
        x = torch.tensor([vectors["decoder"][0]["prompt_ids"]])
        with torch.no_grad():
            ref = hf(input_ids=x).logits
            ours = dec.cpu().forward_train(x)
        dec.to(dev)
        report["hf_llama_max_abs_diff"] = float((ref - ours).abs().max())
        report["hf_llama_missing"] = [k for k in missing.missing_keys if "lm_head" not in k]
        hb = transformers.BertModel(BertConfig(**bert_cfg, attn_implementation="eager"), add_pooling_layer=False)
        hb.load_state_dict({k: v.cpu() for k, v in emb.state_dict().items()}, strict=True)
        hb.eval()
        a, m = wp_encode(emb_texts[:2], 64)
        with torch.no_grad():
            r = hb(input_ids=torch.from_numpy(a), attention_mask=torch.from_numpy(m)).last_hidden_state
            o = emb.cpu()(torch.from_numpy(a), torch.from_numpy(m), torch.zeros_like(torch.from_numpy(a)))
        emb.to(dev)
        report["hf_bert_max_abs_diff"] = float(((r - o) * torch.from_numpy(m)[..., None]).abs().max())
        log("cross-check vs transformers:", report["hf_llama_max_abs_diff"], report["hf_bert_max_abs_diff"])
    except Exception as e:  # informative only
        report["hf_crosscheck_error"] = repr(e)
        log("cross-check vs transformers failed:", repr(e))
        emb.to(dev)
        dec.to(dev)

    # ---------------- export
    emb.cpu()
    rr.cpu()
    dec.cpu()
    for name, tok in (("embedder", wp), ("reranker", wp), ("decoder", bpe)):
        (out / name / "onnx").mkdir(parents=True, exist_ok=True)
        tok.save(str(out / name / "tokenizer.json"))
    bert_json = {**bert_cfg, "hidden_act": "gelu", "attention_probs_dropout_prob": 0.0, "hidden_dropout_prob": 0.0,
                 "initializer_range": 0.02, "position_embedding_type": "absolute", "torch_dtype": "float16",
                 "model_type": "bert"}
    write_json(out / "embedder" / "config.json", {"architectures": ["BertModel"], **bert_json})
    write_json(out / "embedder" / "1_Pooling" / "config.json",
               {"word_embedding_dimension": bert_cfg["hidden_size"], "pooling_mode_cls_token": False,
                "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False})
    rr_arch = "RagguardPairScorer" if args.rerank_head == "pair" else "BertForSequenceClassification"
    write_json(out / "reranker" / "config.json", {"architectures": [rr_arch], **bert_json,
                                                   "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}})
    bert_tok_cfg = {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 512,
                    "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]",
                    "mask_token": "[MASK]"}
    write_json(out / "embedder" / "tokenizer_config.json", bert_tok_cfg)
    write_json(out / "reranker" / "tokenizer_config.json", bert_tok_cfg)
    write_json(out / "decoder" / "config.json", {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", **dec_cfg, "hidden_act": "silu",
        "tie_word_embeddings": True, "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": BPAD,
        "attention_bias": False, "mlp_bias": False, "torch_dtype": "float16", "use_cache": True})
    write_json(out / "decoder" / "generation_config.json", {"bos_token_id": BOS, "eos_token_id": EOS,
                                                             "pad_token_id": BPAD, "do_sample": False})
    write_json(out / "decoder" / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
        "model_max_length": 4096, "add_bos_token": True, "ragguard_prompt": {
            "head": "Context:\n", "marker": "[{i}] ", "body": "{title}: {text}\n",
            "tail": "\nQuestion: {question}\nAnswer:", "body_max_tokens": 200}})

    def export(model, args_, names_in, names_out, axes, path):
        torch.onnx.export(model, args_, str(path), input_names=names_in, output_names=names_out,
                          dynamic_axes=axes, opset_version=17, dynamo=False, do_constant_folding=False)
        fp16_initializers(path)
        log("exported", path, os.path.getsize(path), "bytes")

    a, m = wp_encode(emb_texts[:2], 64)
    ex = (torch.from_numpy(a), torch.from_numpy(m), torch.zeros_like(torch.from_numpy(a)))
    bert_axes = {"input_ids": {0: "batch_size", 1: "sequence_length"},
                 "attention_mask": {0: "batch_size", 1: "sequence_length"},
                 "token_type_ids": {0: "batch_size", 1: "sequence_length"}}
    export(EmbedderExport(emb), ex, ["input_ids", "attention_mask", "token_type_ids"], ["last_hidden_state"],
           {**bert_axes, "last_hidden_state": {0: "batch_size", 1: "sequence_length"}},
           out / "embedder" / "onnx" / "model.onnx")
    export(rr, ex, ["input_ids", "attention_mask", "token_type_ids"], ["logits"],
           {**bert_axes, "logits": {0: "batch_size"}}, out / "reranker" / "onnx" / "model.onnx")
    nl, kvh, hd = dec_cfg["num_hidden_layers"], dec_cfg["num_key_value_heads"], dec_cfg["head_dim"]
    past = [torch.randn(2, kvh, 3, hd) for _ in range(2 * nl)]
    x = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    am = torch.ones(2, 7, dtype=torch.long)
    pos = torch.arange(3, 7)[None].expand(2, 4)
    names_past, names_present, axes = decoder_io(nl)
    export(DecoderExport(dec), (x, am, pos, *past), ["input_ids", "attention_mask", "position_ids", *names_past],
           ["logits", *names_present], axes, out / "decoder" / "onnx" / "model.onnx")

    # ---------------- check the ONNX files with onnxruntime (python) against torch
    try:
        import onnxruntime as ort
        s = ort.InferenceSession(str(out / "embedder" / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
        h = s.run(None, {"input_ids": a, "attention_mask": m, "token_type_ids": np.zeros_like(a)})[0]
        with torch.no_grad():
            r = emb(*ex).numpy()
        report["ort_embedder_max_abs_diff"] = float(np.abs((h - r) * m[..., None]).max())
        s = ort.InferenceSession(str(out / "decoder" / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
        v = vectors["decoder"][0]
        ids = list(v["prompt_ids"])
        feeds_past = {n: np.zeros((1, kvh, 0, hd), np.float32) for n in names_past}
        gen, cur, total = [], ids, 0
        for _ in range(len(v["greedy_ids"])):
            total += len(cur)
            o = s.run(None, {"input_ids": np.array([cur], np.int64), "attention_mask": np.ones((1, total), np.int64),
                             "position_ids": np.arange(total - len(cur), total, dtype=np.int64)[None], **feeds_past})
            nxt = int(o[0][0, -1].argmax())
            gen.append(nxt)
            feeds_past = dict(zip(names_past, o[1:]))
            cur = [nxt]
            if nxt == EOS:
                break
        report["ort_decoder_greedy_matches"] = gen == v["greedy_ids"]
        log("onnxruntime check:", report["ort_embedder_max_abs_diff"], report["ort_decoder_greedy_matches"])
    except Exception as e:
        report["ort_check_error"] = repr(e)
        log("onnxruntime check failed:", repr(e))

    write_json(out / "testvectors.json", vectors)
    write_json(out / "build_report.json", report)
    log("done", json.dumps({k: v for k, v in report.items() if k != "sample_answers"}))


if __name__ == "__main__":
    main()
