#!/usr/bin/env bash
# Does serving a run slow its training? (issue 22: step time with the
# dashboard open <= 1.02x without; docs/performance.md, "Web UI".)
# Runs the same tiny training PAIRS times without and with `ctuner serve`
# answering what an open dashboard asks every second (GET /api/runs,
# /api/runs/NAME, /metrics?since=LAST, /validation, /log?offset — the page's
# poll, from curl so the browser's own rendering does not compete for the
# cores), alternating A/B to share the machine's drift, and prints each run's
# mean step time (metrics.jsonl "seconds", steps 21..N) and the ratio.
#   scripts/bench_serve.sh [path/to/ctuner] [PAIRS=3] [STEPS=300]
set -euo pipefail
CT=$(readlink -f "${1:-build/ctuner}")
pairs=${2:-3} steps=${3:-300}
tmp=$(mktemp -d)
spid=""
trap '[ -n "$spid" ] && kill $spid 2>/dev/null; rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=2
"$CT" dataset synth --out "$tmp/data" --count 32 --seed 3 >/dev/null
mkdir -p "$tmp/root"
cat > "$tmp/backend.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile", "crop": false}]
JSON
"$CT" serve --root "$tmp/root" --port 0 > "$tmp/serve.out" 2>&1 &
spid=$!
for _ in $(seq 50); do grep -q '^serving' "$tmp/serve.out" && break; sleep 0.1; done
U="http://127.0.0.1:$(sed -nE 's/^serving .*:([0-9]+)\/.*/\1/p' "$tmp/serve.out")/api"
train() { # name
  "$CT" train --preset=tiny --resolution=8 --aspect_bucket_alignment=8 --data_backend_config="$tmp/backend.json" \
    --train_batch_size=4 --max_train_steps="$steps" --checkpoint_step_interval=50 --validation_step_interval=50 \
    --validation_prompt="a red circle" --validation_num_inference_steps=4 --seed=7 --resume_from_checkpoint=none \
    --output_dir="$tmp/root/$1" > "$tmp/root/$1.log" 2>&1
}
poll() { # name: the dashboard's requests once a second until the run's log says it ended
  local last=-1 off=0
  while :; do
    curl -s "$U/runs" >/dev/null
    curl -s "$U/runs/$1" >/dev/null
    last=$(curl -s "$U/runs/$1/metrics?since=$last" | sed -nE 's/.*"last_step": (-?[0-9]+).*/\1/p')
    [ -n "$last" ] || last=-1
    curl -s "$U/runs/$1/validation" >/dev/null
    curl -s "$U/runs/$1/log?offset=$off" >/dev/null
    grep -q '"steps"' "$tmp/root/$1.log" 2>/dev/null && break
    sleep 1
  done
}
mean() { # metrics.jsonl -> mean seconds of steps 21..
  awk -F'"seconds": ' '/"loss"/ { split($2, a, ","); n++; if (n > 20) { s += a[1]; k++ } } END { printf "%.5f", s / k }' "$1"
}
echo "pair  without_s  with_s  ratio"
ratios=()
for p in $(seq "$pairs"); do
  train "a$p"
  train "b$p" & tp=$!
  sleep 0.5
  poll "b$p" & pp=$!
  wait $tp
  wait $pp 2>/dev/null || true
  a=$(mean "$tmp/root/a$p/metrics.jsonl") b=$(mean "$tmp/root/b$p/metrics.jsonl")
  r=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.4f", b / a }')
  ratios+=("$r")
  echo "$p     $a    $b  $r"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{ v[NR] = $1 } END { printf "median ratio (with / without): %.4f over %d pairs\n", v[int((NR + 1) / 2)], NR }'
