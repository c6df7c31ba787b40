#!/bin/bash
# The CUDA backend on the GPU host (after `source .gpu/enter.sh`; scripts/gpu/pack.sh made .gpu/ here):
#   build   scripts/build-cuda.sh (nvcc there) -> build/native/libragguard_cuda.so
#   models  random-weight Hugging Face checkpoints + torch references (scripts/gpu/hf_models.py) in $MODELS
#   check   scripts/check-cuda.ts on them (logits, greedy ids alone / mixed / prefix hit / preempted, sampling)
#   bench   npm run bench:gpu (bench/gpu.ts) against transformers eager and compiled, same weights
#   big     the 7B-shaped checkpoint and bench:gpu's bandwidth figures (BENCH_GPU_BIG)
# With the full pack (.gpu: ONNX Runtime, faiss; carried in two calls, see scripts/gpu/split-pack.sh, then
# `source .gpu/enter.sh`), the server on this backend:
#   hf      the shipped decoder as a Hugging Face checkpoint (models/decoder-hf) and the counting allocator
#   parity  scripts/check-cuda-parity.ts: the same trained model on the CPU path and on this backend
#   serve   the server with RAGGUARD_DECODER_EP=cuda: /healthz, one query, /debug/memory, the start-up log
#   guard   bench:guard with the decoder on this backend (encoders on the CPU: RAGGUARD_EMBEDDER_EP etc. to move them)
#   guard-webgpu  the same with the encoders on the GPU through WebGPU (not yet run)
#   lora    npm run bench:gpu-lora (bench/gpu-lora.ts): LoRA slots and adapters' cost (needs the models step's adapters)
# STEPS picks steps (default "build models check bench"); each step's output goes to $OUT/cuda.log, its
# last JSON line to $OUT/cuda.jsonl.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/ragguard-gpu}
mkdir -p "$out"
log=$out/cuda.log
results=$out/cuda.jsonl
steps=${STEPS:-build models check bench}
MODELS=${MODELS:-/tmp/rg-models}
small=${CUDA_MODELS:-qwen2-0.5b-f16 qwen2-0.5b-bf16 llama-small-bf16}
RECORD_SHOW=1500
. scripts/gpu/steps.sh
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv >> "$log" 2>&1
has build && record build bash scripts/build-cuda.sh
dirs=()
for m in $small; do dirs+=("$MODELS/$m"); done
has models && record models python3 scripts/gpu/hf_models.py --out "$MODELS" $small
has check && record check node --import tsx scripts/check-cuda.ts "${dirs[@]}"
if has bench; then
  bench_models=${BENCH_GPU_MODELS:-$MODELS/qwen2-0.5b-f16,$MODELS/qwen2-0.5b-bf16}
  BENCH_GPU_MODELS=$bench_models record bench node --import tsx bench/gpu.ts
fi
if has hf; then
  # As setup makes them here: the genai decoder (LoRA inputs) and the sample adapters, for the parity check.
  record hf bash -c 'node --import tsx scripts/export-hf-checkpoint.ts models/decoder models/decoder-hf &&
    node --import tsx scripts/build-gqa-decoder.ts models/decoder models/decoder-gqa &&
    node --import tsx scripts/build-adapters.ts models/adapters &&
    mkdir -p build/native && cc -O2 -shared -fPIC -o build/native/libragguard-alloc.so src/backends/ort/counting-allocator.c'
fi
has parity && record parity node --import tsx scripts/check-cuda-parity.ts models/decoder-gqa models/decoder-hf
cuda_env=(RAGGUARD_DECODER=models/decoder-hf RAGGUARD_DECODER_EP=cuda RAGGUARD_EMBEDDER=${RAGGUARD_EMBEDDER:-models/embedder})
if has serve; then
  serve_check() {
    env "${cuda_env[@]}" PORT=8092 RAGGUARD_INDEX_DIR=/tmp/ragguard-cuda-index node --import tsx src/cli/serve.ts > "$out/.server" 2>&1 &
    local pid=$!
    wait_healthy 8092 "$pid"
    node -e '
      const base = "http://127.0.0.1:8092";
      const post = (p, b) => fetch(base + p, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(b) });
      (async () => {
        const health = await (await fetch(base + "/healthz")).json();
        const t0 = performance.now();
        const q = await post("/query", { query: "How can I stop one particular user from scheduling cron jobs?", max_new_tokens: 48, temperature: 0 });
        const answer = await q.json();
        const ms = performance.now() - t0;
        const withAdapter = await (await post("/query", { query: "How can I stop one particular user from scheduling cron jobs?", max_new_tokens: 24, temperature: 0, adapter: "demo-r8" })).json();
        // Penalties run on the device sampler (since 2026-12-04; refused with 422 before).
        const model = (await (await fetch(base + "/v1/models")).json()).data[0].id;
        const penalized = await post("/v1/completions", { model, prompt: "apt apt apt", max_tokens: 16, frequency_penalty: 1, repetition_penalty: 1.3 });
        const pen = { status: penalized.status, body: await penalized.json() };
        const many = await Promise.all(Array.from({ length: 32 }, (_, i) => post("/query", { query: "What does the sticky bit do on /tmp?", max_new_tokens: 32, temperature: 0.7, seed: i }).then((r) => r.status)));
        const mem = await (await fetch(base + "/debug/memory")).json();
        console.log(JSON.stringify(mem, null, 1));
        console.log(JSON.stringify({ providers: health.providers, decoder: health.decoder, status: q.status, answer: answer.answer, query_ms: Math.round(ms),
          timings_ms: answer.timings_ms, with_adapter: { answer: withAdapter.answer, adapter: withAdapter.adapter, error: withAdapter.error },
          penalized: { status: pen.status, text: pen.body.choices?.[0]?.text, error: pen.body.error }, statuses_32: many, components: mem.components, budget: mem.budget, gpu: mem.gpu }));
      })().catch((e) => { console.log(JSON.stringify({ error: String(e) })); process.exitCode = 1; });' > "$out/.serve"
    local rc=$?
    kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    echo "--- server log"; cat "$out/.server"
    echo "--- check"; cat "$out/.serve"
    return $rc
  }
  record serve serve_check
fi
if has guard; then
  # The reranker on, so that requests' runs (the encoders', on the CPU here) need workspace worth guarding.
  # A workspace the unguarded server's reranker bursts overflow. The decoder's device bytes are all
  # allocated at start-up (NVML grows by 0 while requests run), so what requests contend for is the
  # encoders' host workspace: at 64 MiB and bursts of 24 the unguarded peaks (57-65 MiB) overflowed it
  # once in three runs (H200, 2026-12-04, 3d857d0); at 48 MiB and bursts of 32 in every run (2 of 3 bursts each, peaks
  # 56-65 MiB), guarded peaks 31-39 MiB; at 40 MiB the resident meter (the JS heap of 32 requests
  # included, which the guard does not predict) once put a guarded burst 0.45 MiB over (H200, 2026-12-04, 500f35f).
  # Through scripts/tuned.sh, as npm run bench:guard runs it: without one malloc arena, the 16 cores'
  # threads kept their own arenas and resident peaks were 3-6x the accounted ones, guards on or off.
  guard_cuda() { env "${cuda_env[@]}" RAGGUARD_RERANK=${RAGGUARD_RERANK:-true} BENCH_GUARD_WORKSPACE_MB=${BENCH_GUARD_WORKSPACE_MB:-48} BENCH_GUARD_BURST=${BENCH_GUARD_BURST:-32} sh scripts/tuned.sh node --import tsx bench/guard.ts; }
  record guard guard_cuda
fi
if has guard-webgpu; then
  # The encoders on the GPU too (WebGPU, its buffer cache off): NVML does not see a run alone (Dawn pools
  # its buffers); concurrent ones grew device memory by 28-34 MiB in one run's unguarded bursts and by
  # 0.1 MiB in the next (none guarded), so a workspace the first would overflow, not a reproducible one.
  guard_webgpu() {
    env "${cuda_env[@]}" RAGGUARD_EMBEDDER_EP=webgpu RAGGUARD_RERANKER_EP=webgpu RAGGUARD_WEBGPU_BUFFER_CACHE=disabled \
      RAGGUARD_RERANK=${RAGGUARD_RERANK:-true} BENCH_GUARD_WORKSPACE_MB=${BENCH_GUARD_WORKSPACE_MB:-16} sh scripts/tuned.sh node --import tsx bench/guard.ts
  }
  record guard-webgpu guard_webgpu
fi
has lora && BENCH_GPU_MODELS=${BENCH_GPU_MODELS:-$MODELS/qwen2-0.5b-f16} record lora node --import tsx bench/gpu-lora.ts
if has big; then
  record big-model python3 scripts/gpu/hf_models.py --out "$MODELS" qwen2-7b-bf16
  BENCH_GPU_MODELS= BENCH_GPU_BIG=$MODELS/qwen2-7b-bf16 record big node --import tsx bench/gpu.ts
fi
