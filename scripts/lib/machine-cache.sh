# Sourced: `machine_cache <name> <fallback>` prints ${XDG_CACHE_HOME:-~/.cache}/ragguard/<name>, created: where a
# tool fetched or built once a machine is kept for every clone on it (as Go keeps its build cache), so that a
# fresh clone's tests (CI's) need no network for it; <fallback> (created) where the home directory is not writable.
machine_cache() {
  local dir=${XDG_CACHE_HOME:-$HOME/.cache}/ragguard/$1
  if mkdir -p "$dir" 2>/dev/null && [[ -w $dir ]]; then echo "$dir"; else mkdir -p "$2" && echo "$2"; fi
}
