#!/bin/bash
# Issue 29's encoders on the GPU host (nvidia-h200): the CUDA encoder (src/backends/cuda/encoder.cu) built,
# checked against the CPU path's references, and benchmarked against sentence-transformers on the same GPU.
#
# Here first:
#   bash scripts/gpu/pack-cuda.sh                 node + the CUDA path's packages in .gpu-cuda (~27 MiB)
#   bash scripts/gpu/run-encoders.sh pack-minilm  all-MiniLM-L6-v2 (the default embedder, not in git: its
#                                                 int8 graph, tokenizer, pooling) in .gpu-cuda/minilm (~21 MiB)
# The two do not fit one call with the tree (64 MiB): MiniLM travels in a call of its own, first, and stays
# in /tmp while the machine is warm:
#   call 1 (optional), carry [".gpu-cuda/minilm"]:
#     STEPS=minilm bash scripts/gpu/run-encoders.sh
#   call 2, carry [".gpu-cuda/node.xz", ".gpu-cuda/modules.txz", ".gpu-cuda/enter.sh"]:
#     STEPS="build check bench" bash scripts/gpu/run-encoders.sh
# Without call 1 the check and the bench run the small test models only (models/embedder, models/reranker)
# and say so (the check lists MiniLM as skipped; the bench's JSON names the embedder it ran).
#
# Steps (STEPS, default "build check bench"):
#   minilm  unpacks the carried MiniLM into $MINILM_DIR (/tmp/rg-minilm)
#   build   scripts/build-cuda.sh encoder (the host's nvcc) -> build/native/libragguard_encoder.so
#   check   scripts/check-cuda-encoders.ts: embeddings (cosine >= 0.999) and rerank scores (1e-2 relative)
#           against scripts/gpu/encoder-reference.json, both attention kernels, padding and device memory
#   bench   npm run bench:gpu-encoders: ingest chunks/s and rerank pairs/s against sentence-transformers
#           (scripts/gpu/st_encoders.py; transformers where it is not installed) on the same GPU
# Output: $OUT/encoders.log (everything), $OUT/encoders.jsonl (each step's last JSON line).
set -uo pipefail
cd "$(dirname "$0")/../.."
export MINILM_DIR=${MINILM_DIR:-/tmp/rg-minilm}

if [[ ${1:-} == pack-minilm ]]; then
  src=models/pretrained/all-minilm-l6-v2
  [[ -f $src/onnx/model.onnx ]] || { echo "$src is not here: npm run setup fetches it" >&2; exit 1; }
  mkdir -p .gpu-cuda/minilm
  tar -cJf .gpu-cuda/minilm/minilm.txz -C "$src" config.json tokenizer.json tokenizer_config.json special_tokens_map.json 1_Pooling onnx/model.onnx
  du -sh .gpu-cuda/minilm
  exit 0
fi

[[ -f .gpu-cuda/enter.sh ]] && source .gpu-cuda/enter.sh
out=${OUT:-/tmp/ragguard-gpu}
mkdir -p "$out"
log=$out/encoders.log
results=$out/encoders.jsonl
steps=${STEPS:-build check bench}
RECORD_SHOW=2000
. scripts/gpu/steps.sh
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv >> "$log" 2>&1

unpack_minilm() {
  [[ -f .gpu-cuda/minilm/minilm.txz ]] || { echo '{"error":"carry .gpu-cuda/minilm (scripts/gpu/run-encoders.sh pack-minilm here)"}'; return 1; }
  mkdir -p "$MINILM_DIR" && tar -xJf .gpu-cuda/minilm/minilm.txz -C "$MINILM_DIR" || return 1
  echo "{\"minilm\":\"$MINILM_DIR\",\"bytes\":$(du -sb "$MINILM_DIR" | cut -f1)}"
}

has minilm && record minilm unpack_minilm
has build && record build bash scripts/build-cuda.sh encoder
has check && record check node --import tsx scripts/check-cuda-encoders.ts
has bench && record bench node --import tsx bench/gpu-encoders.ts
exit 0
