#!/usr/bin/env bash
# Builds the pinned Kubernetes tools the chart's check needs (test/deploy.test.ts, docs/deploy.md) from the Go
# module proxy into ${XDG_CACHE_HOME:-~/.cache}/ragguard/k8s-tools (.cache/k8s-tools in the clone where the home
# directory is not writable), each in a folder named by its version so that a pin change builds anew and an
# unchanged pin costs nothing. Kept once a machine, not once a clone: `go install pkg@version` asks the proxy
# about the module's deprecation on every build, so a fresh clone would need the network in its tests.
#
#   helm         helm.sh/helm/v3/cmd/helm                  (renders the chart: helm template, helm lint)
#   kubeconform  github.com/yannh/kubeconform/cmd/kubeconform (validates what helm renders against schemas)
#   schemas      the Kubernetes OpenAPI document (api/openapi-spec/swagger.json of the module k8s.io/kubernetes,
#                fetched with `go mod download`, an 18 MB zip once) turned into kubeconform's standalone strict JSON
#                schemas by scripts/k8s-schemas.py: kubeconform's default location is on GitHub, not reachable
#                here or in CI.
#
#   scripts/fetch-k8s-tools.sh          build what is missing; prints KEY=VALUE lines (HELM, KUBECONFORM, SCHEMAS,
#                                       KUBERNETES_VERSION)
#   scripts/fetch-k8s-tools.sh --check  exit 0 when all three are there, 1 otherwise (builds nothing)
# Exit 3: the Go module proxy cannot be reached (test/deploy.test.ts skips then, saying so); any other failure 1.
#
# A helm build from source takes minutes on 2 cores the first time; Go's build cache (GOCACHE, by default in the
# home directory) makes later builds, from another clone too, a matter of seconds.
# Needs Go >= 1.24 (`go`, or /usr/local/go/bin/go) and the Go module proxy; nothing else.
set -euo pipefail

HELM_VERSION=v3.21.4
KUBECONFORM_VERSION=v0.7.0
# The Kubernetes release whose API the chart is checked against (k8s.io/kubernetes is tagged v1.x.y).
KUBERNETES_VERSION=v1.34.2

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/lib/machine-cache.sh"
TOOLS=$(machine_cache k8s-tools "$ROOT/.cache/k8s-tools")
HELM="$TOOLS/helm-$HELM_VERSION/helm"
KUBECONFORM="$TOOLS/kubeconform-$KUBECONFORM_VERSION/kubeconform"
SCHEMAS="$TOOLS/schemas-$KUBERNETES_VERSION"
log() { printf '[k8s-tools] %s\n' "$*" >&2; }
die() { printf '[k8s-tools] ERROR: %s\n' "$*" >&2; exit 1; }

have_all() { [[ -x "$HELM" && -x "$KUBECONFORM" && -f "$SCHEMAS/.complete" ]]; }
if [[ "${1:-}" == --check ]]; then have_all && exit 0; exit 1; fi

if ! have_all; then
  # One build at a time a machine: a second clone's check waits for the first, then finds the tools (below).
  exec 9>"$TOOLS/.lock"
  flock 9
fi
if ! have_all; then
  GO="$(command -v go || true)"
  [[ -z "$GO" && -x /usr/local/go/bin/go ]] && GO=/usr/local/go/bin/go
  [[ -n "$GO" ]] || die "Go not found (apt-get install golang-go, or a Go toolchain in /usr/local/go)"
  # Go's own module and build caches (content-addressed, safe to share): a fresh clone on a machine that built
  # the tools once relinks them in seconds instead of compiling helm again. The machine's toolchain as it is
  # (no toolchain download).
  export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0
  # Whether the Go module proxy answers (a module the builds need anyway): exit 3 when it cannot be reached, so
  # that a caller can tell "no network" from "does not build".
  if ! out="$("$GO" mod download -json "github.com/yannh/kubeconform@$KUBECONFORM_VERSION" 2>&1)"; then
    if grep -qiE 'dial tcp|no such host|connection refused|i/o timeout|network is unreachable|TLS handshake|proxyconnect' <<<"$out"; then
      printf '%s\n' "$out" >&2
      log "the Go module proxy ($("$GO" env GOPROXY)) cannot be reached"
      exit 3
    fi
    printf '%s\n' "$out" >&2
    die "go mod download github.com/yannh/kubeconform@$KUBECONFORM_VERSION failed"
  fi
  if [[ ! -x "$HELM" ]]; then
    log "building helm $HELM_VERSION ($("$GO" version | cut -d' ' -f3); minutes the first time)"
    GOBIN="$TOOLS/helm-$HELM_VERSION.tmp" "$GO" install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" || die "could not build helm $HELM_VERSION"
    rm -rf "$TOOLS/helm-$HELM_VERSION"; mv "$TOOLS/helm-$HELM_VERSION.tmp" "$TOOLS/helm-$HELM_VERSION"
  fi
  if [[ ! -x "$KUBECONFORM" ]]; then
    log "building kubeconform $KUBECONFORM_VERSION"
    GOBIN="$TOOLS/kubeconform-$KUBECONFORM_VERSION.tmp" "$GO" install "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION" \
      || die "could not build kubeconform $KUBECONFORM_VERSION"
    rm -rf "$TOOLS/kubeconform-$KUBECONFORM_VERSION"; mv "$TOOLS/kubeconform-$KUBECONFORM_VERSION.tmp" "$TOOLS/kubeconform-$KUBECONFORM_VERSION"
  fi
  if [[ ! -f "$SCHEMAS/.complete" ]]; then
    log "fetching the OpenAPI document of Kubernetes $KUBERNETES_VERSION (module k8s.io/kubernetes)"
    dir="$("$GO" mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')" \
      || die "could not download k8s.io/kubernetes@$KUBERNETES_VERSION"
    [[ -f "$dir/api/openapi-spec/swagger.json" ]] || die "no api/openapi-spec/swagger.json in $dir"
    rm -rf "$SCHEMAS.tmp"
    python3 "$ROOT/scripts/k8s-schemas.py" "$dir/api/openapi-spec/swagger.json" "$SCHEMAS.tmp" || die "could not convert the OpenAPI document"
    touch "$SCHEMAS.tmp/.complete"
    rm -rf "$SCHEMAS"; mv "$SCHEMAS.tmp" "$SCHEMAS"
  fi
fi
echo "HELM=$HELM"
echo "KUBECONFORM=$KUBECONFORM"
echo "SCHEMAS=$SCHEMAS"
# The version to render for (helm template --kube-version): a helm built with go install says v1.20 otherwise.
echo "KUBERNETES_VERSION=${KUBERNETES_VERSION#v}"
