#!/bin/bash
# Where a decode step's time goes on the GPU host (after `source .gpu-cuda/enter.sh`): bench:gpu (this
# backend alone) under Nsight Systems' CUDA trace, then its kernel and API summaries as text in $OUT.
#   PROFILE_MODELS  checkpoints under $MODELS to build and profile (default: the 0.5B f16 and the 7B bf16)
# No report file comes back (they are large): only profile-<model>.txt and the bench's own log.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/ragguard-gpu}
MODELS=${MODELS:-/tmp/rg-models}
mkdir -p "$out"
nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
[[ -f build/native/libragguard_cuda.so ]] || bash scripts/build-cuda.sh > "$out/build.log" 2>&1
for m in ${PROFILE_MODELS:-qwen2-0.5b-f16 qwen2-7b-bf16}; do
  [[ -f $MODELS/$m/config.json ]] || python3 scripts/gpu/hf_models.py --out "$MODELS" "$m" >> "$out/models.log" 2>&1
  if [[ $m == *7b* ]]; then envs=(BENCH_GPU_MODELS= BENCH_GPU_BIG=$MODELS/$m)
  else envs=(BENCH_GPU_MODELS=$MODELS/$m BENCH_GPU_TORCH_MODES= BENCH_GPU_CONCURRENCY=${PROFILE_CONCURRENCY:-1} BENCH_GPU_REQUESTS=8); fi
  if [[ -z $nsys ]]; then
    echo "no nsys on this host" > "$out/profile-$m.txt"
    env "${envs[@]}" node --import tsx bench/gpu.ts > "$out/bench-$m.log" 2>&1
    continue
  fi
  env "${envs[@]}" "$nsys" profile -t cuda -o "/tmp/prof-$m" --force-overwrite true node --import tsx bench/gpu.ts > "$out/bench-$m.log" 2>&1
  "$nsys" stats -r cuda_gpu_kern_sum,cuda_api_sum,cuda_gpu_mem_time_sum "/tmp/prof-$m.nsys-rep" > "$out/profile-$m.txt" 2>&1
  tail -n 3 "$out/bench-$m.log"
done
