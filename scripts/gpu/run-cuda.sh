#!/bin/bash
# The CUDA backend on the GPU host (after `source .gpu/enter.sh`; scripts/gpu/pack.sh made .gpu/ here):
#   build   scripts/build-cuda.sh (nvcc there) -> build/native/libragguard_cuda.so
#   models  random-weight Hugging Face checkpoints + torch references (scripts/gpu/hf_models.py) in $MODELS
#   check   scripts/check-cuda.ts on them (logits, greedy ids alone / mixed / prefix hit / preempted, sampling)
#   bench   npm run bench:gpu (bench/gpu.ts) against transformers eager and compiled, same weights
#   big     the 7B-shaped checkpoint and bench:gpu's bandwidth figures (BENCH_GPU_BIG)
#   lora    npm run bench:gpu-lora (bench/gpu-lora.ts): LoRA slots and adapters' cost (needs the models step's adapters)
# STEPS picks steps (default "build models check bench"); each step's output goes to $OUT/cuda.log, its
# last JSON line to $OUT/cuda.jsonl.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/ragguard-gpu}
mkdir -p "$out"
log=$out/cuda.log
results=$out/cuda.jsonl
steps=${STEPS:-build models check bench}
MODELS=${MODELS:-/tmp/rg-models}
small=${CUDA_MODELS:-qwen2-0.5b-f16 qwen2-0.5b-bf16 llama-small-bf16}
RECORD_SHOW=1500
. scripts/gpu/steps.sh
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv >> "$log" 2>&1
has build && record build bash scripts/build-cuda.sh
dirs=()
for m in $small; do dirs+=("$MODELS/$m"); done
has models && record models python3 scripts/gpu/hf_models.py --out "$MODELS" $small
has check && record check node --import tsx scripts/check-cuda.ts "${dirs[@]}"
if has bench; then
  bench_models=${BENCH_GPU_MODELS:-$MODELS/qwen2-0.5b-f16,$MODELS/qwen2-0.5b-bf16}
  BENCH_GPU_MODELS=$bench_models record bench node --import tsx bench/gpu.ts
fi
has lora && BENCH_GPU_MODELS=${BENCH_GPU_MODELS:-$MODELS/qwen2-0.5b-f16} record lora node --import tsx bench/gpu-lora.ts
if has big; then
  record big-model python3 scripts/gpu/hf_models.py --out "$MODELS" qwen2-7b-bf16
  BENCH_GPU_MODELS= BENCH_GPU_BIG=$MODELS/qwen2-7b-bf16 record big node --import tsx bench/gpu.ts
fi
