#!/usr/bin/env bash
# End-to-end: fresh Parquet files from two independent writers — DuckDB
# (@duckdb/node-api) and parquet-wasm (arrow-rs) — 20,000 rows each, several
# row groups and pages, every codec (none/snappy/gzip/zstd), data pages v1 and
# v2, dictionary on/off/fallback, written by scripts/parquet_fixtures.sh
# --large; `ctuner dataset parquet FILE` must print every value exactly as the
# writer's own JSON export (floats compared as float32). Also: --columns,
# --limit, --schema and the errors for an unsupported codec and a missing
# column. Needs node + npm and the npm registry (packages are cached in
# build/npm-tools); without them this test FAILS, it does not skip.
# Usage: tests/parquet_interop.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
rows=${PQ_INTEROP_ROWS:-20000}

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  bad "node and npm are needed to write the interop files (scripts/deps.sh --golden)"
  exit 1
fi
if ! scripts/parquet_fixtures.sh "$tmp/pq" --rows "$rows" --large > "$tmp/gen.log" 2>&1; then
  bad "could not write the interop files with DuckDB/parquet-wasm (npm registry unreachable?):"
  sed 's/^/    /' "$tmp/gen.log" | tail -15
  exit 1
fi
ok "$(tail -1 "$tmp/gen.log")"

cat > "$tmp/cmp.py" <<'PY'
import json, struct, sys
ours, theirs, schema = sys.argv[1:4]
floats = {c["name"] for c in json.load(open(schema))["columns"] if c["physical"] == "FLOAT"}
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
def same(col, a, b):
    if type(a) is bool or type(b) is bool or a is None or b is None or isinstance(a, str):
        return type(a) is type(b) and a == b
    if col in floats:
        return f32(a) == f32(b)
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return float(a) == float(b)
A = open(ours, encoding="utf-8").read().splitlines()
B = open(theirs, encoding="utf-8").read().splitlines()
bad = 0
if len(A) != len(B):
    print(f"rows: ctuner {len(A)}, writer {len(B)}"); bad += 1
vals = 0
for i, (la, lb) in enumerate(zip(A, B)):
    a, b = json.loads(la), json.loads(lb)
    if list(a) != list(b):
        print(f"row {i}: columns {list(a)} vs {list(b)}"); bad += 1; continue
    for k in a:
        vals += 1
        if not same(k, a[k], b[k]):
            bad += 1
            if bad <= 5: print(f"row {i} column {k}: ctuner {a[k]!r}, writer {b[k]!r}")
print(f"{len(A)} rows, {vals} values, {bad} mismatches")
sys.exit(1 if bad else 0)
PY

n=0
for f in "$tmp"/pq/*.parquet; do
  b=$(basename "$f" .parquet)
  [ -f "$tmp/pq/$b.json" ] || continue
  n=$((n + 1))
  if ! "$CT" dataset parquet "$f" > "$tmp/$b.ours" 2> "$tmp/$b.err"; then
    bad "$b: ctuner failed: $(cat "$tmp/$b.err")"; continue
  fi
  "$CT" dataset parquet "$f" --schema > "$tmp/$b.schema" || bad "$b: --schema failed"
  if res=$("$PY" "$tmp/cmp.py" "$tmp/$b.ours" "$tmp/pq/$b.json" "$tmp/$b.schema"); then
    rg=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['row_groups'])" "$tmp/$b.schema")
    ok "$b: $res ($rg row groups)"
  else
    bad "$b: $res"
  fi
done
[ "$n" -eq 12 ] && ok "12 files compared" || bad "$n files compared, expected 12"

f="$tmp/pq/duckdb_v2_zstd.parquet"
out=$("$CT" dataset parquet "$f" --columns tag,id --limit 3)
[ "$(echo "$out" | wc -l)" -eq 3 ] && echo "$out" | head -1 | grep -q '^{"tag":"tag0","id":0}$' \
  && ok "--columns tag,id --limit 3" || bad "--columns/--limit: $out"
sch=$("$CT" dataset parquet "$tmp/pq/pwasm_v2_gzip.parquet" --schema)
echo "$sch" | grep -q "\"rows\":$rows" && echo "$sch" | grep -q '"name":"s","physical":"BYTE_ARRAY","logical":"STRING","nullable":true' \
  && echo "$sch" | grep -q '"name":"id","physical":"INT64","nullable":false' \
  && ok "--schema" || bad "--schema: $sch"
err=$("$CT" dataset parquet "$f" --columns nope 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && echo "$err" | grep -q "has no column 'nope'" && ok "unknown column: $err" || bad "unknown column rc=$rc: $err"
err=$("$CT" dataset parquet tests/data/parquet/pwasm_lz4raw.parquet 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && echo "$err" | grep -q "compression LZ4_RAW (7) is not supported" && ok "LZ4_RAW: $err" || bad "LZ4_RAW rc=$rc: $err"
head -c 3000 "$f" > "$tmp/trunc.parquet"
err=$("$CT" dataset parquet "$tmp/trunc.parquet" 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && echo "$err" | grep -q "trunc.parquet: " && ok "truncated: $err" || bad "truncated rc=$rc: $err"
"$CT" dataset parquet >/dev/null 2>&1; [ $? -eq 2 ] && ok "usage error rc=2" || bad "no FILE should be rc 2"
exit $fail
