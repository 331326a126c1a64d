#!/usr/bin/env bash
# The data loader end to end (docs/data.md): 2 ranks on 2,000 images in 4
# aspect buckets — every global batch from one bucket, no sample twice in an
# epoch across ranks, kill + resume continuing the exact sample order (also on
# 1 rank); `ctuner cache`; parquet and JSONL metadata; bad files counted.
# Usage: tests/cli_data.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
MPIRUN=(mpirun --oversubscribe --allow-run-as-root)
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
command -v mpirun >/dev/null || { echo "FAIL - mpirun not found: run scripts/deps.sh"; exit 1; }

# 4 aspects x 500 images (recursive discovery: one dataset); 2 epochs of E = 8.
# Under ASan (an instrumented binary) the same checks run on 4 x 50 images.
per=500 steps=300 killat=150
if ldd "$CT" 2>/dev/null | grep -q libasan; then per=50 steps=48 killat=20; fi
total=$((per * 4))
i=0
for size in 32x32 48x32 32x48 64x32; do
  "$CT" dataset synth --out "$tmp/data/s$size" --count $per --seed $((i += 1)) --size "$size" >/dev/null ||
    { echo "FAIL - dataset synth $size"; exit 1; }
done
cat > "$tmp/backend.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile",
  "resolution_type": "pixel"}]
JSON
base=(--preset=tiny --resolution=16 --aspect_bucket_alignment=8 --data_backend_config="$tmp/backend.json"
      --learning_rate=1e-3 --disable_validation=true --seed=5 --checkpoint_step_interval=10 --max_train_steps=$steps)

# ctuner cache under 2 ranks: the caches every later run reuses
if out=$("${MPIRUN[@]}" -np 2 -x OMP_NUM_THREADS=1 "$CT" cache "${base[@]}" --train_batch_size=4 \
    --output_dir="$tmp/a" 2>"$tmp/cache.err"); then
  echo "$out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert d["images"] == '$total' and d["buckets"] == 4 and d["samples"] == '$total', d' &&
    ok "ctuner cache on 2 ranks: $total images, 4 buckets" || bad "cache stats: $out"
  n=$(ls "$tmp/a/cache/vae/shapes" | wc -l)
  [ "$n" = $total ] && ok "latent cache holds $total entries" || bad "latent cache holds $n entries"
  grep -q "encoded by this rank" "$tmp/cache.err" && ok "each rank encoded its share" || bad "no cache log"
else
  bad "ctuner cache: $(tail -3 "$tmp/cache.err")"
fi

# reference: 2 ranks x batch 4 = E 8; an epoch is total / 8 steps, the run covers 2 epochs
# shellcheck disable=SC2016
check='
import collections, sys
rows = [l.split() for l in open(sys.argv[1])]
E = int(sys.argv[2])
steps = collections.defaultdict(set)
seen = collections.defaultdict(set)
ids = collections.Counter()
for i, rank, epoch, ds, key, rel in rows:
    steps[int(i) // E].add(key)
    ids[int(i)] += 1
    s = seen[int(epoch)]
    assert rel not in s, f"{rel} twice in epoch {epoch}"
    s.add(rel)
assert all(len(k) == 1 for k in steps.values()), "a global batch mixes buckets"
assert max(ids.values()) == 1, "a sample id taken twice"
assert sorted(ids) == list(range(len(ids))), "ids have gaps"
assert len(seen) >= 2, f"epochs {sorted(seen)}"
print(len(steps), "steps,", len(rows), "samples,", len(seen), "epochs")'
if CTUNER_DATA_TRACE="$tmp/ref.trace" "${MPIRUN[@]}" -np 2 -x OMP_NUM_THREADS=1 -x CTUNER_DATA_TRACE \
    "$CT" train "${base[@]}" --train_batch_size=4 --output_dir="$tmp/a" >/dev/null 2>"$tmp/ref.err"; then
  if r=$(python3 -c "$check" "$tmp/ref.trace" 8 2>&1); then
    ok "2 ranks: every global batch from one bucket, no repeats in an epoch, no gaps ($r)"
  else
    bad "sampler guarantees: $r"
  fi
  ranks=$(awk '{print $2}' "$tmp/ref.trace" | sort -u | tr '\n' ' ')
  [ "$ranks" = "0 1 " ] && ok "both ranks took samples" || bad "ranks in trace: $ranks"
  [ -f "$tmp/a/checkpoint-$steps/sampler_state.json" ] && ok "checkpoints carry sampler_state.json" ||
    bad "no sampler_state.json"
else
  bad "reference run: $(tail -3 "$tmp/ref.err")"
fi

# kill -9 a 2-rank run after checkpoint-$killat, resume on 2 ranks, then on 1 rank (batch 8)
CTUNER_DATA_TRACE="$tmp/k.trace" "${MPIRUN[@]}" -np 2 -x OMP_NUM_THREADS=1 -x CTUNER_DATA_TRACE \
  "$CT" train "${base[@]}" --train_batch_size=4 --output_dir="$tmp/k" >/dev/null 2>"$tmp/k.err" &
pid=$!
for _ in $(seq 3000); do # (minutes: the ASan pass on a loaded 2-core machine is 10x slower)
  [ -f "$tmp/k/checkpoint-$killat/.guard" ] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
done
kill -9 $pid 2>/dev/null
pkill -9 -f "output_dir=$tmp/k" 2>/dev/null
wait $pid 2>/dev/null || true
last=$(ls -d "$tmp/k"/checkpoint-[0-9]* 2>/dev/null | grep -v -- '-tmp$' | sed 's/.*checkpoint-//' | sort -n | tail -1)
if [ -n "$last" ] && [ "$last" -lt "$steps" ]; then
  ok "killed at or after checkpoint-$last"
  cp -r "$tmp/k" "$tmp/k1"
  CTUNER_DATA_TRACE="$tmp/k2.trace" "${MPIRUN[@]}" -np 2 -x OMP_NUM_THREADS=1 -x CTUNER_DATA_TRACE \
    "$CT" train "${base[@]}" --train_batch_size=4 --output_dir="$tmp/k" >/dev/null 2>"$tmp/k2.err" ||
    bad "resume on 2 ranks: $(tail -3 "$tmp/k2.err")"
  CTUNER_DATA_TRACE="$tmp/k1.trace" OMP_NUM_THREADS=1 \
    "$CT" train "${base[@]}" --train_batch_size=8 --output_dir="$tmp/k1" >/dev/null 2>"$tmp/k1.err" ||
    bad "resume on 1 rank: $(tail -3 "$tmp/k1.err")"
  same='
import sys
def load(p):
    return {int(l.split()[0]): l.split()[3:] for l in open(p)}
ref, got = load(sys.argv[1]), load(sys.argv[2])
start = int(sys.argv[3]) * 8
want = {i: v for i, v in ref.items() if i >= start}
assert got and min(got) == start, f"resumed at sample {min(got) if got else None}, wanted {start}"
assert got == want, "the resumed order differs"
print(len(got))'
  r=$(python3 -c "$same" "$tmp/ref.trace" "$tmp/k2.trace" "$last" 2>&1) &&
    ok "kill + resume on 2 ranks continues the exact sample order ($r samples)" || bad "2-rank resume: $r"
  r=$(python3 -c "$same" "$tmp/ref.trace" "$tmp/k1.trace" "$last" 2>&1) &&
    ok "kill + resume on 1 rank continues the exact sample order ($r samples)" || bad "1-rank resume: $r"
else
  bad "no checkpoint before the kill (last '$last'): $(tail -3 "$tmp/k.err")"
fi

# metadata from a table: JSONL with captions, sizes, a row outside the directory, a duplicate, a missing file
mkdir -p "$tmp/tab"
cp $(ls "$tmp"/data/s32x32/*.png "$tmp"/data/s32x32/*.jpg | sort | head -9) "$tmp/tab/"
python3 - "$tmp/tab" <<'PY'
import json, os, sys
d = sys.argv[1]
files = sorted(f for f in os.listdir(d) if f.endswith((".png", ".jpg")))
rows = [{"file": f, "caption": f"table caption {i}", "w": 32, "h": 32} for i, f in enumerate(files[:8])]
rows += [{"file": "../escape.png", "caption": "x", "w": 32, "h": 32},
         {"file": files[1], "caption": "dup", "w": 32, "h": 32},
         {"file": "missing.png", "caption": "gone", "w": 32, "h": 32},
         {"file": files[8], "caption": "", "alt": "fallback caption", "w": 32, "h": 32}]
with open(f"{d}/meta.jsonl", "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
PY
cat > "$tmp/tab.json" <<JSON
[{"id": "tab", "type": "local", "instance_data_dir": "$tmp/tab", "metadata_backend": "parquet",
  "caption_strategy": "parquet", "parquet": {"path": "meta.jsonl", "filename_column": "file",
  "caption_column": "caption", "fallback_caption_column": "alt", "width_column": "w", "height_column": "h",
  "identifier_includes_extension": true}}]
JSON
if out=$(OMP_NUM_THREADS=1 "$CT" cache --preset=tiny --resolution=16 --aspect_bucket_alignment=8 \
    --data_backend_config="$tmp/tab.json" --train_batch_size=2 --output_dir="$tmp/t" 2>"$tmp/t.err"); then
  echo "$out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
s = d["skipped"]
assert d["images"] == 9 and s["outside_dir"] == 1 and s["duplicate"] == 1 and s["not_found"] == 1, d' &&
    ok "JSONL metadata: 9 images (one by its fallback caption); outside-dir, duplicate and missing rows skipped and counted" ||
    bad "JSONL stats: $out"
else
  bad "JSONL metadata: $(tail -3 "$tmp/t.err")"
fi

# the same table as parquet, written by DuckDB (npm, installed by scripts/parquet_fixtures.sh)
root="$(cd "$(dirname "$0")/.." && pwd)"
if scripts/parquet_fixtures.sh "$tmp/pqfix" --rows 10 >/dev/null 2>"$tmp/npm.err"; then
  cat > "$root/build/npm-tools/scripts/to_parquet.mjs" <<'JS'
import { DuckDBInstance } from '@duckdb/node-api';
const [src, dst] = process.argv.slice(2);
const c = await (await DuckDBInstance.create(':memory:')).connect();
await c.run(`COPY (SELECT * FROM read_json('${src}')) TO '${dst}' (FORMAT parquet, COMPRESSION snappy)`);
JS
  node "$root/build/npm-tools/scripts/to_parquet.mjs" "$tmp/tab/meta.jsonl" "$tmp/tab/meta.parquet"
  sed 's/meta.jsonl/meta.parquet/' "$tmp/tab.json" > "$tmp/tabpq.json"
  if out=$(OMP_NUM_THREADS=1 "$CT" cache --preset=tiny --resolution=16 --aspect_bucket_alignment=8 \
      --data_backend_config="$tmp/tabpq.json" --train_batch_size=2 --output_dir="$tmp/tp" 2>"$tmp/tp.err"); then
    echo "$out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
s = d["skipped"]
assert d["images"] == 9 and s["outside_dir"] == 1 and s["duplicate"] == 1 and s["not_found"] == 1, d' &&
      ok "parquet metadata (DuckDB): the same 9 images and counts" || bad "parquet stats: $out"
  else
    bad "parquet metadata: $(tail -3 "$tmp/tp.err")"
  fi
else
  bad "npm packages for the parquet writer: $(tail -3 "$tmp/npm.err")"
fi

# a table naming a caption column that does not exist: one clear error
sed 's/"caption_column": "caption"/"caption_column": "text"/; s/"fallback_caption_column": "alt", //' "$tmp/tabpq.json" > "$tmp/badcol.json"
if out=$(OMP_NUM_THREADS=1 "$CT" cache --preset=tiny --resolution=16 --aspect_bucket_alignment=8 \
    --data_backend_config="$tmp/badcol.json" --output_dir="$tmp/bc" 2>&1); then
  bad "a missing caption column was accepted"
else
  echo "$out" | grep -q "parquet.caption_column \"text\" is not a column" && ok "missing column named" ||
    bad "missing column message: $out"
fi
exit $fail
