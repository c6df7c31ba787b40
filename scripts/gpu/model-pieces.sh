#!/bin/bash
# Carries a file larger than one device call (64 MiB with the tree) to the GPU host in pieces, one a call:
#   here:      scripts/gpu/model-pieces.sh split FILE     -> .gpu-cuda/pieces/all/part-NN (35 MiB each) + FILE's sha256
#   each call: scripts/gpu/model-pieces.sh stage N        -> .gpu-cuda/pieces/carry/ holds part N alone; carry
#              [".gpu-cuda/pieces/carry"] and run there: scripts/gpu/model-pieces.sh append DEST
#   there:     append adds the carried part to DEST (parts in order: 0, 1, ...); after the last it checks
#              DEST's sha256 (printed by split, carried with every part) and says so.
# Or, so that no step runs here between two calls (the host keeps /tmp only 30 s idle):
#   here:      scripts/gpu/model-pieces.sh stage-all  -> .gpu-pieces/NN/ (part N, its index, the sha256)
#   call N:    carry [".gpu-pieces/NN"]; bash scripts/gpu/model-pieces.sh append DEST .gpu-pieces/NN
# For the default decoder (models/pretrained/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf, 486 MB: 14 calls),
# which run-gguf.sh's rag step serves from DEST=/tmp/rg-default.gguf while the machine stays warm.
set -euo pipefail
cd "$(dirname "$0")/../.."
case ${1:-} in
  split)
    rm -rf .gpu-cuda/pieces/all && mkdir -p .gpu-cuda/pieces/all
    split -b 35M -d -a 2 "$2" .gpu-cuda/pieces/all/part-
    sha256sum "$2" | cut -d' ' -f1 > .gpu-cuda/pieces/all/sha256
    ls .gpu-cuda/pieces/all | grep -c part- | xargs echo "parts:" ;;
  stage)
    rm -rf .gpu-cuda/pieces/carry && mkdir -p .gpu-cuda/pieces/carry
    part=$(printf 'part-%02d' "$2")
    [[ -f .gpu-cuda/pieces/all/$part ]] || { echo "no $part" >&2; exit 1; }
    cp .gpu-cuda/pieces/all/"$part" .gpu-cuda/pieces/all/sha256 .gpu-cuda/pieces/carry/
    echo "$2 $(ls .gpu-cuda/pieces/all | grep -c part-)" > .gpu-cuda/pieces/carry/index ;;
  stage-all)
    rm -rf .gpu-pieces
    grep -qx '/.gpu-pieces/' .git/info/exclude 2>/dev/null || echo '/.gpu-pieces/' >> .git/info/exclude
    total=$(ls .gpu-cuda/pieces/all | grep -c part-)
    for ((n = 0; n < total; n++)); do
      d=.gpu-pieces/$(printf '%02d' "$n")
      mkdir -p "$d"
      ln .gpu-cuda/pieces/all/"$(printf 'part-%02d' "$n")" "$d/" 2>/dev/null || cp .gpu-cuda/pieces/all/"$(printf 'part-%02d' "$n")" "$d/"
      cp .gpu-cuda/pieces/all/sha256 "$d/"
      echo "$n $total" > "$d/index"
    done
    echo "staged: $total" ;;
  append)
    dest=$2
    src=${3:-.gpu-cuda/pieces/carry}
    read -r n total < "$src/index"
    [[ $n -eq 0 ]] && rm -f "$dest"
    have=$(cat "$dest.parts" 2>/dev/null || echo 0)
    [[ $n -eq 0 || $have -eq $n ]] || { echo "{\"error\":\"part $n arrived after $have parts\"}"; exit 1; }
    cat "$src"/part-* >> "$dest"
    echo $((n + 1)) > "$dest.parts"
    if [[ $((n + 1)) -eq $total ]]; then
      ok=$([[ $(sha256sum "$dest" | cut -d' ' -f1) == $(cat "$src/sha256") ]] && echo true || echo false)
      echo "{\"file\":\"$dest\",\"parts\":$total,\"sha256_ok\":$ok}"
    else
      echo "{\"file\":\"$dest\",\"parts\":$((n + 1)),\"of\":$total}"
    fi ;;
  *) echo "usage: model-pieces.sh split FILE | stage N | stage-all | append DEST [DIR]" >&2; exit 2 ;;
esac
