#!/bin/bash
# bench:rag-gpu on the GPU host, the server end to end: the server with the default
# decoder on the CUDA backend and the embedder and reranker on the CUDA encoder, under the question set and
# bursts of mixed-length streamed /query requests, with llama.cpp's llama-server (CUDA build) on the same GGUF
# file as the peer in the same call. What is measured and how: bench/rag-gpu.ts's header.
#
# Here first:
#   bash scripts/gpu/pack.sh                          .gpu-base + .gpu: node, the whole node_modules (express,
#                                                     ONNX Runtime, faiss) and their libraries
#   bash scripts/gpu/pack-cuda.sh && bash scripts/gpu/pack-llama.sh     .gpu-cuda: llama.cpp's source
#   bash scripts/gpu/run-encoders.sh pack-minilm       .gpu-cuda/minilm: the default embedder (not in git)
#   bash scripts/gpu/model-pieces.sh split models/pretrained/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf   (14 parts)
# On the GPU host, one machine kept warm (what a call leaves in /tmp and in ignored paths stays while it is):
#   1. carry [".gpu-cuda"]:            STEPS=llama bash scripts/gpu/run-gguf.sh    (llama-server, CUDA: 4-6 min)
#   2. N = 0..13: here `bash scripts/gpu/model-pieces.sh stage N`; carry [".gpu-cuda/pieces/carry"]:
#                                      bash scripts/gpu/model-pieces.sh append /tmp/rg-default.gguf
#   3. carry [".gpu-cuda/minilm"]:     STEPS=minilm bash scripts/gpu/run-encoders.sh   (else the embedder is the
#                                      small models/embedder, and the JSON's settings.embedder says so)
#   4. carry [".gpu-base"]:            source .gpu-base/enter.sh
#   5. carry [".gpu"] (right after 4): source .gpu/enter.sh && STEPS=build bash scripts/gpu/run-rag-gpu.sh
#   6. carry [".gpu"]:                 source .gpu/enter.sh && bash scripts/gpu/run-rag-gpu.sh
# Steps (STEPS, default "raggpu"):
#   build   scripts/build-cuda.sh: the CUDA decoder and encoder libraries (the host's nvcc, ~1 min)
#   raggpu  npm run bench:rag-gpu (bench/rag-gpu.ts) with RAGGUARD_DECODER=$DEFAULT_GGUF (/tmp/rg-default.gguf; or a
#           Hugging Face checkpoint directory, e.g. run-gguf.sh's random-weight one of the default's shape),
#           RAGGUARD_EMBEDDER=$MINILM_DIR where step 3 put it (/tmp/rg-minilm), LLAMA_BIN=$LLAMA/build/bin
#           (/tmp/rg-llama): bursts of 256 at 32 and 64 concurrent, the peer at -np 64; BENCH_RAG_GPU_* and
#           RAGGUARD_* pass through; its deadline (BENCH_RAG_GPU_DEADLINE_S, 540 s) keeps it within one call.
#           BENCH_RAG_GPU_INDEX_DIR=/tmp/rg-rag-gpu-index keeps the index and calibration for a second run.
# Output: $OUT/rag-gpu.log (everything), $OUT/rag-gpu.jsonl (each step's last JSON line).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/ragguard-gpu}
mkdir -p "$out"
log=$out/rag-gpu.log
results=$out/rag-gpu.jsonl
steps=${STEPS:-raggpu}
DEFAULT_GGUF=${DEFAULT_GGUF:-/tmp/rg-default.gguf}
MINILM_DIR=${MINILM_DIR:-/tmp/rg-minilm}
LLAMA=${LLAMA:-/tmp/rg-llama}
RECORD_SHOW=3000
. scripts/gpu/steps.sh
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv >> "$log" 2>&1
# run-gguf.sh's llama step (.gpu-cuda/enter.sh) may have left a partial node_modules, which .gpu/enter.sh
# then keeps: the server needs the whole one.
if [[ -f .gpu/node_modules.txz && ! ( -d node_modules/express && -d node_modules/onnxruntime-node ) ]]; then
  tar -xJf .gpu/node_modules.txz
fi

has build && record build bash scripts/build-cuda.sh
if has raggpu; then
  rag_gpu() {
    [[ -e $DEFAULT_GGUF ]] || { echo "{\"error\":\"$DEFAULT_GGUF is not here (scripts/gpu/model-pieces.sh)\"}"; return 1; }
    local llama_bin=${LLAMA_BIN:-$LLAMA/build/bin}
    [[ -x $llama_bin/llama-server ]] || echo "bench:rag-gpu: no $llama_bin/llama-server (STEPS=llama bash scripts/gpu/run-gguf.sh): the peer is left out"
    local embedder=${RAGGUARD_EMBEDDER:-}
    [[ -z $embedder && -f $MINILM_DIR/onnx/model.onnx ]] && embedder=$MINILM_DIR
    [[ -z $embedder ]] && embedder=models/embedder
    RAGGUARD_DECODER=$DEFAULT_GGUF RAGGUARD_EMBEDDER=$embedder LLAMA_BIN=$llama_bin \
      BENCH_RAG_GPU_SERVER_LOG=${BENCH_RAG_GPU_SERVER_LOG:-$out/rag-gpu-server.log} \
      node --import tsx bench/rag-gpu.ts
  }
  record raggpu rag_gpu
fi
