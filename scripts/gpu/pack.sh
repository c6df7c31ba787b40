#!/bin/bash
# Packs .gpu/ for the GPU host (../shared/gpu/pack.sh), leaving out of node_modules what Node never
# loads there, so that .gpu plus the working tree stay under the 64 MiB a device call carries:
#   onnxruntime-web and its dependencies (transformers.js bundles the parts it uses into its Node build),
#   transformers.js's sources, typings and browser builds, and sharp's native image library (replaced
#   by a stub that throws: bench:peer passes token ids, never images).
# The packages are moved aside for the pack and put back afterwards, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/../.."
shared=${RAGGUARD_SHARED_PACK:-../shared/gpu/pack.sh}
aside=$(mktemp -d /tmp/ragguard-pack-aside.XXXXXX)
leave=(onnxruntime-web protobufjs @protobufjs long flatbuffers guid-typescript platform
  @huggingface/transformers/src @huggingface/transformers/types sharp @img node-llama-cpp @node-llama-cpp
  playwright-core openai typescript @types simple-git @kwsites ipull lowdb cmake-js supertest superagent formidable)
moved=()
restore() {
  rm -rf node_modules/sharp.stub-in-place
  if [[ -d node_modules/sharp && -f node_modules/sharp/.ragguard-stub ]]; then rm -rf node_modules/sharp; fi
  for p in "${moved[@]}"; do mkdir -p "node_modules/$(dirname "$p")"; mv "$aside/$p" "node_modules/$p"; done
  for f in "$aside"/dist/*; do [[ -e $f ]] && mv "$f" node_modules/@huggingface/transformers/dist/; done
  rm -rf "$aside"
}
trap restore EXIT
for p in "${leave[@]}"; do
  [[ -e node_modules/$p ]] || continue
  mkdir -p "$aside/$(dirname "$p")"
  mv "node_modules/$p" "$aside/$p"
  moved+=("$p")
done
mkdir -p "$aside/dist"
for f in node_modules/@huggingface/transformers/dist/*; do
  case $(basename "$f") in transformers.node.mjs|transformers.node.cjs) ;; *) mv "$f" "$aside/dist/" ;; esac
done
mkdir -p node_modules/sharp
echo '{"name":"sharp","version":"0.0.0-stub","main":"index.js"}' > node_modules/sharp/package.json
echo "module.exports = function sharp() { throw new Error('sharp is not packed for the GPU host'); };" > node_modules/sharp/index.js
touch node_modules/sharp/.ragguard-stub
bash "$shared"
# The tree and the whole pack no longer fit one call: the base (node, libraries) goes apart.
bash scripts/gpu/split-pack.sh
