#!/usr/bin/env bash
# Optimizer offload cost on this machine: the `small` preset as `make demo`
# trains it (resolution 32, batch 32, AdamW so the state is offloadable),
# 25 steps with the optimizer state in memory against the same with
# offload_optimizer nvme (a swap file in OFFLOAD_DIR, default a directory
# under the build's parent, O_DIRECT where the file system takes it). Prints
# the median seconds per step over steps 6-25 and their ratio, plus the
# run's own offload log line (bytes moved, seconds waiting for reads).
#   scripts/bench_offload.sh [path/to/ctuner]      OFFLOAD_DIR=/mnt/nvme/x
set -euo pipefail
CT=$(readlink -f "${1:-build/ctuner}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
swap=${OFFLOAD_DIR:-$tmp/swap}
mkdir -p "$swap"
"$CT" dataset synth --out "$tmp/data" --count 256 --seed 1 --size 32x32 >/dev/null
echo "[{\"id\": \"d\", \"type\": \"local\", \"instance_data_dir\": \"$tmp/data\", \"caption_strategy\": \"textfile\"}]" > "$tmp/b.json"
A=(train --preset=small --resolution=32 --aspect_bucket_alignment=32 --data_backend_config="$tmp/b.json" --max_train_steps=25 --train_batch_size=32
  --disable_validation=true --use_ema=false --optimizer=adamw --learning_rate=1e-4 --checkpoint_step_interval=0)
"$CT" "${A[@]}" --output_dir="$tmp/mem" >/dev/null 2>&1
"$CT" "${A[@]}" --offload_optimizer=nvme --offload_param_path="$swap" --output_dir="$tmp/off" >/dev/null 2>"$tmp/off.err"
grep "offload" "$tmp/off.err" | sed 's/^/  /' >&2
/usr/bin/python3 - "$tmp" <<'PY'
import json, statistics, sys
t = sys.argv[1]
def med(r):
    L = [json.loads(l) for l in open(f"{t}/{r}/metrics.jsonl")][5:]
    return statistics.median(x["seconds"] for x in L)
a, b = med("mem"), med("off")
print(json.dumps({"in_memory_s_per_step": round(a, 4), "offload_s_per_step": round(b, 4),
                  "offload_cost": round(b / a - 1, 3)}))
PY
