#!/usr/bin/env bash
# Does serving a run slow its training? (issue 22: step time with the
# dashboard open <= 1.02x without; docs/performance.md, "Web UI".)
# Runs the same tiny training PAIRS times without and with `ctuner serve`
# answering what an open dashboard asks every second (GET /api/runs,
# /api/runs/NAME, /metrics?since=LAST, /validation, /log?offset — the page's
# poll, from one Python process so the browser's own rendering does not
# compete for the cores), alternating A/B to share the machine's drift, and
# prints each run's mean step time (metrics.jsonl "seconds", steps 21..N) and
# the ratio; then the server's CPU per poll of a 100,000-step run.
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
poll() { # name: the page's requests once a second (one process, like a browser tab) until the run ends
  /usr/bin/python3 - "$U" "$1" "$tmp/root/$1.log" <<'PY'
import json, os, sys, time, urllib.request
u, name, log = sys.argv[1:4]
get = lambda p: urllib.request.urlopen(u + p).read()
last, off = -1, 0
while True:
    get("/runs"); get("/runs/" + name)
    last = json.loads(get(f"/runs/{name}/metrics?since={last}"))["last_step"]
    get(f"/runs/{name}/validation")
    try: off = json.loads(get(f"/runs/{name}/log?offset={off}"))["offset"]
    except Exception: pass
    if os.path.exists(log) and '"steps"' in open(log).read(): break
    time.sleep(1)
PY
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
# The server's own CPU for one dashboard poll (the five requests above) of a
# long run: a 100,000-step metrics.jsonl, 100 polls; CPU from /proc/PID/stat.
/usr/bin/python3 - "$tmp/root/long" <<'PY'
import json, os, sys
os.makedirs(sys.argv[1], exist_ok=True)
with open(os.path.join(sys.argv[1], "metrics.jsonl"), "w") as f:
    for s in range(1, 100001):
        f.write(json.dumps({"step": s, "epoch": 1, "loss": 1.0 / s, "lr": 1e-4, "grad_norm": 0.5, "seconds": 0.1,
                            "samples_per_s": 40.0, "skipped": False}) + "\n")
PY
cpu() { awk '{ print $14 + $15 }' "/proc/$spid/stat"; }
c0=$(cpu) t0=$(date +%s.%N)
for _ in $(seq 100); do
  curl -s "$U/runs" >/dev/null; curl -s "$U/runs/long" >/dev/null
  curl -s "$U/runs/long/metrics?since=99990" >/dev/null; curl -s "$U/runs/long/validation" >/dev/null
  curl -s "$U/runs/long/log?offset=0" >/dev/null
done
c1=$(cpu) t1=$(date +%s.%N)
awk -v c="$((c1 - c0))" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "server CPU per dashboard poll of a 100,000-step run: %.2f ms (one poll a second: %.2f%% of a core)\n", 1000 * c / hz / 100, 100 * c / hz / 100 }'
[ "$pairs" -gt 0 ] && printf '%s\n' "${ratios[@]}" | sort -n | awk '{ v[NR] = $1 } END { printf "median ratio (with / without): %.4f over %d pairs\n", v[int((NR + 1) / 2)], NR }'
