#!/usr/bin/env bash
# The collective watchdog end to end (docs/distributed.md, "Watchdog"):
#  - rank 1 of 2 stopped with SIGSTOP after the first checkpoint (as a wedged
#    GPU or a stalled node): with distributed_timeout 15 the job ends within 60 s with exit
#    code 4, rank 0's message names rank 1, the collective and the step, an
#    `error` webhook event says the same, no process is left, no checkpoint
#    is written after the stop and the newest one resumes;
#  - distributed_timeout / nccl_timeout are validated by name, and a process
#    without MPI has no watchdog (a tiny timeout changes nothing).
# Without the watchdog the stopped rank holds the job until the guard below
# (90 s) kills it, and the test fails.
# Usage: tests/cli_watchdog.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
MPIRUN=(mpirun --oversubscribe --allow-run-as-root)
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
command -v mpirun >/dev/null || { echo "FAIL - mpirun not found: run scripts/deps.sh"; exit 1; }
PY=/usr/bin/python3
RECV="$(dirname "$0")/lib/webhook_receiver.py"
pids=()
victim=""
cleanup() {
  [ -n "$victim" ] && kill -CONT "$victim" 2>/dev/null && kill -9 "$victim" 2>/dev/null
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT

"$CT" dataset synth --out "$tmp/data" --count 32 --seed 5 --size 32x32 >/dev/null || { echo "FAIL - dataset synth"; exit 1; }
cat > "$tmp/backend.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile", "crop": false}]
JSON
cat > "$tmp/base.json" <<JSON
{"--preset": "tiny", "--resolution": 8, "--aspect_bucket_alignment": 8, "--data_backend_config": "$tmp/backend.json",
 "--learning_rate": 1e-3, "--disable_validation": true, "--seed": 11, "--max_train_steps": 20,
 "--checkpoint_step_interval": 0, "--use_ema": false, "--disable_progress_bar": true}
JSON

# ---- the key: validated by name; no watchdog without MPI ------------------
for bad_v in "distributed_timeout=0" "nccl_timeout=-5" "distributed_timeout=100000"; do
  "$CT" train --config "$tmp/base.json" --output_dir="$tmp/k" "--$bad_v" >"$tmp/k.out" 2>&1
  rc=$?
  [ "$rc" = 2 ] && grep -q "distributed_timeout" "$tmp/k.out" && ok "--$bad_v refused by name (exit 2)" ||
    bad "--$bad_v: exit $rc: $(tail -2 "$tmp/k.out")"
done
"$CT" train --config "$tmp/base.json" --output_dir="$tmp/single" --max_train_steps=5 --nccl_timeout=0.001 \
  >"$tmp/single.out" 2>&1 && grep -q '"steps": 5' "$tmp/single.out" &&
  ok "one process (no MPI): nccl_timeout 0.001 s changes nothing" || bad "single process: $(tail -3 "$tmp/single.out")"

# ---- rank 1 of 2 stopped mid-run -------------------------------------------
"$PY" "$RECV" "$tmp/hook.port" "$tmp/hook.log" ok &
pids+=($!)
# (waits poll for their event with deadlines of minutes: the ASan pass on a
# loaded 2-core machine is 10x slower)
for _ in $(seq 1 1200); do [ -s "$tmp/hook.port" ] && break; sleep 0.05; done
port=$(cat "$tmp/hook.port")
run="$tmp/run"
"${MPIRUN[@]}" -np 2 -x OMP_NUM_THREADS=1 "$CT" train --config "$tmp/base.json" --train_batch_size=2 \
  --max_train_steps=1000000 --checkpoint_step_interval=10 --distributed_timeout=15 --output_dir="$run" \
  --webhook_config="{\"webhook_type\": \"raw\", \"callback_url\": \"http://127.0.0.1:$port/raw\"}" \
  >"$tmp/run.out" 2>"$tmp/run.err" &
job=$!
pids+=($job)
for _ in $(seq 1 3000); do compgen -G "$run/checkpoint-*/.guard" >/dev/null && break; kill -0 $job 2>/dev/null || break; sleep 0.1; done
for p in $(pgrep -f -- "--output_dir=$run"); do
  [ "$(ps -o comm= -p "$p")" = ctuner ] && tr '\0' '\n' <"/proc/$p/environ" | grep -qx OMPI_COMM_WORLD_RANK=1 &&
    victim=$p
done
[ -n "$victim" ] || { bad "no rank 1 process found: $(tail -3 "$tmp/run.err")"; exit 1; }
kill -STOP "$victim"
t0=$(date +%s.%N)
stopped_at=$(wc -l <"$run/metrics.jsonl")
( for _ in $(seq 1 900); do sleep 0.1; done # the guard
  kill -CONT "$victim"; kill -9 "$victim" $job ) >/dev/null 2>&1 &
guard=$!
wait $job
rc=$?
t1=$(date +%s.%N)
unset 'pids[-1]' # the job, reaped: its pid may be reused (pid_max is 32768 here) before cleanup's kill
kill $guard 2>/dev/null
secs=$("$PY" -c "print(f'{$t1 - $t0:.1f}')")
"$PY" -c "import sys; sys.exit(0 if $secs <= 60 else 1)" && [ "$rc" = 4 ] &&
  ok "rank 1 stopped (SIGSTOP) at about step $stopped_at: the job ended in ${secs} s with exit code 4" ||
  bad "SIGSTOP: exit $rc after ${secs} s: $(tail -5 "$tmp/run.err")"
msg=$(grep "collective watchdog" "$tmp/run.err" | head -1)
echo "$msg" | grep -q "rank 0 of 2: collective watchdog: rank 1 " && echo "$msg" | grep -q "collective #[0-9]* (" &&
  echo "$msg" | grep -q "at step [0-9]" && echo "$msg" | grep -q "distributed_timeout 15 s" &&
  ok "rank 0 names rank 1, the collective and the step: ${msg#*collective watchdog: }" ||
  bad "message: $(tail -5 "$tmp/run.err")"
# (mpirun is gone; a rank it killed may still be on its way out)
for _ in $(seq 1 300); do [ "$(pgrep -f -- "--output_dir=$run" | wc -l)" = 0 ] && break; sleep 0.1; done
left=$(pgrep -f -- "--output_dir=$run" | wc -l)
[ "$left" = 0 ] && ok "no rank is left running (the stopped one included)" || bad "$left process(es) left"
victim=""
# no checkpoint after the stop; the newest guarded one resumes
last=$(ls -d "$run"/checkpoint-*/.guard | sed 's/.*checkpoint-//; s/\/.guard//' | sort -n | tail -1)
[ -n "$last" ] && [ "$last" -le "$stopped_at" ] && ok "newest checkpoint is checkpoint-$last, from before the stop" ||
  bad "checkpoint-$last after the stop at step $stopped_at"
if "$CT" train --config "$tmp/base.json" --train_batch_size=4 --resume_from_checkpoint=latest \
    --max_train_steps=$((last + 2)) --output_dir="$run" >"$tmp/res.out" 2>&1 &&
  grep -q "\"from_step\": $last" "$tmp/res.out"; then
  ok "resumed from checkpoint-$last after the watchdog's stop"
else
  bad "resume: $(tail -3 "$tmp/res.out")"
fi
# the error webhook event carries the message
"$PY" - "$tmp/hook.log" <<'PY' && ok "an error webhook event names rank 1" || bad "webhook: $(tail -c 600 "$tmp/hook.log")"
import json, sys
ev = [json.loads(json.loads(l)["body"]) for l in open(sys.argv[1])]
er = [e for e in ev if e["type"] == "error"]
sys.exit(0 if len(er) == 1 and er[0]["severity"] == "error" and er[0]["rank"] == 0 and
         er[0]["title"] == "Training failed: CT_ERR_TIMEOUT" and
         "collective watchdog: rank 1 " in er[0]["message"] else 1)
PY
exit $fail
