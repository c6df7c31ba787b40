#!/usr/bin/env bash
# Compiles every CUDA source of the native backend (src/backends/cuda/*.cu) for Hopper (sm_90) without a
# GPU: a change that breaks the native build fails here (npm test: test/cuda-compile.test.ts) instead of
# on the next GPU run. nvcc, the CUDA headers and cuBLAS's headers come from PyPI wheels pinned by
# version and sha256 (scripts/cuda/toolkit-requirements.txt), unpacked once a machine into
# ${XDG_CACHE_HOME:-~/.cache}/ragguard/cuda-toolkit, as Go's build cache is kept, so that every clone (CI's
# fresh ones included) finds it and the test fetches nothing from the network after the first time (keyed by
# the requirements file's hash, so a new pin unpacks anew; .cache/cuda-toolkit in the clone where the home
# directory is not writable). Compile only (-c): ptxas runs (register and shared-memory limits are checked),
# nothing is linked.
#
# Exit codes: 0 compiled; 1 a source failed to compile; 3 the toolkit could not be fetched (no PyPI, or a
# download that stalled: pip gives up after its timeouts, the whole fetch after 7 minutes, so that the
# test's own 10-minute limit is never what ends it).
# RAGGUARD_NVCC=<nvcc> uses an installed toolkit instead of the wheels (the GPU host's /usr/local/cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
req=scripts/cuda/toolkit-requirements.txt
key=$(sha256sum "$req" | cut -c1-16)
. scripts/lib/machine-cache.sh
cache=$(machine_cache cuda-toolkit .cache/cuda-toolkit)
root=$cache/$key
nvcc=${RAGGUARD_NVCC:-}
if [[ -z $nvcc ]]; then
  nvcc=$root/nvidia/cu13/bin/nvcc
  # One fetch at a time a machine: two clones' checks at once wait for the first's unpacking.
  exec 9>"$cache/.lock"
  flock 9
  if [[ ! -f $root/.complete ]]; then
    echo "[cuda-check] fetching the pinned CUDA 13.0 compiler wheels (once a machine; cached in $root)"
    rm -rf "$root" && mkdir -p "$root/wheels"
    if ! timeout 420 python3 -m pip download --quiet --no-deps --only-binary=:all: --require-hashes --timeout 30 --retries 3 \
        -r "$req" -d "$root/wheels" 2>"$root/pip.err"; then
      cat "$root/pip.err" >&2
      echo "[cuda-check] cannot fetch the CUDA toolkit wheels from PyPI (see above; a download still unfinished after 7 minutes is stopped)" >&2
      rm -rf "$root"
      exit 3
    fi
    for w in "$root"/wheels/*.whl; do
      # cuBLAS's wheel is mostly its libraries (~0.6 GB): only headers, the compiler and NVVM are needed.
      python3 - "$w" "$root" <<'PY'
import sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    for m in z.infolist():
        n = m.filename
        if n.startswith(('nvidia/cu13/include/', 'nvidia/cu13/bin/', 'nvidia/cu13/nvvm/')):
            z.extract(m, dest)
            if n.startswith(('nvidia/cu13/bin/', 'nvidia/cu13/nvvm/bin/')):
                import os
                os.chmod(os.path.join(dest, n), 0o755)
PY
    done
    rm -rf "$root/wheels" "$root/pip.err"
    touch "$root/.complete"
  fi
  exec 9>&-
fi
inc=()
[[ -z ${RAGGUARD_NVCC:-} ]] && inc=(-I"$root/nvidia/cu13/include")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
srcs=(src/backends/cuda/*.cu)
echo "[cuda-check] $("$nvcc" --version | tail -2 | head -1): ${srcs[*]} (sm_90, compile only)"
fails=0
pids=()
for s in "${srcs[@]}"; do
  # One compile per source, two at a time at most (the machines this runs on have few cores).
  ( "$nvcc" -std=c++17 -O3 -gencode arch=compute_90,code=sm_90 -Xcompiler -Wall,-fPIC "${inc[@]}" \
      -c -o "$out/$(basename "$s").o" "$s" 2>&1 | sed "s|^|[$(basename "$s")] |"; exit "${PIPESTATUS[0]}" ) &
  pids+=($!)
  if (( ${#pids[@]} >= 2 )); then wait "${pids[0]}" || fails=$((fails + 1)); pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || fails=$((fails + 1)); done
if (( fails > 0 )); then
  echo "[cuda-check] FAILED: $fails of ${#srcs[@]} sources did not compile" >&2
  exit 1
fi
echo "[cuda-check] ok: ${#srcs[@]} sources compiled for sm_90"
