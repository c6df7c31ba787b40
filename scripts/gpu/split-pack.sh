#!/bin/bash
# Splits .gpu/ (scripts/gpu/pack.sh) in two, because the working tree plus the whole pack no longer fit the
# 64 MiB one device call carries (the tree is ~22 MB since the real-export fixtures; the pack ~48 MB):
#   .gpu-base/  the Node binary, the BLAS libraries faiss needs and the Vulkan loaders (~28 MB); its enter.sh
#               unpacks them into /tmp/gpu-node and /, which the GPU host keeps while it stays warm (30 s).
#   .gpu/       node_modules (~22 MB) and an enter.sh that uses what .gpu-base unpacked.
# On the GPU host, two calls in a row (the second within 30 s of the first):
#   carry [".gpu-base"]: source .gpu-base/enter.sh
#   carry [".gpu"]:      source .gpu/enter.sh && <command>
# Where both fit with the tree (carry [".gpu-base", ".gpu"]), one call does: .gpu/enter.sh sources the base.
set -euo pipefail
cd "$(dirname "$0")/../.."
src=.gpu
base=.gpu-base
[[ -f $src/node.xz || -f $base/node.xz ]] || { echo "split-pack: run scripts/gpu/pack.sh first" >&2; exit 1; }
mkdir -p "$base"
grep -qx '/.gpu-base/' .git/info/exclude 2>/dev/null || echo '/.gpu-base/' >> .git/info/exclude
for f in node.xz lib.txz gl; do
  if [[ -e $src/$f ]]; then rm -rf "${base:?}/$f"; mv "$src/$f" "$base/$f"; fi
done
cat > "$base/enter.sh" <<'ENTER'
# Sourced on the GPU host (scripts/gpu/split-pack.sh): node, the BLAS libraries and the Vulkan loaders,
# unpacked where the host keeps them between calls while it stays warm.
_b=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for f in "$_b"/gl/*.deb; do dpkg -x "$f" /; done; ldconfig
mkdir -p /tmp/gpu-node/bin /tmp/gpu-node/lib
[[ -x /tmp/gpu-node/bin/node ]] || { xz -dc "$_b/node.xz" > /tmp/gpu-node/bin/node && chmod +x /tmp/gpu-node/bin/node; }
tar -xJf "$_b/lib.txz" -C /tmp/gpu-node/lib
touch /tmp/gpu-node/.base-ready
echo "gpu host: base unpacked (node $(/tmp/gpu-node/bin/node --version))"
ENTER
cat > "$src/enter.sh" <<'ENTER'
# Sourced on the GPU host (scripts/gpu/split-pack.sh): node_modules, on the base that .gpu-base unpacked
# (in this call where it was carried too, else in an earlier call while the host stayed warm).
_g=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ -f $_g/../.gpu-base/enter.sh ]] && source "$_g/../.gpu-base/enter.sh"
if [[ ! -f /tmp/gpu-node/.base-ready ]]; then
  echo "gpu host: node is not unpacked here: first a call carrying .gpu-base (source .gpu-base/enter.sh), then this one within 30 s" >&2
  return 1 2>/dev/null || exit 1
fi
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
export PATH=/tmp/gpu-node/bin:$PATH
[[ -d node_modules ]] || tar -xJf "$_g/node_modules.txz"
export LD_LIBRARY_PATH=/tmp/gpu-node/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "gpu host: node $(node --version), $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null)"
ENTER
chmod +x "$base/enter.sh" "$src/enter.sh"
du -sh "$base" "$src"
echo 'carry [".gpu-base"] and run: source .gpu-base/enter.sh; then within 30 s carry [".gpu"] and run: source .gpu/enter.sh && <command>'
