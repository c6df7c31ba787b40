#!/usr/bin/env bash
# The whole set on one machine: PostgreSQL with pgvector (scripts/postgres.sh), N ragguard replicas on it
# (each its own port, RAGGUARD_STORE pointing at that Postgres) and HAProxy in front, hashing a prefix key
# so that requests with the same prompt prefix reach the replica whose prefix cache holds it.
#
#   scripts/cluster.sh start [--replicas N] [--policy prefix|roundrobin] [--balance-factor PCT] [--port P] [--dir DIR]
#       prints the router's URL last on stdout; DIR (default .cache/cluster) holds the logs, pids, ports
#       and haproxy.cfg. RAGGUARD_STORE=postgres://... in the environment: that Postgres is used and no
#       embedded one is started. Every other RAGGUARD_* variable of the environment reaches the replicas.
#   scripts/cluster.sh router [--policy P] [--balance-factor PCT] [--dir DIR]  restart the router alone with another policy
#   scripts/cluster.sh replica I [--dir DIR]   (re)start replica I (1-based) on its port, wait for /readyz
#   scripts/cluster.sh status [--dir DIR]      the router's view of each replica (UP/DOWN, requests sent)
#   scripts/cluster.sh stop [--dir DIR]        stop the router, the replicas (SIGTERM: they drain) and the
#                                              embedded Postgres, remove DIR
#
# The router (HAProxy, Debian package `haproxy`; apt-get install haproxy):
#   prefix      balance hash on the header x-ragguard-prefix-key (the key POST /v1/route-key gives: the
#               prompt's KV block chain through its first user message), else x-prefix-key (the client's
#               own: a conversation or tenant id), else on the body's first 256 bytes (a /query's question,
#               a chat's system prompt and first messages); consistent hashing
#               so that a replica going away moves only its own share of keys, with bounded load: no replica
#               takes more than --balance-factor percent (default 150) of the average number of
#               requests in flight; past it a key goes to the next replica on the ring (HAProxy's
#               hash-balance-factor), so chats sharing one long system prompt do not all queue on one replica
#   roundrobin  for comparison
#   Health: GET /readyz every second; two failures mark a replica DOWN (about 2 s after it dies), two
#   successes take it back. A request whose connection is refused is retried on another replica; when no
#   replica is up the router answers 503 with Retry-After: 1 (its errors carry ragguard's JSON error shape). A stats page (CSV) on 127.0.0.1 at the port in
#   DIR/stats_port: /stats;csv.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
die() { printf '[cluster] ERROR: %s\n' "$*" >&2; exit 1; }
log() { printf '[cluster] %s\n' "$*" >&2; }
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

cmd="${1:-}"; shift || true
DIR="$ROOT/.cache/cluster"; REPLICAS=3; POLICY=prefix; PORT=""; INDEX=""; HASH_BALANCE_FACTOR=150
while [[ $# -gt 0 ]]; do
  case "$1" in
    --replicas) REPLICAS="$2"; shift 2 ;;
    --policy) POLICY="$2"; shift 2 ;;
    --balance-factor) HASH_BALANCE_FACTOR="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --dir) DIR="$2"; shift 2 ;;
    [0-9]*) INDEX="$1"; shift ;;
    *) die "unknown argument $1" ;;
  esac
done
[[ "$REPLICAS" =~ ^[1-9][0-9]*$ ]] || die "--replicas takes a positive number"
[[ "$POLICY" == prefix || "$POLICY" == roundrobin ]] || die "--policy is prefix or roundrobin"
[[ "$HASH_BALANCE_FACTOR" =~ ^[0-9]+$ ]] && (( HASH_BALANCE_FACTOR == 0 || HASH_BALANCE_FACTOR >= 100 )) \
  || die "--balance-factor is 0 (unbounded) or a percentage of at least 100"

# alive PID: the process runs (a killed replica is a zombie until whoever adopted it reaps it: dead).
alive() {
  kill -0 "$1" 2>/dev/null && [[ "$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null)" != Z ]]
}

# wait_ready PORT PID: until GET /readyz answers 200 (a replica loads its models, then reads the store).
wait_ready() {
  local port="$1" pid="$2"
  for _ in $(seq 1 1200); do
    alive "$pid" || return 1
    [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/readyz" || true)" == 200 ]] && return 0
    sleep 0.5
  done
  return 1
}

# start_replica I: runs replica I on the port in DIR/replica-I/port, as its own process group (setsid), so
# stop reaches the server and not only a wrapper. The server is node itself (tuned.sh execs it): its pid
# is the one a kill -9 drill kills.
start_replica() {
  local i="$1" rd="$DIR/replica-$1"
  local port; port="$(cat "$rd/port")"
  mkdir -p "$rd/index"
  PORT="$port" HOST=127.0.0.1 RAGGUARD_STORE="$(cat "$DIR/store")" RAGGUARD_INDEX_DIR="$rd/index" \
    setsid sh scripts/tuned.sh node --import tsx src/cli/serve.ts >>"$rd/log" 2>&1 </dev/null &
  echo $! >"$rd/pid"
}

# wait_routed: until the router's health checks have every replica fully UP (not "UP 1/2", a transition).
wait_routed() {
  local states
  for _ in $(seq 1 300); do
    states="$(curl -s "http://127.0.0.1:$STATS_PORT/stats;csv" | awk -F, '$1 == "replicas" && $2 != "BACKEND" { print $18 }' || true)"
    [[ -n "$states" ]] && ! grep -qv '^UP$' <<<"$states" && return 0
    sleep 0.2
  done
  log "the router does not see every replica UP: $(tr '\n' ' ' <<<"$states")"
  return 1
}

haproxy_cfg() {
  local balance
  if [[ "$POLICY" == prefix ]]; then
    balance="balance hash var(txn.prefix_key)
  hash-type consistent
  hash-balance-factor $HASH_BALANCE_FACTOR"
    # 0: HAProxy's default, unbounded (the line is left out).
    (( HASH_BALANCE_FACTOR > 0 )) || balance="${balance%$'\n'*}"
    balance+='
  http-request set-var(txn.prefix_key) req.hdr(x-ragguard-prefix-key) if { req.hdr(x-ragguard-prefix-key) -m found }
  http-request set-var(txn.prefix_key) req.hdr(x-prefix-key) if !{ var(txn.prefix_key) -m found } { req.hdr(x-prefix-key) -m found }
  http-request set-var(txn.prefix_key) req.body,bytes(0,256) unless { var(txn.prefix_key) -m found }'
  else
    balance='balance roundrobin'
  fi
  cat <<EOF
global
  maxconn 2000
  pidfile $DIR/haproxy.pid

defaults
  mode http
  timeout connect 2s
  timeout client 600s
  timeout server 600s
  timeout http-request 60s
  timeout queue 30s
  # A refused connection (the replica died) is retried on another replica; a request the replica took is not
  # replayed (it may have run: an ingest's client retries it itself, PUT /documents/:id is idempotent).
  retries 2
  retry-on conn-failure
  option redispatch 1
  # On a reload (haproxy -sf) the old process keeps its idle keep-alive connections until their next
  # request, answered with Connection: close, instead of closing them under a client that is sending one.
  option idle-close-on-response
  # The router's own errors in ragguard's shape ({error: {code, message}}), retryable, not HAProxy's HTML pages.
  http-error status 502 content-type application/json string "{\\"error\\":{\\"code\\":\\"bad_gateway\\",\\"message\\":\\"the replica failed before it answered (retry)\\"}}" hdr retry-after 1
  http-error status 503 content-type application/json string "{\\"error\\":{\\"code\\":\\"no_replica\\",\\"message\\":\\"no replica is ready (retry)\\"}}" hdr retry-after 1
  http-error status 504 content-type application/json string "{\\"error\\":{\\"code\\":\\"gateway_timeout\\",\\"message\\":\\"the replica did not answer in time (retry)\\"}}" hdr retry-after 1

frontend ragguard
  bind 127.0.0.1:$ROUTER_PORT
  option http-buffer-request
  default_backend replicas
  http-after-response set-header Retry-After 1 if { status 502:504 } !{ res.hdr(retry-after) -m found }

backend replicas
  $balance
  option httpchk GET /readyz
  http-check expect status 200
  # Which replica answered (a client or a test attributes prefix-cache hits to it).
  http-response set-header x-ragguard-replica %[srv_name]
  default-server inter 1s fastinter 500ms downinter 1s fall 2 rise 2
$(for i in $(seq 1 "$REPLICAS"); do echo "  server r$i 127.0.0.1:$(cat "$DIR/replica-$i/port") check"; done)

frontend stats
  bind 127.0.0.1:$STATS_PORT
  stats enable
  stats uri /stats
  stats refresh 1s
EOF
}

case "$cmd" in
  start)
    command -v haproxy >/dev/null || die "haproxy not found: apt-get install haproxy"
    [[ -e "$DIR/store" ]] && die "a cluster runs in $DIR already (scripts/cluster.sh stop --dir $DIR)"
    # A start that fails part way stops what it started.
    trap 'status=$?; if [[ $status -ne 0 ]]; then log "start failed: stopping what was started"; bash "$ROOT/scripts/cluster.sh" stop --dir "$DIR" || true; fi' EXIT
    mkdir -p "$DIR"
    chmod 755 "$DIR" # the embedded Postgres runs as another user when started as root
    echo "$REPLICAS" >"$DIR/replicas"
    if [[ "${RAGGUARD_STORE:-}" == postgres://* || "${RAGGUARD_STORE:-}" == postgresql://* ]]; then
      echo "$RAGGUARD_STORE" >"$DIR/store"
      log "using the PostgreSQL in RAGGUARD_STORE"
    else
      bash scripts/postgres.sh start "$DIR/pg" >"$DIR/store"
    fi
    for i in $(seq 1 "$REPLICAS"); do mkdir -p "$DIR/replica-$i"; free_port >"$DIR/replica-$i/port"; done
    # The first replica creates the schema (and ingests RAGGUARD_CORPUS_DIR when the store is empty); the
    # others start once it is ready, so they never race on CREATE.
    for i in $(seq 1 "$REPLICAS"); do
      start_replica "$i"
      if [[ "$i" == 1 ]]; then
        wait_ready "$(cat "$DIR/replica-1/port")" "$(cat "$DIR/replica-1/pid")" || { tail -30 "$DIR/replica-1/log" >&2; die "replica 1 did not become ready"; }
      fi
    done
    for i in $(seq 2 "$REPLICAS"); do
      wait_ready "$(cat "$DIR/replica-$i/port")" "$(cat "$DIR/replica-$i/pid")" || { tail -30 "$DIR/replica-$i/log" >&2; die "replica $i did not become ready"; }
    done
    ROUTER_PORT="${PORT:-$(free_port)}"; STATS_PORT="$(free_port)"
    echo "$ROUTER_PORT" >"$DIR/router_port"; echo "$STATS_PORT" >"$DIR/stats_port"
    haproxy_cfg >"$DIR/haproxy.cfg"
    haproxy -q -c -f "$DIR/haproxy.cfg" >/dev/null || die "haproxy rejects $DIR/haproxy.cfg"
    haproxy -D -f "$DIR/haproxy.cfg" || die "haproxy did not start"
    wait_routed || die "the router's health checks fail"
    log "$REPLICAS replicas on $(sed 's/\/\/.*@/\/\/…@/' "$DIR/store"), HAProxy ($POLICY) on 127.0.0.1:$ROUTER_PORT, stats on 127.0.0.1:$STATS_PORT/stats"
    trap - EXIT
    echo "http://127.0.0.1:$ROUTER_PORT"
    ;;
  router)
    # Restart the router alone (another --policy): the replicas and their caches stay.
    [[ -f "$DIR/router_port" ]] || die "no cluster in $DIR"
    REPLICAS="$(cat "$DIR/replicas")"; ROUTER_PORT="$(cat "$DIR/router_port")"; STATS_PORT="$(cat "$DIR/stats_port")"
    haproxy_cfg >"$DIR/haproxy.cfg"
    haproxy -q -c -f "$DIR/haproxy.cfg" >/dev/null || die "haproxy rejects $DIR/haproxy.cfg"
    if [[ -f "$DIR/haproxy.pid" ]]; then
      old="$(cat "$DIR/haproxy.pid")"
      kill "$old" 2>/dev/null || true
      for _ in $(seq 1 40); do alive "$old" || break; sleep 0.25; done
    fi
    haproxy -D -f "$DIR/haproxy.cfg" || die "haproxy did not start"
    wait_routed || die "the router's health checks fail"
    log "HAProxy ($POLICY) on 127.0.0.1:$ROUTER_PORT"
    echo "http://127.0.0.1:$ROUTER_PORT"
    ;;
  replica)
    [[ -n "$INDEX" && -d "$DIR/replica-$INDEX" ]] || die "usage: scripts/cluster.sh replica I (no replica $INDEX in $DIR)"
    pid="$(cat "$DIR/replica-$INDEX/pid")"
    alive "$pid" && die "replica $INDEX (pid $pid) still runs"
    start_replica "$INDEX"
    wait_ready "$(cat "$DIR/replica-$INDEX/port")" "$(cat "$DIR/replica-$INDEX/pid")" || die "replica $INDEX did not become ready"
    log "replica $INDEX ready on port $(cat "$DIR/replica-$INDEX/port")"
    ;;
  status)
    [[ -f "$DIR/stats_port" ]] || die "no cluster in $DIR"
    curl -s "http://127.0.0.1:$(cat "$DIR/stats_port")/stats;csv" | awk -F, '$1 == "replicas" && $2 != "BACKEND" { print $2, $18, "sent=" $8 }'
    ;;
  stop)
    [[ -d "$DIR" ]] || die "no cluster in $DIR"
    if [[ -f "$DIR/haproxy.pid" ]]; then kill "$(cat "$DIR/haproxy.pid")" 2>/dev/null || true; rm -f "$DIR/haproxy.pid"; fi
    for rd in "$DIR"/replica-*; do
      [[ -f "$rd/pid" ]] || continue
      pid="$(cat "$rd/pid")"
      kill -TERM "$pid" 2>/dev/null || continue
      for _ in $(seq 1 60); do alive "$pid" || break; sleep 0.5; done
      kill -KILL "$pid" 2>/dev/null || true
    done
    if [[ -d "$DIR/pg" ]]; then bash scripts/postgres.sh stop "$DIR/pg" || log "no Postgres to stop in $DIR/pg"; fi
    rm -rf "$DIR"
    log "stopped"
    ;;
  *)
    die "usage: scripts/cluster.sh start [--replicas N] [--policy prefix|roundrobin] [--balance-factor PCT] [--port P] [--dir DIR] | router [--policy P] [--balance-factor PCT] | replica I | status | stop"
    ;;
esac
