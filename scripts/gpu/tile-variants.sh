#!/bin/bash
# The int8 tensor-core kernel's two tiles for products of 33-64 rows, timed in one call on the GPU host: the
# default build (the 64-row tile past 32 rows) and one built with -DQMMQ_TILE32_ROWS=64 (two 32-row tiles
# along M), bench:gpu-gguf at 32 / 48 / 64 concurrent on the 7B files of run-gguf.sh's gguf7b step, llama.cpp's
# llama-batched-bench beside the default. Run after run-gguf.sh's "build models7b gguf7b" (and its llama step) in
# the same warm hold; VARIANT_BUILD=background starts the variant's build into /tmp/rg-variant at once (while
# the steps run), VARIANT_BUILD=wait (the default) builds it when needed. Output: one summary line per file
# and variant on stdout, everything in $OUT/variants.jsonl.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/ragguard-gpu}
mkdir -p "$out"
variant=/tmp/rg-variant
# The variant's build (in a copy of the sources), marked started and done so that a later call waits for it.
build_variant() {
  touch "$variant.started"
  rm -rf "$variant" && mkdir -p "$variant" && cp -r src scripts "$variant"/ &&
    (cd "$variant" && CUDA_ARCHS="-gencode arch=compute_90,code=sm_90 -DQMMQ_TILE32_ROWS=64" bash scripts/build-cuda.sh decoder) > /tmp/rg-variant-build.txt 2>&1
  touch "$variant.done"
}
if [[ ${VARIANT_BUILD:-wait} == background ]]; then
  rm -f "$variant.started" "$variant.done"
  build_variant < /dev/null > /dev/null 2>&1 &
  exit 0
fi
files=${FILES:-/tmp/rg-gguf/qwen2-7b-bf16-Q4_K_M.gguf,/tmp/rg-gguf/qwen2-7b-bf16-Q8_0.gguf}
export BENCH_GPU_CONCURRENCY=${LEVELS:-32,48,64} BENCH_GPU_QGEMM=int8 BENCH_GPU_QGEMV_MATH=int8 BENCH_GPU_GREEDY=0
summary() {
  node -e '
    const lines = require("fs").readFileSync(0, "utf8").trim().split("\n");
    const d = JSON.parse(lines[lines.length - 1]);
    for (const m of d.models) console.log(JSON.stringify({ variant: process.argv[1], file: m.file,
      rows: m.rows.map((r) => [r.concurrency, r.ragguard.decode_tokens_per_s, r.llama_batched_bench?.decode_tokens_per_s ?? null, r.ratio]) }));
  ' "$1" | tee -a "$out/variants.jsonl"
}
BENCH_GPU_GGUF=$files LLAMA_BIN=${LLAMA_BIN:-/tmp/rg-llama/build/bin} node --import tsx bench/gpu-gguf.ts 2> "$out/default.err" | summary tile32-upto-32
[[ -e $variant.started ]] || build_variant
for _ in $(seq 300); do [[ -e $variant.done ]] && break; sleep 1; done
[[ -f $variant/build/native/libragguard_cuda.so ]] || { echo '{"error":"the variant did not build"}'; tail -5 /tmp/rg-variant-build.txt; exit 1; }
cp build/native/libragguard_cuda.so /tmp/rg-default.so
cp "$variant/build/native/libragguard_cuda.so" build/native/libragguard_cuda.so
BENCH_GPU_GGUF=$files LLAMA_BIN= node --import tsx bench/gpu-gguf.ts 2> "$out/variant.err" | summary tile32-upto-64
cp /tmp/rg-default.so build/native/libragguard_cuda.so
