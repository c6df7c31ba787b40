"""Trains the grounded-answer LoRA adapter for the default decoder, on the CPU.

Input: a Hugging Face checkpoint of the GGUF decoder (scripts/export-gguf-hf.ts: the weights the server
runs, dequantized to float32) and the tune split's examples (scripts/grounded-lora-data.ts: each
question's prompt exactly as POST /query builds it, and the gold answer's tokens with the end of turn).
The loss is the gold answer's tokens only, given the prompt: the adapter learns to answer from the
retrieved context in the question set's short phrasing, which bench/answers.ts judges.

Output: a PEFT adapter directory (adapter_config.json, adapter_model.safetensors in float16), which the
server's adapter registry reads as it reads any PEFT adapter.

    .cache/venv/bin/python scripts/train-grounded-lora.py --model .cache/coder-hf \
        --data .cache/grounded-tune.jsonl --out models/shipped-adapters/coder-grounded

Everything is seeded (the order of examples, LoRA's initial A, dropout); torch's CPU kernels may still
differ in the last bits between machines. scripts/grounded-lora.sh runs the whole pipeline.
"""
import argparse
import json
import math
import os
import random
import time

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM


def save(model, args, examples, steps_total: int, updates_total: int, update: int, seconds: float) -> None:
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    card = os.path.join(args.out, "README.md")  # PEFT's model-card template: models/shipped-adapters/README.md says it all
    if os.path.exists(card):
        os.remove(card)
    # float16 halves the file; the registry widens F16 as it loads.
    path = os.path.join(args.out, "adapter_model.safetensors")
    tensors = {k: v.to(torch.float16).contiguous() for k, v in load_file(path).items()}
    save_file(tensors, path, metadata={"format": "pt"})
    conf_path = os.path.join(args.out, "adapter_config.json")
    conf = json.load(open(conf_path))
    conf["base_model_name_or_path"] = args.base_name
    with open(conf_path, "w") as f:
        json.dump(conf, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(args.out, "training.json"), "w") as f:
        json.dump({"data": os.path.basename(args.data), "examples": len(examples), "steps": steps_total, "updates": updates_total,
                   "updates_done": update, "accumulate": args.accumulate, "epochs": args.epochs, "lr": args.lr, "rank": args.rank,
                   "alpha": args.alpha, "target_modules": ["q_proj", "v_proj"], "seed": args.seed, "seconds": round(seconds),
                   "torch": torch.__version__}, f, indent=2)
        f.write("\n")
    print(f"[train] {args.out}: {len(tensors)} tensors after {update} of {updates_total} updates ({seconds:.0f} s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--base-name", default="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf")
    ap.add_argument("--epochs", type=float, default=2)
    ap.add_argument("--accumulate", type=int, default=4)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=int, default=16)
    ap.add_argument("--seed", type=int, default=32)
    ap.add_argument("--limit", type=int, default=0, help="first n examples only (a smoke run)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save-every", type=int, default=10, help="also write the adapter every n updates (a run stopped early leaves one)")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    examples = [json.loads(line) for line in open(args.data) if line.strip()]
    if args.limit:
        examples = examples[: args.limit]

    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32)
    model.config.use_cache = False
    cfg = LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.05, target_modules=["q_proj", "v_proj"],
                     bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, cfg)
    model.print_trainable_parameters()
    base = model.base_model.model  # Qwen2ForCausalLM with LoRA layers
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)

    order_rng = random.Random(args.seed)
    steps_total = math.ceil(len(examples) * args.epochs)
    updates_total = math.ceil(steps_total / args.accumulate)
    warmup = max(1, updates_total // 10)

    def lr_at(update: int) -> float:
        if update < warmup:
            return args.lr * (update + 1) / warmup
        return args.lr * max(0.0, (updates_total - update) / max(1, updates_total - warmup))

    model.train()
    t0 = time.time()
    step = 0
    update = 0
    running = []
    queue: list = []
    while step < steps_total:
        if not queue:
            queue = examples[:]
            order_rng.shuffle(queue)
        ex = queue.pop()
        prompt, target = ex["prompt"], ex["target"]
        ids = torch.tensor([prompt + target[:-1]])
        hidden = base.model(input_ids=ids).last_hidden_state
        # Only the positions that predict the answer go through the LM head (the vocabulary is 152k wide).
        at = hidden[0, len(prompt) - 1:]
        logits = base.lm_head(at).float()
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(target))
        (loss / args.accumulate).backward()
        running.append(loss.item())
        step += 1
        if step % args.accumulate == 0 or step == steps_total:
            for g in opt.param_groups:
                g["lr"] = lr_at(update)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad()
            update += 1
            if args.save_every and update % args.save_every == 0 and step < steps_total:
                save(model, args, examples, steps_total, updates_total, update, time.time() - t0)
            if update % 5 == 0 or step == steps_total:
                print(f"[train] update {update}/{updates_total} step {step}/{steps_total} loss {sum(running) / len(running):.3f} "
                      f"({time.time() - t0:.0f} s)", flush=True)
                running = []

    save(model, args, examples, steps_total, updates_total, update, time.time() - t0)


if __name__ == "__main__":
    main()
