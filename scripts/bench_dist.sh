#!/usr/bin/env bash
# Data-parallel throughput on this machine: `bench` preset (batch 16 = 64 image
# tokens + 16 text tokens per sample, AdamW), 1 rank x 2 threads against
# 2 ranks x 1 thread (batch 8 each) at ZeRO stages 0 to 3. Prints the median
# seconds per step over steps 6-25 and the ratio of samples/s to the 1-rank run.
#   scripts/bench_dist.sh [path/to/ctuner]
set -euo pipefail
CT=$(readlink -f "${1:-build/ctuner}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$CT" dataset synth --out "$tmp/data" --count 64 --seed 1 --size 16x16 >/dev/null
echo "[{\"id\": \"d\", \"type\": \"local\", \"instance_data_dir\": \"$tmp/data\", \"caption_strategy\": \"textfile\"}]" > "$tmp/b.json"
A=(train --preset=bench --resolution=16 --aspect_bucket_alignment=16 --data_backend_config="$tmp/b.json" --max_train_steps=25
  --disable_validation=true --use_ema=false --learning_rate=1e-4)
OMP_NUM_THREADS=2 "$CT" "${A[@]}" --train_batch_size=16 --output_dir="$tmp/r1" >/dev/null 2>&1
for st in 0 1 2 3; do
  mpirun --oversubscribe --allow-run-as-root -np 2 -x OMP_NUM_THREADS=1 "$CT" "${A[@]}" --train_batch_size=8 \
    --zero_stage=$st --output_dir="$tmp/r2s$st" >/dev/null 2>&1
done
/usr/bin/python3 - "$tmp" <<'PY'
import json, statistics, sys
t = sys.argv[1]
def med(r):
    L = [json.loads(l) for l in open(f"{t}/{r}/metrics.jsonl")][5:]
    return statistics.median(x["seconds"] for x in L)
base = med("r1")
out = {"one_rank_2_threads_s_per_step": round(base, 4)}
for st in range(4):
    out[f"two_ranks_1_thread_stage{st}_s_per_step"] = round(med(f"r2s{st}"), 4)
for st in range(4):
    out[f"stage{st}_throughput_vs_one_rank"] = round(base / med(f"r2s{st}"), 3)
print(json.dumps(out))
PY
