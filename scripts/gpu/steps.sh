# Sourced by the GPU run scripts (run.sh, run-cuda.sh): STEPS selection and step recording. Expects
# $steps, $log (the whole output) and $results (each step's last JSON line as {"step", "rc", "seconds", "result"}).
has() { [[ " $steps " == *" $1 "* ]]; }
record() {
  local name=$1; shift
  echo "=== $name: $*" >> "$log"
  local t0=$SECONDS
  "$@" > "$out/.step" 2>&1
  local rc=$?
  cat "$out/.step" >> "$log"
  local last
  last=$(grep '^{' "$out/.step" | tail -n 1)
  echo "{\"step\":\"$name\",\"rc\":$rc,\"seconds\":$((SECONDS - t0)),\"result\":${last:-null}}" >> "$results"
  echo "$name: rc=$rc in $((SECONDS - t0)) s ${last:0:${RECORD_SHOW:-400}}"
}
# Waits (up to 5 minutes) until the server on port $1 answers /healthz, or its process ($2) has ended.
wait_healthy() {
  local port=$1 pid=$2
  for _ in $(seq 600); do
    kill -0 "$pid" 2>/dev/null || return 1
    node -e "fetch('http://127.0.0.1:$port/healthz').then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))" && return 0
    sleep 0.5
  done
  return 1
}
