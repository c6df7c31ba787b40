# Sourced: `fetch_wheel <name> <version> <file> <sha256> <hint>` downloads one wheel from PyPI into
# $CACHE (.cache/pypi) unless a copy with that sha256 is there, and checks its sha256 either way; <hint>
# ends the error when PyPI cannot be reached. Expects die and log (each script's own prefix).
fetch_wheel() {
  local name=$1 version=$2 file=$3 sha=$4 hint=$5
  mkdir -p "$CACHE"
  if [[ -f "$CACHE/$file" ]] && echo "$sha  $CACHE/$file" | sha256sum -c --status; then
    log "$name==$version cached"
    return 0
  fi
  log "downloading $name==$version from PyPI"
  rm -f "$CACHE/$file"
  python3 -m pip download --no-deps --only-binary=:all: --disable-pip-version-check -q -d "$CACHE" "$name==$version" \
    || die "could not download $name==$version from PyPI ($hint)"
  [[ -f "$CACHE/$file" ]] || die "pip did not produce $file"
  echo "$sha  $CACHE/$file" | sha256sum -c --status || die "$file: sha256 $(sha256sum "$CACHE/$file" | cut -d' ' -f1), expected $sha"
}
