#!/usr/bin/env bash
# Trains the grounded-answer LoRA adapter for the default decoder on the CPU (models/shipped-adapters/README.md):
#   1. a virtual environment in .cache/venv with scripts/grounded-lora-requirements.txt (pinned, PyPI)
#   2. the GGUF dequantized into a Hugging Face checkpoint (scripts/export-gguf-hf.ts -> .cache/coder-hf)
#   3. the tune split's prompts as /query builds them, with the gold answers (scripts/grounded-lora-data.ts)
#   4. training (scripts/train-grounded-lora.py), niced; extra arguments go to it (--epochs, --limit, --seed ...)
#
#   bash scripts/grounded-lora.sh [--out dir] [train-grounded-lora.py arguments]
# LORA_BUDGET: the prompts' token budget (default 320); the default output is models/shipped-adapters/coder-grounded.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
GGUF=models/pretrained/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf
VENV=.cache/venv
[[ -f $GGUF ]] || { echo "$GGUF missing: npm run setup fetches it" >&2; exit 1; }
[[ -x $VENV/bin/python ]] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check -r scripts/grounded-lora-requirements.txt
hf=.cache/coder-hf
if [[ ! -f $hf/model.safetensors || $GGUF -nt $hf/model.safetensors ]]; then
  nice -n 10 node --import tsx scripts/export-gguf-hf.ts "$GGUF" "$hf"
fi
data=.cache/grounded-tune-${LORA_BUDGET:-320}.jsonl
[[ -f $data ]] || nice -n 10 node --import tsx scripts/grounded-lora-data.ts "$data" --budget "${LORA_BUDGET:-320}"
nice -n 10 "$VENV/bin/python" scripts/train-grounded-lora.py --model "$hf" --data "$data" --out models/shipped-adapters/coder-grounded "$@"
