#!/bin/bash
# Packs .gpu-cuda/ for the CUDA backend's runs on the GPU host (scripts/gpu/run-cuda.sh): the Node binary
# and only the packages the CUDA path loads (tsx and esbuild, koffi, @huggingface/tokenizers), so that it
# and the working tree stay well under the 64 MiB a device call carries (the full .gpu/ of pack.sh holds
# onnxruntime-node and the server's packages). Carry ".gpu-cuda" and start with `source .gpu-cuda/enter.sh`.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.gpu-cuda
mkdir -p "$out"
node_bin=$(readlink -f "$(command -v node)")
if [[ -f .gpu/node.xz && ! $node_bin -nt .gpu/node.xz ]]; then
  cp .gpu/node.xz "$out/node.xz"
elif [[ ! -f $out/node.xz || $node_bin -nt $out/node.xz ]]; then
  xz -T2 -6 -c "$node_bin" > "$out/node.xz"
fi
tar -cJf "$out/modules.txz" node_modules/tsx node_modules/esbuild node_modules/@esbuild/linux-x64 node_modules/koffi \
  node_modules/@koromix/koffi-linux-x64 node_modules/@huggingface/tokenizers node_modules/@opentelemetry/api node_modules/.bin/tsx
cat > "$out/enter.sh" <<'ENTER'
# Sourced on the GPU host: node and the CUDA path's packages (scripts/gpu/pack-cuda.sh).
_g=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p /tmp/gpu-node/bin
[[ -x /tmp/gpu-node/bin/node ]] || { xz -dc "$_g/node.xz" > /tmp/gpu-node/bin/node && chmod +x /tmp/gpu-node/bin/node; }
export PATH=/tmp/gpu-node/bin:$PATH
[[ -d node_modules/tsx ]] || tar -xJf "$_g/modules.txz"
echo "gpu host: node $(node --version), $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null)"
ENTER
du -sh "$out"
