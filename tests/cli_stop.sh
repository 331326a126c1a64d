#!/usr/bin/env bash
# End-to-end: a run asked to stop (docs/training.md, "Stopping a run").
# SIGTERM to one process mid-run: exit 5, the checkpoint of the step it
# stopped after, and a resume that ends bit-identical to an uninterrupted run.
# Two ranks under mpirun with SIGUSR1 to mpirun: both ranks stop after the
# same step, exit 5, one checkpoint. A signal before the loop (during data
# discovery) still ends the process as by default.
. "$(dirname "$0")/lib/common.sh"
. "$(dirname "$0")/lib/shapes.sh"
export OMP_NUM_THREADS=1
shapes_fixture 16
cat > "$tmp/base.json" <<JSON
{"--preset": "tiny", "--resolution": 16, "--aspect_bucket_alignment": 8, "--data_backend_config": "$tmp/backend.json",
 "--train_batch_size": 2, "--learning_rate": 1e-3, "--seed": 7, "--disable_validation": true, "--use_ema": true}
JSON
steps=40
run() { "$CT" train --config "$tmp/base.json" --max_train_steps=$steps --checkpoint_step_interval=$steps "$@"; }
lines() { [ -f "$1" ] && wc -l < "$1" || echo 0; }
# signal once metrics.jsonl has N lines; wait; echo the exit code. The runs
# signalled are paced (CTUNER_FAULT_STEP_DELAY_MS=50: 50 ms before every step),
# so that the signal comes before their last step even when this shell is
# descheduled on a loaded machine (unpaced, 40 tiny steps take a fraction of a
# second); the wait for the lines has a deadline of minutes (ASan is 10x slower).
signal_at() { # pid sig metrics N
  for _ in $(seq 6000); do [ "$(lines "$3")" -ge "$4" ] && break; kill -0 "$1" 2>/dev/null || break; sleep 0.05; done
  kill -"$2" "$1" 2>/dev/null
  wait "$1"
}

run --output_dir="$tmp/full" >/dev/null 2>"$tmp/full.log" || bad "uninterrupted run: $(tail -3 "$tmp/full.log")"

CTUNER_FAULT_STEP_DELAY_MS=50 "$CT" train --config "$tmp/base.json" --max_train_steps=$steps --checkpoint_step_interval=$steps \
  --output_dir="$tmp/cut" >/dev/null 2>"$tmp/cut.log" & # $! must be ctuner itself, not a subshell
signal_at $! TERM "$tmp/cut/metrics.jsonl" 3
rc=$?
[ $rc = 5 ] && ok "SIGTERM: exit code 5" || bad "SIGTERM: rc $rc: $(tail -3 "$tmp/cut.log")"
k=$(sed -n 's/.*stopped on request after step \([0-9]*\) of.*/\1/p' "$tmp/cut.log")
[ -n "$k" ] && [ "$k" -lt $steps ] && [ -f "$tmp/cut/checkpoint-$k/.guard" ] &&
  ok "stopped after step $k with its checkpoint" || bad "no checkpoint of the stop step '$k': $(ls "$tmp/cut")"
[ "$(lines "$tmp/cut/metrics.jsonl")" = "$k" ] && ok "metrics.jsonl ends at step $k" || bad "metrics lines $(lines "$tmp/cut/metrics.jsonl")"
run --output_dir="$tmp/cut" >/dev/null 2>"$tmp/cut2.log" || bad "resume: $(tail -3 "$tmp/cut2.log")"
grep -q "resumed from .*checkpoint-$k at step $k" "$tmp/cut2.log" && ok "resumed from step $k" || bad "resume: $(grep -i resum "$tmp/cut2.log")"
for f in model ema optimizer; do
  cmp -s "$tmp/full/checkpoint-$steps/$f.safetensors" "$tmp/cut/checkpoint-$steps/$f.safetensors" &&
    ok "$f.safetensors bit-identical to the uninterrupted run" || bad "$f.safetensors differs after stop + resume"
done

# two ranks: SIGUSR1 to mpirun reaches both, which stop after the same step
if command -v mpirun >/dev/null; then
  steps=400
  # (Open MPI's own start-up allocations are not ours to chase under ASan)
  CTUNER_FAULT_STEP_DELAY_MS=50 ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0 mpirun --oversubscribe --allow-run-as-root -np 2 -x CTUNER_FAULT_STEP_DELAY_MS "$CT" train --config "$tmp/base.json" --max_train_steps=$steps \
    --checkpoint_step_interval=$steps --output_dir="$tmp/mp" >/dev/null 2>"$tmp/mp.log" &
  signal_at $! USR1 "$tmp/mp/metrics.jsonl" 3
  rc=$?
  [ $rc = 5 ] && ok "2 ranks, SIGUSR1 to mpirun: exit code 5" || bad "2 ranks: rc $rc: $(grep -v INFO "$tmp/mp.log" | tail -5)"
  k0=$(sed -n 's/.*rank 0 of 2: stopped on request after step \([0-9]*\).*/\1/p' "$tmp/mp.log")
  k1=$(sed -n 's/.*rank 1 of 2: stopped on request after step \([0-9]*\).*/\1/p' "$tmp/mp.log")
  [ -n "$k0" ] && [ "$k0" = "$k1" ] && [ -f "$tmp/mp/checkpoint-$k0/.guard" ] &&
    ok "both ranks stopped after step $k0, its checkpoint written" || bad "ranks stopped at '$k0' and '$k1': $(ls "$tmp/mp")"
else
  skip "2 ranks: no mpirun"
fi

# before the loop (here: blocked reading a FIFO as its data config): the
# signal acts as by default, the process ends instead of waiting for a loop.
# The signal is sent once ctuner has opened the FIFO (a writer's non-blocking
# open succeeds only then), not after a fixed sleep that a slow start outlasts.
mkfifo "$tmp/fifo.json"
"$CT" train --config "$tmp/base.json" --max_train_steps=5 --output_dir="$tmp/early" \
  --data_backend_config="$tmp/fifo.json" >/dev/null 2>&1 &
pid=$!
/usr/bin/python3 - "$tmp/fifo.json" "$pid" <<'PY'
import os, signal, sys, time
end = time.time() + 300
while time.time() < end:
    try:
        fd = os.open(sys.argv[1], os.O_WRONLY | os.O_NONBLOCK)  # ENXIO until a reader has it open
        break
    except OSError:
        time.sleep(0.05)
else:
    sys.exit("ctuner never opened the FIFO")
os.kill(int(sys.argv[2]), signal.SIGTERM)
os.close(fd)
PY
wait $pid
rc=$?
[ $rc = 143 ] && ok "a signal before the loop ends the process (rc 143)" || bad "early signal: rc $rc"
finish
