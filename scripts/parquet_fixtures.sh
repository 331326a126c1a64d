#!/usr/bin/env bash
# Write Parquet files with two independent writers — DuckDB (@duckdb/node-api)
# and parquet-wasm (the arrow-rs writer) — plus each tool's own JSON-lines
# export of the rows, via scripts/parquet_fixtures.mjs. npm packages are
# pinned and installed into build/npm-tools (test-only; needs node + npm).
#   scripts/parquet_fixtures.sh                  regenerate tests/data/parquet (committed, small)
#   scripts/parquet_fixtures.sh OUTDIR [--rows N] [--large]   fresh files elsewhere (interop test)
# Fails with a message when npm cannot install the packages (e.g. no registry).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
tools=build/npm-tools
pkgs=("@duckdb/node-api@1.5.0-r.1" "parquet-wasm@0.7.1" "apache-arrow@21.1.0")
need=0
for p in "${pkgs[@]}"; do
  name="${p%@*}" ver="${p##*@}"
  have=$(node -e "try{console.log(require('./$tools/node_modules/$name/package.json').version)}catch(e){}" 2>/dev/null || true)
  [ "$have" = "$ver" ] || need=1
done
if [ $need = 1 ]; then
  command -v npm >/dev/null || { echo "parquet_fixtures.sh: npm not found (install node + npm: scripts/deps.sh --golden)" >&2; exit 1; }
  mkdir -p "$tools"
  if ! npm install --prefix "$tools" --no-audit --no-fund --silent --save-exact "${pkgs[@]}" >&2; then
    echo "parquet_fixtures.sh: npm could not install ${pkgs[*]} (is the npm registry reachable?)" >&2
    exit 1
  fi
fi
mkdir -p "$tools/scripts"
cp scripts/parquet_fixtures.mjs "$tools/scripts/"
out="${1:-tests/data/parquet}"
[ $# -gt 0 ] && shift
mkdir -p "$out"
out="$(cd "$out" && pwd)"
if [ "$out" = "$root/tests/data/parquet" ]; then
  rm -f "$out"/duckdb_*.parquet "$out"/duckdb_*.json "$out"/pwasm_*.parquet "$out"/pwasm_*.json
fi
node "$tools/scripts/parquet_fixtures.mjs" "$out" "$@"
