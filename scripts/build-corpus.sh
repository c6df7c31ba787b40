#!/usr/bin/env bash
# Build the sample RAG corpus in data/corpus/ from "The Debian Administrator's
# Handbook" (Debian package debian-handbook, English HTML edition).
#
# Licence of the source: GPL-2.0+ or CC-BY-SA-3.0 (dual), see data/corpus/SOURCES.md.
#
# Usage:   bash scripts/build-corpus.sh
# Needs:   Debian/Ubuntu with apt (root or sudo, only if the package is missing), python3 (stdlib only).
# Env:     HANDBOOK_DIR=/path/to/html/en-US  to use an already unpacked copy instead.
#
# Output:  data/corpus/<doc_id>.txt  one document each; first line = title, then a blank
#          line, then paragraphs separated by blank lines.  Only *.txt files are documents;
#          SOURCES.md and LICENSE-*.md in the same folder are metadata.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/data/corpus"
PKG=debian-handbook
EXPECTED_VERSION=11.20220922
SRC="${HANDBOOK_DIR:-/usr/share/doc/$PKG/html/en-US}"
COPYRIGHT="/usr/share/doc/$PKG/copyright"
TMP=""
cleanup() { [ -n "$TMP" ] && rm -rf "$TMP"; }
trap cleanup EXIT

SUDO=""
[ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && SUDO=sudo

if [ ! -f "$SRC/index.html" ]; then
  echo "== $PKG not found at $SRC; installing with apt-get" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$PKG" >&2 || true
fi
if [ ! -f "$SRC/index.html" ]; then
  # e.g. dpkg path-exclude for /usr/share/doc in minimal container images: unpack the .deb by hand
  echo "== still missing; unpacking the .deb into a temporary folder" >&2
  TMP="$(mktemp -d)"; chmod 755 "$TMP"
  (cd "$TMP" && apt-get download "$PKG" >&2 && dpkg-deb -x ./"${PKG}"_*.deb root)
  SRC="$TMP/root/usr/share/doc/$PKG/html/en-US"
  COPYRIGHT="$TMP/root/usr/share/doc/$PKG/copyright"
  VERSION="$(dpkg-deb -f "$TMP"/"${PKG}"_*.deb Version)"
else
  VERSION="$(dpkg-query -W -f='${Version}' "$PKG" 2>/dev/null || echo unknown)"
fi
[ -f "$COPYRIGHT" ] || COPYRIGHT="$(dirname "$(dirname "$SRC")")/copyright"
if [ "$VERSION" != "$EXPECTED_VERSION" ]; then
  echo "WARNING: $PKG version is $VERSION, the corpus and data/questions.json were made from $EXPECTED_VERSION" >&2
fi

mkdir -p "$OUT"
rm -f "$OUT"/*.txt "$OUT"/SOURCES.md "$OUT"/LICENSE-*.md

python3 - "$SRC" "$OUT" <<'PYEOF'
import html, os, re, sys, unicodedata
from html.parser import HTMLParser

SRC, OUT = sys.argv[1], sys.argv[2]
MAX_DOC = 40_000      # bytes: bigger sections are split at their subsections
MIN_DOC = 1_800       # bytes: smaller pieces are merged with a neighbour of the same chapter
TARGET_CHUNK = 24_000 # bytes: when splitting, pack subsections up to about this size

# Elements dropped with all their content: navigation, banner, tables of contents,
# index anchors, images, and the head.
def skipped(tag, a):
    cls = (a.get("class") or "").split()
    if tag in ("head", "script", "style", "img"):
        return True
    if tag == "ul" and "docnav" in cls:
        return True
    if tag == "div" and (a.get("id") == "banner" or "toc" in cls or "mediaobject" in cls):
        return True
    if tag == "p" and a.get("id") == "title":
        return True
    if tag == "a" and "indexterm" in cls:
        return True
    return False

BLOCK = {"p", "div", "pre", "li", "dt", "dd", "tr", "table", "ul", "ol", "dl",
         "blockquote", "h1", "h2", "h3", "h4", "h5", "h6", "br", "hr", "tbody", "thead"}
VOID = {"img", "br", "hr", "meta", "link", "input", "col", "area", "base", "wbr"}

class Conv(HTMLParser):
    """HTML -> list of events: ("h", level, anchor_id, title) and ("p", text)."""
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.events, self.buf = [], []
        self.skip = 0          # depth inside a skipped element
        self.stack = []        # open tags: (tag, skipped?)
        self.pre = 0
        self.head = None       # [level, id, parts] while inside <hN>
        self.cells = None      # list of cell texts while inside <tr>
        self.cell = None       # paragraphs of the current <td>/<th>
        self.bullet = False    # a list item started: prefix its first paragraph with "- "

    def flush(self):
        text = "".join(self.buf)
        self.buf = []
        if self.pre:
            return
        text = re.sub(r"\s+", " ", text).strip()
        if not text:
            return
        if self.bullet:
            text, self.bullet = "- " + text, False
        if self.cell is not None:
            self.cell.append(text)
        elif self.cells is not None:
            self.cells.append(text)
        else:
            self.events.append(("p", text))

    def flush_pre(self):
        text = "".join(self.buf)
        self.buf = []
        lines = [l.rstrip() for l in text.split("\n")]
        while lines and not lines[0].strip():
            lines.pop(0)
        while lines and not lines[-1].strip():
            lines.pop()
        # no blank lines inside a code block, so that blank lines always mean paragraph breaks
        lines = [l.expandtabs(8) for l in lines if l.strip()]
        if lines:
            self.events.append(("p", "\n".join(lines)))

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if self.skip:
            if tag not in VOID:
                self.skip += 1
            return
        if skipped(tag, a):
            if tag not in VOID:
                self.skip = 1
            return
        if self.head is not None:
            if tag == "a" and a.get("id") and not self.head[1]:
                self.head[1] = a["id"]
            return
        if re.fullmatch(r"h[1-6]", tag):
            self.flush()
            self.head = [int(tag[1]), None, []]
            return
        if tag == "sup":
            self.buf.append(" ")
        if tag in BLOCK:
            if self.pre:
                return
            self.flush()
            if tag == "pre":
                self.pre = 1
            elif tag == "tr":
                self.cells = []
            elif tag == "li":
                self.bullet = True
        elif tag in ("td", "th") and self.cells is not None:
            self.flush()
            self.cell = []

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if self.skip:
            if tag not in VOID:
                self.skip -= 1
            return
        if self.head is not None:
            if re.fullmatch(r"h[1-6]", tag):
                title = re.sub(r"\s+", " ", "".join(self.head[2])).strip()
                self.events.append(("h", self.head[0], self.head[1] or "", title))
                self.head = None
            return
        if tag == "pre" and self.pre:
            self.flush_pre()
            self.pre = 0
            return
        if tag in ("td", "th") and self.cell is not None and not self.pre:
            self.flush()
            if self.cell:
                self.cells.append(" ".join(self.cell))
            self.cell = None
            return
        if tag in BLOCK and not self.pre:
            self.flush()
            if tag == "li":
                self.bullet = False
            if tag == "tr" and self.cells is not None:
                if self.cells:
                    self.events.append(("p", " | ".join(self.cells)))
                self.cells = None

    def handle_data(self, data):
        if self.skip:
            return
        if self.head is not None:
            self.head[2].append(data)
        else:
            self.buf.append(data)

def parse(path):
    c = Conv()
    with open(path, encoding="utf-8") as f:
        c.feed(f.read())
    c.close()
    c.flush()
    return c.events

def clean_title(t):
    t = re.sub(r"^(Chapter|Appendix)\s+[0-9A-Z]+\.\s*", "", t)
    t = re.sub(r"^([0-9]+|[A-Z])(\.[0-9]+)*\.\s+", "", t)
    return t.strip()

def slug(s, words=6):
    s = unicodedata.normalize("NFKD", s).encode("ascii", "ignore").decode().lower()
    s = re.sub(r"^sect\.", "", s)
    parts = [p for p in re.split(r"[^a-z0-9]+", s) if p]
    return "-".join(parts[:words]) or "doc"

# Book order: follow rel="next" from index.html.
order, cur = [], "index.html"
while cur and cur not in order:
    order.append(cur)
    txt = open(os.path.join(SRC, cur), encoding="utf-8").read()
    m = re.search(r'<link rel="next" href="([^"#]+)', txt)
    cur = m.group(1) if m else None
extra = sorted(f for f in os.listdir(SRC) if f.endswith(".html") and f not in order)
if extra:
    print("note: files not in the next-chain, appended:", extra, file=sys.stderr)
order = order[1:] + extra  # index.html (title page, legal notice, full TOC) is not a document

def size(paras):
    return sum(len(p.encode()) + 2 for p in paras)

# 1. Units = (chapter, h1/h2 section) with their paragraphs; subsection headings kept as lines
#    and remembered as split points.
units = []    # dict(chapter, id, title, paras, splits=[(index, h3 id, h3 title)])
chapter = None
for fname in order:
    unit = None
    for ev in parse(os.path.join(SRC, fname)):
        if ev[0] == "h":
            _, level, hid, title = ev
            title = clean_title(title)
            if level == 1:
                chapter = title
            if level <= 2 or unit is None:
                unit = dict(chapter=chapter, id=hid or fname[:-5], title=title, paras=[], splits=[])
                units.append(unit)
                continue
            if level == 3:
                unit["splits"].append((len(unit["paras"]), hid, title))
            unit["paras"].append(title)
        elif unit is not None:
            unit["paras"].append(ev[1])

# 2. Split units bigger than MAX_DOC at subsection (h3) boundaries, packing neighbouring
#    subsections together up to about TARGET_CHUNK bytes.
docs = []
for u in units:
    if size(u["paras"]) <= MAX_DOC or not u["splits"]:
        docs.append(dict(chapter=u["chapter"], id=u["id"], title=u["title"], paras=u["paras"]))
        continue
    bounds = [(0, None, None)] + u["splits"] + [(len(u["paras"]), None, None)]
    pieces = []
    for (s, hid, t), (e, _, _) in zip(bounds, bounds[1:]):
        if e > s:
            pieces.append(dict(paras=u["paras"][s:e], sub=[] if t is None else [(hid, t)]))
    packed = []
    for p in pieces:
        if packed and (size(packed[-1]["paras"]) < MIN_DOC or
                       size(packed[-1]["paras"]) + size(p["paras"]) <= TARGET_CHUNK):
            packed[-1]["paras"] += p["paras"]
            packed[-1]["sub"] += p["sub"]
        else:
            packed.append(dict(paras=list(p["paras"]), sub=list(p["sub"])))
    for p in packed:
        if p["sub"]:
            hid = p["sub"][0][0]
            sub_title = "; ".join(t for _, t in p["sub"])
            title = f'{u["title"]}: {sub_title}'
            key = hid if hid and not hid.startswith("id-") else u["id"] + "-" + slug(p["sub"][0][1], 4)
        else:
            title, key = u["title"], u["id"]
        docs.append(dict(chapter=u["chapter"], id=key, title=title, paras=p["paras"]))

# 3. Merge pieces smaller than MIN_DOC into the previous document of the same chapter
#    (or, for a chapter's first piece, into the next one).
def merge_into(dst, src, before=False):
    if before:
        # the merged document keeps the title and id of its larger part, or of the first
        # part when the second one already gathers several small sections
        if size(src["paras"]) > size(dst["paras"]) or dst.get("absorbed", 0) >= 2:
            dst["paras"] = src["paras"] + [dst["title"]] + dst["paras"]
            dst["title"], dst["id"] = src["title"], src["id"]
        else:
            dst["paras"] = [src["title"]] + src["paras"] + [dst["title"]] + dst["paras"]
    else:
        dst["paras"] += [src["title"]] + src["paras"]
        dst["absorbed"] = dst.get("absorbed", 0) + 1

merged = []
for d in docs:
    if merged and size(d["paras"]) < MIN_DOC and merged[-1]["chapter"] == d["chapter"] \
            and size(merged[-1]["paras"]) + size(d["paras"]) <= MAX_DOC:
        merge_into(merged[-1], d)
    else:
        merged.append(d)
final = []
pending = None
for d in merged:
    if pending is not None:
        if pending["chapter"] == d["chapter"]:
            merge_into(d, pending, before=True)
        else:
            final.append(pending)
        pending = None
    if size(d["paras"]) < MIN_DOC:
        pending = d
    else:
        final.append(d)
if pending is not None:
    final.append(pending)

# 4. Write files.  doc_id = slug of the section anchor (unique).
seen = set()
total = 0
for d in final:
    base = slug(d["id"], 6)
    doc_id, n = base, 2
    while doc_id in seen:
        doc_id, n = f"{base}-{n}", n + 1
    seen.add(doc_id)
    body = "\n\n".join(d["paras"]).strip()
    text = d["title"] + "\n\n" + body + "\n"
    text = unicodedata.normalize("NFC", text).replace("\u00a0", " ")
    with open(os.path.join(OUT, doc_id + ".txt"), "w", encoding="utf-8") as f:
        f.write(text)
    total += len(text.encode())
print(f"wrote {len(final)} documents, {total} bytes", file=sys.stderr)
PYEOF

# Licence and provenance files (not documents: only *.txt are documents).
{
  cat <<EOF
# Corpus source

The \`*.txt\` files in this folder are plain-text conversions of
**The Debian Administrator's Handbook** (Debian 11 "bullseye" edition, English),
by Raphaël Hertzog and Roland Mas, as shipped in the Debian package
\`$PKG\` version \`$VERSION\` (HTML edition, \`/usr/share/doc/$PKG/html/en-US/\`).

- Upstream: https://debian-handbook.info (source: https://salsa.debian.org/hertzog/debian-handbook)
- Debian package: https://packages.debian.org/bookworm/$PKG
- Built by: \`bash scripts/build-corpus.sh\`

## Modifications

The HTML pages were converted to plain UTF-8 text by \`scripts/build-corpus.sh\`:
navigation, banners, tables of contents, index anchors, images and section
numbers were removed; whitespace was collapsed (paragraphs are separated by blank
lines, code blocks keep their lines); the title page/legal notice/full table of
contents page (\`index.html\`) is not included as a document; large sections were
split at their subsections and very small sections were merged with a
neighbouring section of the same chapter. The first line of each file is the
document title. No other change was made to the wording.

## Licence

The book is dual-licensed; this derived corpus is distributed under the same
terms (GPL-2.0-or-later **or** CC-BY-SA-3.0, at your option).
Legal notice of the book (from its \`index.html\`):

> This book is available under the terms of two licenses compatible with the
> Debian Free Software Guidelines.
>
> Creative Commons License Notice: This book is licensed under a Creative Commons
> Attribution-ShareAlike 3.0 Unported License.
> → https://creativecommons.org/licenses/by-sa/3.0/
>
> GNU General Public License Notice: This book is free documentation: you can
> redistribute it and/or modify it under the terms of the GNU General Public
> License as published by the Free Software Foundation, either version 2 of the
> License, or (at your option) any later version.
>
> This book is distributed in the hope that it will be useful, but WITHOUT ANY
> WARRANTY; without even the implied warranty of MERCHANTABILITY or FITNESS FOR A
> PARTICULAR PURPOSE. See the GNU General Public License for more details.
>
> You should have received a copy of the GNU General Public License along with
> this program. If not, see https://www.gnu.org/licenses/ .

Debian copyright file of the package (header):

\`\`\`
EOF
  sed -n '1,/^License: GPL-2.0+ or CC-BY-SA-3.0/p' "$COPYRIGHT"
  cat <<EOF
\`\`\`

Full texts: \`LICENSE-GPL-2.md\` (GNU GPL version 2) and
\`LICENSE-debian-copyright.md\` (the package's complete Debian copyright file,
which contains the full CC-BY-SA-3.0 legal code).
EOF
} > "$OUT/SOURCES.md"

{ echo '```'; cat /usr/share/common-licenses/GPL-2; echo '```'; } > "$OUT/LICENSE-GPL-2.md"
{ echo '```'; cat "$COPYRIGHT"; echo '```'; } > "$OUT/LICENSE-debian-copyright.md"

n=$(ls "$OUT"/*.txt | wc -l)
bytes=$(cat "$OUT"/*.txt | wc -c)
echo "corpus: $n documents, $bytes bytes in $OUT/*.txt"
if [ "$bytes" -lt 1000000 ] || [ "$bytes" -gt 1600000 ]; then
  echo "ERROR: corpus size $bytes outside 1.0-1.6 MB" >&2
  exit 1
fi
