#!/usr/bin/env bash
# Trains a grounded-answer LoRA adapter for a GGUF decoder on the CPU (models/shipped-adapters/README.md):
#   1. a virtual environment in .cache/venv with scripts/grounded-lora-requirements.txt (pinned, PyPI)
#   2. the GGUF dequantized into a Hugging Face checkpoint (scripts/export-gguf-hf.ts -> .cache/hf-<gguf name>)
#   3. the tune split's prompts as /query builds them, with the gold answers (scripts/grounded-lora-data.ts)
#   4. training (scripts/train-grounded-lora.py), niced; extra arguments go to it (--epochs, --limit, --seed ...)
#
#   bash scripts/grounded-lora.sh [--out dir] [train-grounded-lora.py arguments]
# LORA_GGUF: the decoder (default: the default decoder, Qwen2.5-Coder-1.5B Q4_K_M). The prompts follow the RAGGUARD_*
#   variables in the environment as the server's do; the 0.5B's adapter was trained on whole chunks:
#   LORA_GGUF=models/pretrained/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf RAGGUARD_CONTEXT_SENTENCES=0.
# LORA_BUDGET: the prompts' token budget (default 320). The default output is models/shipped-adapters/coder-grounded
#   for the 0.5B, coder-grounded-1.5b for the 1.5B.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
GGUF=${LORA_GGUF:-models/pretrained/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf}
base=$(basename "$GGUF")
# The shipped adapter's name for a decoder setup fetches (GROUNDED_ADAPTER_FOR, which /query's auto reads), else grounded-<file>.
name=$(node --import tsx -e "import('./src/generate/adapters.ts').then((m) => console.log(m.GROUNDED_ADAPTER_FOR[process.argv[1]] ?? 'grounded-' + process.argv[1].replace(/\.gguf\$/, '')))" "$base")
VENV=.cache/venv
[[ -f $GGUF ]] || { echo "$GGUF missing: npm run setup fetches it" >&2; exit 1; }
[[ -x $VENV/bin/python ]] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check -r scripts/grounded-lora-requirements.txt
hf=.cache/hf-${base%.gguf}
if [[ ! -f $hf/config.json || $GGUF -nt $hf/config.json ]]; then
  nice -n 10 node --import tsx scripts/export-gguf-hf.ts "$GGUF" "$hf"
fi
data=.cache/grounded-tune-${base%.gguf}-s${RAGGUARD_CONTEXT_SENTENCES:-2}-${LORA_BUDGET:-320}.jsonl
[[ -f $data ]] || RAGGUARD_DECODER=$GGUF nice -n 10 node --import tsx scripts/grounded-lora-data.ts "$data" --budget "${LORA_BUDGET:-320}"
nice -n 10 "$VENV/bin/python" scripts/train-grounded-lora.py --model "$hf" --data "$data" --base-name "$base" --out "models/shipped-adapters/$name" "$@"
