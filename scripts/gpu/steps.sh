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
