#!/usr/bin/env bash
# Render README.md and the docs to HTML with pandoc (GitHub-flavoured Markdown) and photograph each page in headless
# Chromium, as a reader would see it: outputs/docs-look/<page>.png, plus a list of broken images and tables.
# Needs Debian's pandoc and chromium (apt-get install -y pandoc chromium). Not part of `make test`.
# Usage: bash tools/docs-look.sh [page.md ...]   (default: README.md docs/*.md docs/papers/*.md)
set -euo pipefail
cd "$(dirname "$0")/.."
out=outputs/docs-look
mkdir -p "$out"
pages=("$@")
[ ${#pages[@]} -gt 0 ] || pages=(README.md docs/*.md docs/papers/*.md)
css='body{max-width:1012px;margin:2em auto;font:15px/1.5 -apple-system,Segoe UI,Helvetica,Arial,sans-serif;padding:0 1em}
table{border-collapse:collapse;display:block;overflow:auto}td,th{border:1px solid #d0d7de;padding:4px 8px;vertical-align:top}
code{background:#f6f8fa;padding:0 3px}pre{background:#f6f8fa;padding:8px;overflow:auto}img{max-width:100%}'
head="$(mktemp)"
printf '<style>%s</style>\n' "$css" > "$head"
status=0
for md in "${pages[@]}"; do
  name=$(echo "${md%.md}" | tr '/' '_')
  html="$(dirname "$md")/.docs-look-$name.html"   # beside the page, so its relative image links resolve
  pandoc -f gfm -t html5 -s --metadata title="$md" -H "$head" "$md" -o "$html"
  # broken images: an <img> whose file is missing; broken tables: a line starting with '|' left as text
  { grep -o "<img src=\"[^\"]*\"" "$html" || true; } | sed 's/<img src="//;s/"$//' | while read -r src; do
    case "$src" in http*) ;; *) [ -e "$(dirname "$md")/$src" ] || { echo "$md: missing image $src"; }; esac
  done
  if grep -q '^<p>|' "$html"; then echo "$md: a table did not render"; status=1; fi
  chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$(mktemp -d)" --hide-scrollbars \
    --window-size=1100,2400 --screenshot="$out/$name.png" "file://$PWD/$html" >/dev/null 2>&1 || status=1
  rm -f "$html"
  echo "$out/$name.png"
done
exit $status
