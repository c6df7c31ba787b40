#!/bin/bash
# The GPU run: on the GPU host, after `source .gpu/enter.sh` (scripts/gpu/pack.sh made .gpu/ here).
#   1. builds the 0.5B Qwen2-shaped decoder there (scripts/gpu/build_qwen2_05b.py), float16 (build) and
#      float32 (build32), unless present;
#   2. starts the server on the shipped models with WebGPU, asks it one query, reads /debug/memory
#      (NVML's readings, the budget from the GPU's memory) and stops it;
#   3. runs the benchmarks: bench:peer on the 0.5B decoder (peer: float16, peer32: float32),
#      bench:throughput, bench:kv, and (STEPS=guard) bench:guard measured by NVML (guard32: on the
#      0.5B float32 decoder, which build32 makes).
# The decoder is the shipped one in its Optimum layout: on WebGPU that layout keeps present KV on the
# device between steps (the genai layout's in-place buffer is the CPU path).
# Everything goes to $OUT/run.log; each step's last JSON line to $OUT/results.jsonl as {"step", ...}.
# STEPS (default "build server peer throughput kv"; also build32 peer32 guard guard32) picks steps;
# BENCH_* variables pass through.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/ragguard-gpu}
mkdir -p "$out"
log=$out/run.log
results=$out/results.jsonl
steps=${STEPS:-build server peer throughput kv}
big=${RAGGUARD_GPU_MODEL:-.gpu-models/qwen2-0.5b}
big32=${RAGGUARD_GPU_MODEL32:-.gpu-models/qwen2-0.5b-fp32}
export RAGGUARD_EXECUTION_PROVIDER=${RAGGUARD_EXECUTION_PROVIDER:-webgpu}
export RAGGUARD_DECODER=${RAGGUARD_DECODER:-models/decoder}
export BENCH_DECODER=${BENCH_DECODER:-$RAGGUARD_DECODER}
tsx() { sh scripts/tuned.sh node_modules/.bin/tsx "$@"; }
. scripts/gpu/steps.sh

nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv >> "$log" 2>&1

if has build; then
  record build python3 scripts/gpu/build_qwen2_05b.py --out "$big"
fi
if has build32; then
  record build32 python3 scripts/gpu/build_qwen2_05b.py --dtype float32 --out "$big32"
fi

if has server; then
  server_check() {
    PORT=8091 RAGGUARD_INDEX_DIR=/tmp/ragguard-gpu-index tsx src/cli/serve.ts > "$out/.server" 2>&1 &
    local pid=$!
    wait_healthy 8091 "$pid"
    node -e '
      const base = "http://127.0.0.1:8091";
      (async () => {
        const health = await (await fetch(base + "/healthz")).json();
        const t0 = performance.now();
        const q = await fetch(base + "/query", { method: "POST", headers: { "content-type": "application/json" },
          body: JSON.stringify({ query: "What is the sticky bit used for on /tmp?", max_new_tokens: 32 }) });
        const answer = await q.json();
        const ms = performance.now() - t0;
        const mem = await (await fetch(base + "/debug/memory")).json();
        console.log(JSON.stringify(mem, null, 1));
        console.log(JSON.stringify({ providers: health.providers, status: q.status, answer: answer.answer, query_ms: Math.round(ms),
          timings_ms: answer.timings_ms, guard: answer.guard, gpu: mem.gpu, gpu_unavailable_reason: mem.gpu_unavailable_reason,
          budget: mem.budget, calibration: mem.memory_model.calibration, allocator_tuned: mem.memory_model.allocator_tuned }));
      })().catch((e) => { console.log(JSON.stringify({ error: String(e) })); process.exitCode = 1; });'
    local rc=$?
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    echo "--- server log"; cat "$out/.server"
    return $rc
  }
  record server server_check
fi

if has peer; then
  peer() { BENCH_PEER_MODEL="$big" tsx bench/peer.ts; }
  record peer peer
fi
if has peer32; then
  peer32() { BENCH_PEER_MODEL="$big32" BENCH_PEER_DTYPE=fp32 tsx bench/peer.ts; }
  record peer32 peer32
fi
if has throughput; then
  record throughput tsx bench/throughput.ts
fi
if has guard; then
  # WebGPU's buffer cache off, so that a run's buffers are freed when it ends and NVML sees its peak.
  guard() { RAGGUARD_WEBGPU_BUFFER_CACHE=${RAGGUARD_WEBGPU_BUFFER_CACHE:-disabled} tsx bench/guard.ts; }
  record guard guard
fi
if has guard32; then
  # The same mix on the 0.5B float32 decoder (build32): runs large enough for NVML to see, where the
  # shipped models' buffers all come from the WebGPU provider's pooled device memory. Budget and KV
  # pool scaled to it; fewer requests, to fit a device call.
  guard32() {
    RAGGUARD_DECODER="$big32" RAGGUARD_WEBGPU_BUFFER_CACHE=${RAGGUARD_WEBGPU_BUFFER_CACHE:-disabled} \
      BENCH_GUARD_WORKSPACE_MB=${BENCH_GUARD_WORKSPACE_MB:-3072} BENCH_GUARD_KV_MB=${BENCH_GUARD_KV_MB:-1024} \
      BENCH_GUARD_ALONE=${BENCH_GUARD_ALONE:-12} BENCH_GUARD_BURSTS=${BENCH_GUARD_BURSTS:-2} BENCH_GUARD_BURST=${BENCH_GUARD_BURST:-16} \
      tsx bench/guard.ts
  }
  record guard32 guard32
fi
if has kv; then
  record kv tsx bench/kv.ts
fi
rm -f "$out/.step" "$out/.server"
