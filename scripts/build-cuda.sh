#!/usr/bin/env bash
# Builds the native CUDA decoder (src/backends/cuda/ragguard_cuda.cu -> build/native/libragguard_cuda.so)
# and the CUDA encoder (src/backends/cuda/encoder.cu -> build/native/libragguard_encoder.so: the embedder and
# reranker with RAGGUARD_EMBEDDER_EP / RAGGUARD_RERANKER_EP=cuda) with nvcc, for Hopper (sm_90, the H200)
# plus PTX for newer GPUs. Where no nvcc is found (CUDA is not installed: this machine, CI) it says so
# and exits 0: the CUDA backend is then unavailable and the ONNX Runtime paths are unchanged.
# RAGGUARD_NVCC names the compiler; CUDA_ARCHS overrides the targets; `build-cuda.sh encoder` builds one.
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc=${RAGGUARD_NVCC:-$(command -v nvcc || true)}
[[ -n $nvcc ]] || { [[ -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc; }
if [[ -z $nvcc ]]; then
  echo "[cuda] skipped: no nvcc (CUDA toolkit) on this machine; the CUDA backend (RAGGUARD_DECODER_EP=cuda, RAGGUARD_EMBEDDER_EP=cuda) is unavailable here"
  exit 0
fi
cuda_home=$(cd "$(dirname "$nvcc")/.." && pwd)
# cuBLAS: the toolkit's own, else the one Python's nvidia packages carry (the GPU host has both).
libdirs=("$cuda_home/lib64" "$cuda_home/lib")
py_nvidia=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null || true)
[[ -n $py_nvidia ]] && libdirs+=("$py_nvidia"/nvidia/cublas/lib "$py_nvidia"/nvidia/cu13/lib)
link=()
for d in "${libdirs[@]}"; do [[ -d $d ]] && link+=(-L"$d" -Xlinker -rpath="$d"); done
archs=${CUDA_ARCHS:--gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90}
mkdir -p build/native
# build SRC OUT [HEADER...]: unless OUT is newer than its sources and this script.
build() {
  local src=$1 out=$2 dep
  local fresh=1
  for dep in "$src" "$0" "${@:3}"; do [[ -f $out && $out -nt $dep ]] || fresh=0; done
  if (( fresh )); then
    echo "[cuda] $out is up to date"
    return 0
  fi
  echo "[cuda] $nvcc: $src -> $out"
  # shellcheck disable=SC2086
  "$nvcc" -O3 -std=c++17 $archs -Xcompiler -fPIC,-Wall -shared -o "$out" "$src" "${link[@]}" -l:libcublas.so.13 -l:libcublasLt.so.13
  echo "[cuda] built $out"
}
# Arguments pick the libraries (decoder, encoder); both without.
want=" ${*:-decoder encoder} "
[[ $want == *" decoder "* ]] && build src/backends/cuda/ragguard_cuda.cu build/native/libragguard_cuda.so src/backends/cuda/quant_kernels.cuh
[[ $want == *" encoder "* ]] && build src/backends/cuda/encoder.cu build/native/libragguard_encoder.so
exit 0
