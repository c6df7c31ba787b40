#!/usr/bin/env python3
"""The baseline bench:gpu runs beside the CUDA backend, on the same weights and GPU: transformers on torch,
eager generate and a static-cache torch.compile'd decode (CUDA graphs, the practical single-process limit).

    python3 scripts/gpu/torch_decode.py --model DIR --requests 32 --new 64 --prompt 24 --concurrency 1,8,32 \
        [--modes eager,compiled]

For each mode and concurrency c: requests in batches of c (each batch one generate of c rows, EOS ignored),
the first batch a warm-up (and compile); the prompts from --prompts (the bench's) or random; prints one JSON line per case with tokens/s over the timed batches,
TTFT p50 (a generate of one new token on a batch of c) and the greedy ids of the first timed batch's rows.
"""
import argparse
import json
import statistics
import time

import torch
from transformers import AutoModelForCausalLM


def margins(model, prompt_ids, gen_ids):
    """Per generated position, torch's own top-1 minus top-2 logit over the largest |logit| (teacher-forced on
    its ids): where another engine's greedy ids part from torch's, this says whether it was at a near-tie."""
    full = torch.cat([prompt_ids, torch.tensor(gen_ids, device=prompt_ids.device)], dim=1)
    with torch.no_grad():
        logits = model(full).logits[:, prompt_ids.shape[1] - 1:-1].float()
    top = logits.topk(2, dim=-1).values
    scale = logits.abs().amax(dim=-1).clamp_min(1e-6)
    return [[round(x, 5) for x in row] for row in ((top[..., 0] - top[..., 1]) / scale).tolist()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=24)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--modes", default="eager,compiled")
    ap.add_argument("--max-batches", type=int, default=4, help="timed batches per case at most")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--prompts", help="a JSON file of token-id lists (the bench's own prompts)")
    args = ap.parse_args()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype="auto").to("cuda").eval()
    model.generation_config.eos_token_id = None
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    g = torch.Generator().manual_seed(args.seed)
    vocab = model.config.vocab_size
    if args.prompts:
        with open(args.prompts) as f:
            ids = torch.tensor(json.load(f), device="cuda")
        args.requests, args.prompt = ids.shape
    else:
        ids = torch.randint(3, vocab, (args.requests, args.prompt), generator=g).cuda()
    for mode in args.modes.split(","):
        for c in [int(x) for x in args.concurrency.split(",")]:
            kw = dict(max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False, pad_token_id=0)
            if mode == "compiled":
                kw.update(cache_implementation="static")
                model.generation_config.compile_config = None
            batches = [ids[i:i + c] for i in range(0, args.requests, c)]
            try:
                with torch.no_grad():
                    model.generate(batches[0], **kw)  # warm-up (and compile)
                    timed = batches[:max(1, min(args.max_batches, len(batches)))]
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    first = None
                    for b in timed:
                        out = model.generate(b, **kw)
                        first = first if first is not None else out[:, args.prompt:].tolist()
                    torch.cuda.synchronize()
                    dt = time.perf_counter() - t0
                    ttft = []
                    kw1 = dict(kw, max_new_tokens=1, min_new_tokens=1)
                    for b in timed:
                        torch.cuda.synchronize()
                        t1 = time.perf_counter()
                        model.generate(b, **kw1)
                        torch.cuda.synchronize()
                        ttft.append(time.perf_counter() - t1)
                    first_margins = margins(model, timed[0], first)
                tokens = sum(len(b) for b in timed) * args.new
                print(json.dumps({"engine": f"torch-{mode}", "dtype": dtype, "concurrency": c, "tokens_per_s": round(tokens / dt, 1),
                                  "ttft_ms_p50": round(statistics.median(ttft) * 1000, 2), "batches_timed": len(timed),
                                  "greedy_ids": first, "margins": first_margins}), flush=True)
            except Exception as e:  # a baseline that fails is reported, not fatal
                print(json.dumps({"engine": f"torch-{mode}", "dtype": dtype, "concurrency": c, "error": str(e)[:300]}), flush=True)


if __name__ == "__main__":
    main()
