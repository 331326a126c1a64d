#!/usr/bin/env bash
# Health monitoring and webhooks end to end (docs/health.md): the fake NVML
# library (tests/fake/fake_nvml.c) steered by a state file, an HTTP receiver
# on 127.0.0.1 (tests/lib/webhook_receiver.py) recording every request.
#  - a fault injected on rank 1 of 2 ends both ranks promptly with exit code 3,
#    one gpu.fault per faulty GPU, no checkpoint after the fault, and the last
#    checkpoint resumes;
#  - payloads of both webhook types checked field by field, X-API-Key sent and
#    the token in no output;
#  - a receiver that is down, slow (10 s per request) or answering 500 leaves
#    the losses of a run without webhooks unchanged;
#  - NaN/Inf stops and low disk space.
# Usage: tests/cli_health.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
BIN=$(dirname "$CT")
FAKE="$BIN/libnvidia-ml-fake.so"
MPIRUN=(mpirun --oversubscribe --allow-run-as-root)
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
[ -f "$FAKE" ] || { echo "FAIL - $FAKE not built"; exit 1; }
PY=/usr/bin/python3
RECV="$(dirname "$0")/lib/webhook_receiver.py"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$tmp"; }
trap cleanup EXIT

# receiver NAME MODE: starts one, sets $port
receiver() {
  "$PY" "$RECV" "$tmp/$1.port" "$tmp/$1.log" "$2" 10 &
  pids+=($!)
  for _ in $(seq 1 1200); do [ -s "$tmp/$1.port" ] && break; sleep 0.05; done
  port=$(cat "$tmp/$1.port")
}

"$CT" dataset synth --out "$tmp/data" --count 32 --seed 5 --size 32x32 >/dev/null || { echo "FAIL - dataset synth"; exit 1; }
cat > "$tmp/backend.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile", "crop": false}]
JSON
cat > "$tmp/base.json" <<JSON
{"--preset": "tiny", "--resolution": 8, "--aspect_bucket_alignment": 8, "--data_backend_config": "$tmp/backend.json",
 "--learning_rate": 1e-3, "--disable_validation": true, "--seed": 11, "--max_train_steps": 20,
 "--checkpoint_step_interval": 0, "--use_ema": false, "--disable_progress_bar": true,
 "--health_nvml_library": "$FAKE", "--health_poll_interval": 0.05}
JSON
export CTUNER_FAKE_NVML_STATE="$tmp/nvml"
printf 'count 2\n' > "$tmp/nvml"
export CTUNER_JOB_ID=job-health-1
TOKEN=tok-$RANDOM-secret
export CT_TEST_WEBHOOK_TOKEN=$TOKEN

# ---- 1. a fault on rank 1 of 2 ends the job -------------------------------
receiver ok ok
cat > "$tmp/hooks.json" <<JSON
[{"webhook_type": "raw", "callback_url": "http://127.0.0.1:$port/raw", "auth_token": "{env:CT_TEST_WEBHOOK_TOKEN}"},
 {"webhook_type": "discord", "webhook_url": "http://127.0.0.1:$port/discord", "message_prefix": "ctuner test"}]
JSON
run_dir="$tmp/fault"
common=(train --config "$tmp/base.json" --output_dir="$run_dir" --max_train_steps=1000000 --checkpoint_step_interval=10
        --webhook_config="$tmp/hooks.json" --webhook_status_interval=0)
"${MPIRUN[@]}" -np 1 -x OMP_NUM_THREADS=1 -x CUDA_VISIBLE_DEVICES=0 -x CTUNER_FAKE_NVML_STATE -x CTUNER_JOB_ID \
  -x CT_TEST_WEBHOOK_TOKEN "$CT" "${common[@]}" : \
  -np 1 -x OMP_NUM_THREADS=1 -x CUDA_VISIBLE_DEVICES=1 -x CTUNER_FAKE_NVML_STATE -x CTUNER_JOB_ID \
  -x CT_TEST_WEBHOOK_TOKEN "$CT" "${common[@]}" >"$tmp/fault.out" 2>"$tmp/fault.err" &
job=$!
# (waits poll for their event with deadlines of minutes: the ASan pass on a
# loaded 2-core machine is 10x slower)
for _ in $(seq 1 3000); do [ -f "$run_dir/checkpoint-20/.guard" ] && break; kill -0 $job 2>/dev/null || break; sleep 0.1; done
t0=$(date +%s.%N)
printf 'count 2\ngpu 1 ecc_dbe 12\n' > "$tmp/nvml"   # 12 new uncorrectable errors on GPU 1 (rank 1's)
wait $job
rc=$?
t1=$(date +%s.%N)
secs=$("$PY" -c "print(f'{$t1 - $t0:.1f}')")
[ "$rc" = 3 ] && ok "fault on rank 1 of 2: the job exited with code 3 in ${secs} s" ||
  bad "fault: exit $rc after ${secs} s: $(tail -5 "$tmp/fault.err")"
"$PY" -c "import sys; sys.exit(0 if $secs < 30 else 1)" && ok "stopped promptly (${secs} s)" || bad "slow stop: ${secs} s"
grep -q "circuit breaker open" "$tmp/fault.err" && ok "the stop names the circuit breaker" ||
  bad "no breaker message: $(tail -5 "$tmp/fault.err")"
printf 'count 2\n' > "$tmp/nvml"
# the newest guarded checkpoint predates the fault and resumes (one rank, no fault)
last=$(ls -d "$run_dir"/checkpoint-* | sed 's/.*checkpoint-//' | grep -E '^[0-9]+$' | sort -n | tail -1)
steps=$(wc -l < "$run_dir/metrics.jsonl")
[ -f "$run_dir/checkpoint-$last/.guard" ] && [ "$steps" -lt $((last + 10)) ] &&
  ok "no checkpoint after the fault (last checkpoint-$last, $steps steps logged)" || bad "checkpoints after the fault: $last, $steps"
out=$("$CT" train --config "$tmp/base.json" --output_dir="$run_dir" --max_train_steps=$((last + 2)) \
  --checkpoint_step_interval=10 --resume_from_checkpoint=latest 2>"$tmp/res.err")
echo "$out" | grep -q "\"from_step\": $last" && ok "the last checkpoint before the fault resumes (step $last)" ||
  bad "resume after fault: $out $(tail -3 "$tmp/res.err")"

# payloads, field by field
cat > "$tmp/check.py" <<'PY'
import json, re, sys
log, token = sys.argv[1], sys.argv[2]
reqs = [json.loads(l) for l in open(log)]
raw = [r for r in reqs if r["path"] == "/raw"]
dis = [r for r in reqs if r["path"] == "/discord"]
errs = []
def need(c, m):
    if not c: errs.append(m)
ts = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00$")
bodies = []
for r in raw:
    need(r["headers"].get("X-API-Key") == token, "raw request without the X-API-Key token")
    need(r["headers"].get("Content-Type") == "application/json", "raw content type")
    b = json.loads(r["body"]); bodies.append(b)
    need(b["job_id"] == "job-health-1", f"job_id {b.get('job_id')}")
    need(ts.match(b["timestamp"]) is not None, f"timestamp {b['timestamp']}")
    need(b["severity"] in ("critical", "error", "warning", "info", "debug"), "severity")
    need(isinstance(b.get("title"), str) and isinstance(b.get("message"), str), f"title/message in {b['type']}")
for r in dis:
    need("X-API-Key" not in r["headers"], "discord got the raw endpoint's token")
    b = json.loads(r["body"])
    need(list(b) == ["content"] and b["content"].startswith("`(ctuner test)` "), f"discord body {b}")
    need(len(b["content"]) <= 2000, "discord content too long")
types = {}
for b in bodies: types.setdefault(b["type"], []).append(b)
faults = types.get("gpu.fault", [])
need(len(faults) == 1, f"{len(faults)} gpu.fault events (want 1: one faulty GPU)")
for f in faults:
    need(f["severity"] == "critical" and f["title"] == "GPU Fault: ecc_errors", f"fault head {f}")
    ft = f["fault"]
    need(ft["type"] == "ecc_errors" and ft["action_taken"] == "circuit_opened" and ft["rank"] == 1, f"fault {ft}")
    g = ft["gpu"]
    need(g["index"] == 1 and g["name"] == "Fake GPU 1" and g["temperature_celsius"] == 50, f"gpu {g}")
    need(g["ecc_errors_single"] == 0 and g["ecc_errors_double"] == 12, f"ecc {g}")
    need(g["throttle_reasons"] == [] and abs(g["memory_used_percent"] - 12.5) < 1e-9, f"gpu {g}")
    need("exception_type" in ft, "exception_type")
stages = [(b["stage"]["key"], b["stage"]["status"]) for b in types.get("lifecycle.stage", [])]
for want in [("init_data_backend", "running"), ("init_data_backend", "completed"), ("checkpoint_save", "completed"),
             ("training_abort", "failed")]:
    need(want in stages, f"stage {want} missing from {stages}")
for b in types.get("lifecycle.stage", []):
    need(set(b["stage"]) >= {"key", "label", "status"}, f"stage fields {b['stage']}")
st = types.get("training.status", [])
need(len(st) >= 2, "training.status events")
for b in st:
    p = b["progress"]
    need(b["data"]["status"] == "running" and set(p) >= {"current", "total", "percent", "eta_seconds", "metrics"}, f"status {b}")
    need("loss" in p["metrics"], "status loss")
need(any(b["progress"]["current"] > 0 and isinstance(b["progress"]["eta_seconds"], (int, float)) and
         isinstance(b["progress"]["metrics"]["loss"], float) for b in st), "no status with progress, ETA and loss")
cks = types.get("training.checkpoint", [])
need(len(cks) >= 2, "training.checkpoint events")
for b in cks:
    c = b["checkpoint"]
    need(re.search(r"checkpoint-\d+$", c["path"]) and c["is_final"] is False and c["label"].startswith("Checkpoint saved to"), f"checkpoint {c}")
er = types.get("error", [])
need(len(er) == 1 and "circuit breaker" in er[0]["message"] and er[0]["title"].startswith("Training failed"), f"error events {er}")
need(any("GPU Fault: ecc_errors" in json.loads(r["body"])["content"] for r in dis), "discord fault text")
if errs:
    print("; ".join(errs[:6])); sys.exit(1)
print(f"{len(raw)} raw + {len(dis)} discord requests: " + ", ".join(f"{k} {len(v)}" for k, v in sorted(types.items())))
PY
sleep 0.5
if r=$("$PY" "$tmp/check.py" "$tmp/ok.log" "$TOKEN" 2>&1); then ok "payloads: $r"; else bad "payloads: $r"; fi
if grep -rq -- "$TOKEN" "$tmp/fault.out" "$tmp/fault.err" "$tmp/res.err" "$run_dir" 2>/dev/null; then
  bad "the auth token appears in an output or the run directory"
else
  ok "the auth token is in no output, log, metrics or checkpoint"
fi

# ---- 2. receiver down, slow or failing: same losses ------------------------
"$CT" train --config "$tmp/base.json" --output_dir="$tmp/plain" >/dev/null 2>&1 || bad "run without webhooks failed"
receiver slow slow
slow_port=$port
receiver fail fail
fail_port=$port
down_port=$("$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
for spec in "down $down_port" "slow $slow_port" "fail $fail_port"; do
  set -- $spec
  t0=$(date +%s.%N)
  if "$CT" train --config "$tmp/base.json" --output_dir="$tmp/w-$1" --webhook_status_interval=0 \
      --webhook_config="{\"webhook_type\": \"raw\", \"callback_url\": \"http://127.0.0.1:$2/x\"}" >/dev/null 2>"$tmp/w-$1.err"; then
    secs=$("$PY" -c "import time; print(f'{time.time() - $t0:.1f}')")
    if "$PY" -c "
import json, sys
a, b = ([json.loads(l)['loss'] for l in open(d + '/metrics.jsonl')] for d in sys.argv[1:3])
sys.exit(0 if a == b and len(a) == 20 else 1)" "$tmp/plain" "$tmp/w-$1"; then
      ok "receiver $1: same 20 losses as without webhooks, run finished in ${secs} s"
    else
      bad "receiver $1: losses differ"
    fi
  else
    bad "receiver $1: training failed: $(tail -3 "$tmp/w-$1.err")"
  fi
done
[ "$(wc -l < "$tmp/fail.log")" -gt 2 ] && ok "answers 500: retried ($(wc -l < "$tmp/fail.log") requests)" || bad "500 not retried"

# ---- 3. no NVML, NaN/Inf, low disk -----------------------------------------
out=$("$CT" train --config "$tmp/base.json" --health_nvml_library=/nonexistent/libnvidia-ml.so.1 --max_train_steps=2 \
  --output_dir="$tmp/nonvml" 2>&1)
[ "$(echo "$out" | grep -c "no GPU is monitored")" = 1 ] && ok "without NVML: logged once, training unaffected" ||
  bad "no-NVML message: $out"
receiver nan ok
out=$(CTUNER_FAULT_NAN_AT_STEP=3,4,5 "$CT" train --config "$tmp/base.json" --output_dir="$tmp/nan" --max_nonfinite_steps=3 \
  --webhook_config="{\"webhook_type\": \"raw\", \"callback_url\": \"http://127.0.0.1:$port/x\"}" 2>&1)
rc=$?
[ $rc = 3 ] && grep -q 'nonfinite_loss' "$tmp/nan.log" && ok "3 NaN steps in a row: exit 3 and a gpu.fault (nonfinite_loss)" ||
  bad "NaN stop: exit $rc: $(echo "$out" | tail -2)"
out=$("$CT" train --config "$tmp/base.json" --output_dir="$tmp/disk" --checkpoint_step_interval=5 \
  --disk_low_threshold=1000000T 2>&1)
rc=$?
[ $rc = 1 ] && echo "$out" | grep -q "below disk_low_threshold" && [ -z "$(ls -d "$tmp/disk"/checkpoint-* 2>/dev/null)" ] &&
  ok "disk below disk_low_threshold: stopped before writing the checkpoint" || bad "disk check: exit $rc: $(echo "$out" | tail -2)"
# disk_low_action=wait holds every rank at the checkpoint; a fault on rank 1 while they wait still ends the job with 3
printf 'count 2\n' > "$tmp/nvml"
wcommon=(train --config "$tmp/base.json" --output_dir="$tmp/wait" --checkpoint_step_interval=5 --max_train_steps=50
         --disk_low_threshold=1000000T --disk_low_action=wait)
"${MPIRUN[@]}" -np 1 -x OMP_NUM_THREADS=1 -x CUDA_VISIBLE_DEVICES=0 -x CTUNER_FAKE_NVML_STATE "$CT" "${wcommon[@]}" : \
  -np 1 -x OMP_NUM_THREADS=1 -x CUDA_VISIBLE_DEVICES=1 -x CTUNER_FAKE_NVML_STATE "$CT" "${wcommon[@]}" \
  >"$tmp/wait.out" 2>"$tmp/wait.err" &
job=$!
for _ in $(seq 1 3000); do grep -q "below disk_low_threshold" "$tmp/wait.err" && break; kill -0 $job 2>/dev/null || break; sleep 0.1; done
sleep 1
kill -0 $job 2>/dev/null && waiting=1 || waiting=0
printf 'count 2\ngpu 1 temp 93\n' > "$tmp/nvml"
wait $job
rc=$?
printf 'count 2\n' > "$tmp/nvml"
[ $waiting = 1 ] && [ $rc = 3 ] && [ -z "$(ls -d "$tmp/wait"/checkpoint-* 2>/dev/null)" ] &&
  ok "disk_low_action=wait: both ranks wait at the checkpoint; a fault on rank 1 meanwhile ends the job with 3" ||
  bad "wait + fault: waiting $waiting exit $rc: $(tail -3 "$tmp/wait.err")"
out=$("$CT" train --config "$tmp/base.json" --output_dir="$tmp/bad" --webhook_config='{"webhook_type": "slack"}' 2>&1)
rc=$?
[ $rc = 2 ] && echo "$out" | grep -q "webhook_config: .*webhook_type 'slack' is not supported" &&
  ok "a bad webhook_config is refused before training with exit 2 and its reason" || bad "bad webhook_config: exit $rc: $out"
exit $fail
