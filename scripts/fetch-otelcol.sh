#!/usr/bin/env bash
# Builds the OpenTelemetry Collector that the trace test sends ragguard's spans to (test/tracing.test.ts,
# docs/observability.md) from the Go module proxy into .cache/otelcol, in a folder named by the collector's
# release and the hash of scripts/otelcol/go.sum, so that a pin change builds anew and an unchanged pin costs
# nothing:
#
#   otelcol   scripts/otelcol (main.go, go.mod, go.sum): the collector as its builder (ocb) would generate it for
#             the OTLP receiver, the batch processor, the debug exporter and the contrib file exporter; every
#             collector module pinned in go.mod at one release (core v0.165.0 / v1.71.0, contrib v0.165.1) and
#             checked against go.sum.
#
#   scripts/fetch-otelcol.sh          build it when missing; prints OTELCOL=<path>
#   scripts/fetch-otelcol.sh --check  exit 0 when it is there, 1 otherwise (builds nothing)
# Exit 3: the Go module proxy cannot be reached (the test skips then, saying so); any other failure 1.
#
# About a minute and a half on 2 cores the first time (a 55 MB static binary); Go's module and build caches
# make a rebuild from another clone a matter of seconds. Needs Go >= 1.26 (`go`, or /usr/local/go/bin/go).
set -euo pipefail

OTELCOL_VERSION=v0.165.0

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/scripts/otelcol"
PIN="$(cat "$SRC/go.mod" "$SRC/go.sum" "$SRC/main.go" | sha256sum | cut -c1-12)"
DIR="$ROOT/.cache/otelcol/otelcol-$OTELCOL_VERSION-$PIN"
OTELCOL="$DIR/otelcol"
log() { printf '[otelcol] %s\n' "$*" >&2; }
die() { printf '[otelcol] ERROR: %s\n' "$*" >&2; exit 1; }

if [[ "${1:-}" == --check ]]; then [[ -x "$OTELCOL" ]] && exit 0; exit 1; fi

if [[ ! -x "$OTELCOL" ]]; then
  GO="$(command -v go || true)"
  [[ -z "$GO" && -x /usr/local/go/bin/go ]] && GO=/usr/local/go/bin/go
  [[ -n "$GO" ]] || die "Go not found (apt-get install golang-go, or a Go toolchain in /usr/local/go)"
  # The machine's toolchain as it is (no toolchain download); go.mod and go.sum as committed (-mod=readonly).
  export GOTOOLCHAIN=local GOFLAGS="-buildvcs=false -mod=readonly" CGO_ENABLED=0
  cd "$SRC"
  # The modules first: exit 3 when the proxy cannot be reached, so that a caller can tell "no network" from
  # "does not build".
  if ! out="$("$GO" mod download go.opentelemetry.io/collector/otelcol 2>&1)"; then
    printf '%s\n' "$out" >&2
    if grep -qiE 'dial tcp|no such host|connection refused|i/o timeout|network is unreachable|TLS handshake|proxyconnect' <<<"$out"; then
      log "the Go module proxy ($("$GO" env GOPROXY)) cannot be reached"
      exit 3
    fi
    die "go mod download failed"
  fi
  log "building the collector $OTELCOL_VERSION ($("$GO" version | cut -d' ' -f3); a minute or two the first time)"
  mkdir -p "$ROOT/.cache/otelcol"
  rm -rf "$DIR.tmp"
  "$GO" build -trimpath -o "$DIR.tmp/otelcol" . || die "could not build the collector (scripts/otelcol)"
  rm -rf "$DIR"; mv "$DIR.tmp" "$DIR"
  # Older pins' builds are dead weight.
  find "$ROOT/.cache/otelcol" -mindepth 1 -maxdepth 1 -type d ! -path "$DIR" -exec rm -rf {} +
fi
echo "OTELCOL=$OTELCOL"
