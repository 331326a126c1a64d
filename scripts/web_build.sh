#!/usr/bin/env bash
# Rebuilds web/dist/index.html (committed; CMake embeds it in ctuner, so a
# build needs neither node nor network) from web/src and uPlot from npm
# (pinned below, installed into build/npm-tools). Run it after editing web/src.
#   scripts/web_build.sh            rebuild web/dist/index.html
#   scripts/web_build.sh --check    fail if web/dist/index.html is not what web/src builds
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
tools=build/npm-tools
pkgs=("uplot@1.6.32")
need=0
for p in "${pkgs[@]}"; do
  name="${p%@*}" ver="${p##*@}"
  have=$(node -e "try{console.log(require('./$tools/node_modules/$name/package.json').version)}catch(e){}" 2>/dev/null || true)
  [ "$have" = "$ver" ] || need=1
done
if [ $need = 1 ]; then
  command -v npm >/dev/null || { echo "web_build.sh: npm not found (scripts/deps.sh installs node + npm)" >&2; exit 1; }
  mkdir -p "$tools"
  npm install --prefix "$tools" --no-audit --no-fund --silent --save-exact "${pkgs[@]}" >&2 ||
    { echo "web_build.sh: npm could not install ${pkgs[*]} (is the npm registry reachable?)" >&2; exit 1; }
fi
if [ "${1:-}" = "--check" ]; then
  cp web/dist/index.html "$tools/index.committed.html"
  node web/build.mjs "$tools/node_modules" >/dev/null
  if cmp -s web/dist/index.html "$tools/index.committed.html"; then echo "web_build.sh: web/dist/index.html is up to date"; exit 0; fi
  cp "$tools/index.committed.html" web/dist/index.html
  echo "web_build.sh: web/dist/index.html is stale: run scripts/web_build.sh and commit it" >&2
  exit 1
fi
node web/build.mjs "$tools/node_modules"
