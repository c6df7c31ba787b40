#!/usr/bin/env bash
# Build faiss-node's native addon from its npm sources against the system
# libfaiss (Debian 12 libfaiss-dev 1.7.3) with node-gyp. Never touches the
# network: faiss-node's own install script (prebuild download from GitHub,
# else git clone of faiss) is never run.
#
# Usage: scripts/build-faiss-node.sh [--force]
#   Without --force, does nothing when the addon exists and is newer than its
#   inputs (faiss.cc, binding.gyp, compat header, leak patch, libfaiss.a).
#
# faiss-node 0.5.1's faiss.cc leaks: toBuffer() never frees its IO writer (a whole copy of the index,
# every call), fromBuffer() never frees its IO reader (another copy), search() never frees the query's
# floats, and add/train/removeIds lose their buffers on an error path. The store serialises its index
# on every ingest, so a server ingesting every 30 s grew by three index copies a time (about 25 MiB a
# minute with the sample corpus' 4.4 MB index). scripts/faiss/faiss-node-leaks.patch frees them; the
# addon is built from a patched copy (ragguard-build/faiss.cc), the package's own source left as shipped.
#
# scripts/faiss/faiss-node-features.patch, applied after it, adds what the store needs beyond 0.5.1:
# add/search take Float32Array; search(x, k, { allow, efSearch, exact }) applies a bitmap of allowed
# positions inside the search (faiss::IDSelectorBitmap through SearchParameters / SearchParametersHNSW),
# sets an HNSW search's candidate list, or searches an HNSW index's flat storage exhaustively;
# reconstruct(positions), hnswParams()/setHnswParams(), memoryBytes() (vectors and HNSW links),
# Index.buildAsync(...) and toBufferAsync() (built and serialised on a worker thread); toBuffer() hands
# over the writer's bytes instead of copying them.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PKG="$ROOT/node_modules/faiss-node"
ADDON="$PKG/build/Release/faiss-node.node"
HELPERS="$ROOT/scripts/faiss"

log() { printf '[build-faiss-node] %s\n' "$*"; }
die() { printf '[build-faiss-node] ERROR: %s\n' "$*" >&2; exit 1; }

FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

[[ -f "$PKG/src/faiss.cc" ]] || die "$PKG/src/faiss.cc not found; run 'npm ci --ignore-scripts' first"
[[ -f /usr/include/faiss/Index.h ]] || die "faiss headers missing (/usr/include/faiss); install libfaiss-dev (apt-get install -y libfaiss-dev)"

LIBFAISS="$(ls /usr/lib/*/libfaiss.a /usr/lib/*/libfaiss.so /usr/lib/libfaiss.* 2>/dev/null | head -n1 || true)"
[[ -n "$LIBFAISS" ]] || die "libfaiss library not found; install libfaiss-dev"

# --- up-to-date check ------------------------------------------------------
if [[ $FORCE -eq 0 && -f "$ADDON" ]]; then
  stale=0
  for f in "$PKG/src/faiss.cc" "$HELPERS/binding.gyp" "$HELPERS/faiss_compat.h" "$HELPERS/faiss-node-leaks.patch" "$HELPERS/faiss-node-features.patch" "$LIBFAISS" "$ROOT/scripts/build-faiss-node.sh"; do
    if [[ "$f" -nt "$ADDON" ]]; then stale=1; log "stale: $f is newer than the addon"; fi
  done
  if [[ $stale -eq 0 ]]; then
    log "up to date: $ADDON"
    exit 0
  fi
fi

# --- locate node headers (no download) ---------------------------------------
NODE_BIN="$(command -v node)"
NODEDIR="${npm_config_nodedir:-}"
if [[ -z "$NODEDIR" || ! -f "$NODEDIR/include/node/common.gypi" ]]; then
  NODEDIR="$(cd "$(dirname "$(readlink -f "$NODE_BIN")")/.." && pwd)"
fi
[[ -f "$NODEDIR/include/node/common.gypi" && -f "$NODEDIR/include/node/node_api.h" ]] \
  || die "node headers not found under $NODEDIR/include/node (set npm_config_nodedir to the node install prefix)"

# --- locate node-gyp: the copy bundled with npm --------------------------------
NODE_GYP="${npm_config_node_gyp:-}"
if [[ -z "$NODE_GYP" || ! -f "$NODE_GYP" ]]; then
  NPM_CLI="$(readlink -f "$(command -v npm)")"
  NODE_GYP="$(cd "$(dirname "$NPM_CLI")/.." && pwd)/node_modules/node-gyp/bin/node-gyp.js"
fi
[[ -f "$NODE_GYP" ]] || die "node-gyp not found (looked at $NODE_GYP)"

for tool in python3 make g++; do
  command -v "$tool" >/dev/null || die "'$tool' not found; apt-get install -y python3 make g++"
done

# --- build -------------------------------------------------------------------
log "building faiss-node against $LIBFAISS"
log "node-gyp: $NODE_GYP ($(node "$NODE_GYP" --version)), nodedir: $NODEDIR"
mkdir -p "$PKG/ragguard-build"
# node_modules may be a hard-linked copy of another checkout's: remove before writing, never write through a link.
rm -f "$PKG/ragguard-build/faiss_compat.h" "$PKG/binding.gyp" "$PKG/ragguard-build/faiss.cc"
cp "$HELPERS/faiss_compat.h" "$PKG/ragguard-build/faiss_compat.h"
cp "$HELPERS/binding.gyp" "$PKG/binding.gyp"
cp "$PKG/src/faiss.cc" "$PKG/ragguard-build/faiss.cc"
for p in faiss-node-leaks.patch faiss-node-features.patch; do
  patch --quiet --forward --no-backup-if-mismatch "$PKG/ragguard-build/faiss.cc" "$HELPERS/$p" \
    || die "scripts/faiss/$p does not apply to $PKG/src/faiss.cc (another faiss-node version?)"
done

JOBS="$(nproc 2>/dev/null || echo 2)"
(
  cd "$PKG"
  node "$NODE_GYP" rebuild --release --nodedir="$NODEDIR" --jobs="$JOBS" --loglevel=warn
)

[[ -f "$ADDON" ]] || die "build finished but $ADDON is missing"
touch "$ADDON"

# smoke test: load it through faiss-node's own entry point (bindings)
( cd "$ROOT" && node -e "
const f = require('faiss-node');
const ix = new f.IndexFlatL2(2);
ix.add([0, 0, 1, 1]);
const r = ix.search([1, 1], 1);
if (r.labels[0] !== 1) throw new Error('unexpected search result ' + JSON.stringify(r));
const f2 = ix.search(new Float32Array([1, 1]), 1, { allow: new Uint8Array([1]) });
if (f2.labels[0] !== 0) throw new Error('the features patch is missing: ' + JSON.stringify(f2));
" ) || die "built addon fails to load or search"
log "built $ADDON"
