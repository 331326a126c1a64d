#!/usr/bin/env bash
# The cost of a LoRA step on a frozen base stored as float32 (no_change),
# bf16, int8-quanto and int8-torchao (docs/lora.md "A quantised base"): the
# bench preset, 32x32 images, batch 4, flux_lora_target all, rank 16, AdamW,
# one OpenMP thread; CPU seconds per step = (CPU of a 10-step run - CPU of a
# 2-step run) / 8, the variants interleaved round after round (CPU time is what
# other processes on the cores disturb least). Prints one JSON line per
# variant with the per-round figures and the median, and the int8 / bf16 ratio.
# Usage: scripts/bench_lora_quant.sh [build/ctuner] [ROUNDS]
set -euo pipefail
CT=${1:-build/ctuner}
ROUNDS=${2:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$CT" dataset synth --out "$tmp/data" --count 16 --seed 5 --size 32x32 >/dev/null
cat > "$tmp/backend.json" <<JSON
[{"id": "s", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile", "crop": false}]
JSON
cpu() { # precision steps -> CPU seconds
  local out="$tmp/run-$1-$2"
  rm -rf "$out"
  /usr/bin/time -f '%U %S' -o "$tmp/t" env OMP_NUM_THREADS=1 "$CT" train --preset bench \
    --data_backend_config "$tmp/backend.json" --resolution 32 --aspect_bucket_alignment 8 \
    --train_batch_size 4 --max_train_steps "$2" --checkpoint_step_interval 1000 \
    --disable_validation true --disable_progress_bar true --model_type lora --lora_rank 16 \
    --flux_lora_target all --optimizer adamw --seed 3 --base_model_precision "$1" \
    --output_dir "$out" >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
  awk '{print $1 + $2}' "$tmp/t"
}
precs=(no_change bf16 int8-quanto int8-torchao)
declare -A per
for r in $(seq "$ROUNDS"); do
  for p in "${precs[@]}"; do
    a=$(cpu "$p" 2) b=$(cpu "$p" 10)
    per[$p]="${per[$p]:-} $(echo "$a $b" | awk '{printf "%.4f", ($2 - $1) / 8}')"
  done
done
for p in "${precs[@]}"; do
  echo "$p ${per[$p]}" | /usr/bin/python3 -c '
import json, statistics, sys
w = sys.stdin.read().split(); v = [float(x) for x in w[1:]]
print(json.dumps({"base_model_precision": w[0], "cpu_s_per_step": v, "median": statistics.median(v)}))'
done | tee "$tmp/all.jsonl"
/usr/bin/python3 - "$tmp/all.jsonl" <<'PY'
import json, sys
m = {d["base_model_precision"]: d["median"] for d in map(json.loads, open(sys.argv[1]))}
print(json.dumps({"int8-quanto_over_bf16": round(m["int8-quanto"] / m["bf16"], 3),
                  "int8-torchao_over_bf16": round(m["int8-torchao"] / m["bf16"], 3),
                  "bf16_over_float32": round(m["bf16"] / m["no_change"], 3)}))
PY
