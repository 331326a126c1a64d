#!/usr/bin/env bash
# End-to-end test of report_to tensorboard (docs/tensorboard.md): a tiny run
# of 6 steps that validates and checkpoints at 4 and 6, its checkpoint-6
# deleted (a crash after step 6 was logged), a resume to 8 from
# checkpoint-4; the event files read by scripts/tb_read.py's own reader
# must give tests/data/tensorboard_golden.txt, which TensorBoard's
# EventAccumulator printed for the same run (`make interop` reruns that
# live, and `tensorboard --logdir`): every scalar equal to metrics.jsonl,
# each step once, the repeated steps 5-6 and the orphaned validation image of
# step 6 dropped, PNGs intact, the config as text. Also: the files without
# the purge hold the duplicates (what the session_log START hides); two
# ranks write one file; report_to wandb / none / all and an absolute
# logging_dir.
# Usage: tests/cli_tensorboard.sh path/to/ctuner [--live PYTHON_WITH_TENSORBOARD]
# (CT_TB_REGOLD=1 with --live: rewrite the golden from TensorBoard's reader.)
. "$(dirname "$0")/lib/common.sh"
export OMP_NUM_THREADS=2
root="$(cd "$(dirname "$0")/.." && pwd)"
golden="$root/tests/data/tensorboard_golden.txt"
live_py=""
[ "${2:-}" = "--live" ] && live_py=${3:?--live needs a python with tensorboard}

"$CT" dataset synth --out "$tmp/data" --count 24 --seed 3 >/dev/null || { echo "FAIL - dataset synth"; exit 1; }
cat > "$tmp/backend.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile", "crop": false}]
JSON
cat > "$tmp/base.json" <<JSON
{"--preset": "tiny", "--resolution": 8, "--aspect_bucket_alignment": 8, "--data_backend_config": "$tmp/backend.json",
 "--train_batch_size": 4, "--learning_rate": 1e-3, "--validation_num_inference_steps": 2,
 "--validation_prompt": "a red circle", "--validation_step_interval": 4, "--checkpoint_step_interval": 4,
 "--seed": 7, "--report_to": "tensorboard", "--tracker_project_name": "shapes", "--tracker_run_name": "tiny-run"}
JSON
# The golden's shape, not its values: loss values and PNG hashes move with
# the build (ASan's arithmetic differs in the last bits) and with defaults;
# that every scalar equals metrics.jsonl is checked separately, bit for bit.
shape() { sed -E -e '/^scalar /s/=[-+0-9.eE]+/=#/g' -e 's/sha256 [0-9a-f]+/sha256 #/' "$1"; }
run() { "$CT" train --config "$tmp/base.json" "$@"; }

out="$tmp/out" logs="$tmp/out/logs/shapes"
run --output_dir="$out" --max_train_steps=6 >/dev/null 2>"$tmp/a.log" || bad "first run: $(tail -3 "$tmp/a.log")"
rm -rf "$out/checkpoint-6" # the crash: steps 5-6 were logged, their checkpoint is gone
run --output_dir="$out" --max_train_steps=8 >/dev/null 2>"$tmp/b.log" || bad "resumed run: $(tail -3 "$tmp/b.log")"
grep -q "resumed from .*checkpoint-4 at step 4" "$tmp/b.log" && ok "resumed from checkpoint-4" || bad "no resume from checkpoint-4"
[ "$(ls "$logs" | grep -c '^events\.out\.tfevents\.')" = 2 ] && ok "two event files in logging_dir/tracker_project_name" ||
  bad "event files: $(ls -R "$tmp/out/logs" 2>&1)"
grep -q "tensorboard --logdir $logs" "$tmp/b.log" && ok "the log names the directory to view" || bad "no tensorboard line in the log"

# ---- what a reader sees: the golden TensorBoard's EventAccumulator printed ----
/usr/bin/python3 "$root/scripts/tb_read.py" --reader builtin "$logs" --metrics "$out/metrics.jsonl" >"$tmp/seen.txt" 2>&1 &&
  ok "every metrics.jsonl number equals its scalar (own reader)" || bad "metrics vs scalars: $(tail -3 "$tmp/seen.txt")"
if diff <(shape "$golden") <(shape "$tmp/seen.txt") >"$tmp/diff.txt"; then ok "event files read as the golden"; else
  bad "event files differ from $golden:"; head -20 "$tmp/diff.txt"; fi
/usr/bin/python3 "$root/scripts/tb_read.py" --reader builtin --no-purge "$logs" >"$tmp/raw.txt" 2>&1
grep -q '^scalar loss: 1=.* 6=.* 5=.* 6=.* 7=.* 8=' "$tmp/raw.txt" && grep -q '^image validation/grid: step 6 ' "$tmp/raw.txt" &&
  ok "the files hold steps 5-6 twice and the orphaned image of step 6 (the START hides them)" ||
  bad "no duplicates in the raw files: $(grep '^scalar loss' "$tmp/raw.txt")"
if [ -n "$live_py" ]; then
  [ "${CT_TB_REGOLD:-}" = 1 ] && "$live_py" "$root/scripts/tb_read.py" --reader tensorboard "$logs" \
    --metrics "$out/metrics.jsonl" >"$golden" 2>/dev/null && echo "golden rewritten: $golden"
  "$live_py" "$root/scripts/tb_read.py" --reader tensorboard "$logs" --metrics "$out/metrics.jsonl" >"$tmp/tb.txt" 2>"$tmp/tb.err" &&
    diff <(shape "$golden") <(shape "$tmp/tb.txt") >"$tmp/diff2.txt" && ok "TensorBoard's EventAccumulator reads the golden (live)" ||
    { bad "TensorBoard's reader differs:"; head -20 "$tmp/diff2.txt" "$tmp/tb.err"; }
  "$live_py" "$root/scripts/tb_read.py" --serve "$logs" >"$tmp/serve.txt" 2>&1 &&
    grep -q 'loss at steps \[1, 2, 3, 4, 5, 6, 7, 8\]' "$tmp/serve.txt" &&
    ok "tensorboard --logdir serves each step once (live): $(cat "$tmp/serve.txt")" || bad "tensorboard --logdir: $(cat "$tmp/serve.txt")"
fi

# ---- two ranks: rank 0 alone writes, one file ----
if command -v mpirun >/dev/null; then
  # (Open MPI's own start-up allocations are not ours to chase under ASan)
  ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0 \
    mpirun --oversubscribe --allow-run-as-root -np 2 -x OMP_NUM_THREADS=1 "$CT" train --config "$tmp/base.json" \
    --output_dir="$tmp/d" --max_train_steps=2 --train_batch_size=2 --disable_validation=true >/dev/null 2>"$tmp/d.log" &&
    [ "$(ls "$tmp/d/logs/shapes" | grep -c '^events\.out\.tfevents\.')" = 1 ] &&
    /usr/bin/python3 "$root/scripts/tb_read.py" "$tmp/d/logs/shapes" --metrics "$tmp/d/metrics.jsonl" >"$tmp/d.txt" 2>&1 &&
    grep -q '^scalar loss: 1=[^ ]* 2=[^ ]*$' "$tmp/d.txt" && ok "2 ranks: one event file (rank 0), steps 1-2 as metrics.jsonl" ||
    bad "2 ranks: $(ls "$tmp/d/logs/shapes" 2>&1; tail -n 3 "$tmp/d.log" "$tmp/d.txt")"
fi

# ---- model_type vae: its loss parts, PSNR and reconstruction grid ----
"$CT" dataset synth --out "$tmp/vdata" --count 16 --seed 5 --size 16x16 >/dev/null
cat > "$tmp/vbackend.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$tmp/vdata", "caption_strategy": "textfile", "crop": false}]
JSON
echo '{"_class_name": "AutoencoderKL", "block_out_channels": [8, 16], "layers_per_block": 1, "latent_channels": 4, "norm_num_groups": 4}' >"$tmp/vae.json"
"$CT" train --model_type=vae --vae_config="$tmp/vae.json" --resolution=16 --aspect_bucket_alignment=8 \
  --data_backend_config="$tmp/vbackend.json" --train_batch_size=4 --seed=3 --max_train_steps=4 --validation_step_interval=2 \
  --vae_stats_images=4 --report_to=tensorboard --output_dir="$tmp/v" >/dev/null 2>"$tmp/v.log" &&
  /usr/bin/python3 "$root/scripts/tb_read.py" "$tmp/v/logs/simpletuner" --metrics "$tmp/v/metrics.jsonl" >"$tmp/v.txt" 2>&1 &&
  grep -q '^scalar validation_psnr: 2=[^ ]* 4=[^ ]*$' "$tmp/v.txt" && grep -q '^scalar kl: 1=' "$tmp/v.txt" &&
  [ "$(grep -c '^image validation/reconstruction: step [24] [0-9]*x32 png decodes' "$tmp/v.txt")" = 2 ] &&
  ok "vae: rec_loss, kl, validation_psnr and the reconstruction grids, default project directory" ||
  bad "vae: $(tail -3 "$tmp/v.log"; cat "$tmp/v.txt")"

# ---- the other report_to values ----
run --output_dir="$tmp/w" --max_train_steps=1 --disable_validation=true --report_to=wandb >/dev/null 2>"$tmp/w.log" &&
  [ "$(grep -c 'report_to wandb: ctuner does not build that tracker' "$tmp/w.log")" = 1 ] && [ ! -d "$tmp/w/logs" ] &&
  ok "report_to wandb: one warning, no event files" || bad "report_to wandb: $(grep -i 'report_to\|tensorboard' "$tmp/w.log")"
run --output_dir="$tmp/n" --max_train_steps=1 --disable_validation=true --report_to=none >/dev/null 2>"$tmp/n.log" &&
  [ ! -d "$tmp/n/logs" ] && ! grep -qi 'tensorboard\|report_to' "$tmp/n.log" && ok "report_to none: nothing" ||
  bad "report_to none: $(grep -i 'report_to\|tensorboard' "$tmp/n.log")"
run --output_dir="$tmp/l" --max_train_steps=1 --disable_validation=true --report_to=all --logging_dir="$tmp/abs" \
  --tracker_project_name=proj >/dev/null 2>"$tmp/l.log" && ls "$tmp/abs/proj/" | grep -q '^events\.out\.tfevents\.' &&
  [ ! -d "$tmp/l/logs" ] && grep -q 'report_to all: only tensorboard' "$tmp/l.log" &&
  ok "report_to all + absolute logging_dir: event files in logging_dir/proj, one warning" ||
  bad "report_to all: $(ls -R "$tmp/abs" "$tmp/l" 2>&1 | head; grep -i report_to "$tmp/l.log")"
if out2=$(run --output_dir="$tmp/x" --max_train_steps=1 --report_to=tensorbored 2>&1); then bad "report_to tensorbored accepted"
else echo "$out2" | grep -q "report_to must be none, tensorboard" && ok "unknown tracker refused by name" || bad "message: $out2"; fi
if out2=$(run --output_dir="$tmp/y" --max_train_steps=1 --tracker_project_name=../up 2>&1); then bad "tracker_project_name ../up accepted"
else echo "$out2" | grep -q "tracker_project_name '../up' names one directory" && [ ! -d "$tmp/y/up" ] &&
  ok "a tracker_project_name leaving logging_dir refused" || bad "message: $out2"; fi
exit $fail
