#!/usr/bin/env bash
# `make demo`: make the synthetic shapes dataset, train the `demo` preset (a
# 1.8 M-parameter MMDiT) on it for a few minutes (examples/demo/config.json),
# write validation grids, then sample 96 held-out prompts (combinations never
# seen in training) and score them with the synthetic judge (colour, shape,
# size, position, background). Each phase prints its wall time.
#   scripts/demo.sh [path/to/ctuner]     DEMO_OUT=dir (default demo-output)
#   DEMO_STEPS=N overrides max_train_steps (for a quick look); DEMO_ARGS adds
#   training options (e.g. DEMO_ARGS=--mixed_precision=bf16).
set -euo pipefail
CT=${1:-build/ctuner}
cd "$(dirname "$0")/.."
export DEMO_OUT=${DEMO_OUT:-demo-output}
start=$(date +%s)
t0=$start
phase_done() { # wall seconds of the phase that just ended
  local now
  now=$(date +%s)
  echo "   ($1: $((now - t0)) s)"
  t0=$now
}
mkdir -p "$DEMO_OUT"
marker="$DEMO_OUT/data/.complete-2000-seed1-64x64"
if [ ! -f "$marker" ]; then
  echo "== 1/4 synthetic dataset: $DEMO_OUT/data"
  rm -rf "$DEMO_OUT/data"
  "$CT" dataset synth --out "$DEMO_OUT/data" --count 2000 --seed 1 --size 64x64
  touch "$marker"
else
  echo "== 1/4 synthetic dataset: reusing $DEMO_OUT/data"
fi
phase_done "dataset"

echo "== 2/4 training (examples/demo/config.json; progress in $DEMO_OUT/run/metrics.jsonl)"
extra=()
[ -n "${DEMO_STEPS:-}" ] && extra+=(--max_train_steps="$DEMO_STEPS")
# shellcheck disable=SC2206
[ -n "${DEMO_ARGS:-}" ] && extra+=($DEMO_ARGS)
# A fresh run each time (resume_from_checkpoint=none): the demo shows training.
"$CT" train --config examples/demo/config.json --resume_from_checkpoint=none "${extra[@]}"
phase_done "training with its validation grids"

echo "== 3/4 sampling 96 held-out prompts from the final EMA weights"
"$CT" dataset prompts --held-out --count 96 --seed 7 > "$DEMO_OUT/heldout_prompts.txt"
rm -rf "$DEMO_OUT/heldout"
"$CT" sample --checkpoint "latest:$DEMO_OUT/run" --ema --prompts-file "$DEMO_OUT/heldout_prompts.txt" \
  --out-dir "$DEMO_OUT/heldout"
phase_done "held-out sampling"

echo "== 4/4 judging them (colour, shape, size, position and background of each image against its prompt)"
"$CT" eval synth --images "$DEMO_OUT/heldout" | tee "$DEMO_OUT/eval.json"
phase_done "judging"

echo
echo "demo finished in $(( $(date +%s) - start )) s. Look at:"
echo "  $DEMO_OUT/run/validation_images/step_*_grid.png   validation grids (rows: prompts in examples/demo/prompts.json)"
echo "  $DEMO_OUT/heldout/                               held-out samples, NNNN.png with the prompt in NNNN.txt"
echo "  $DEMO_OUT/eval.json                              accuracy of each attribute and of all five on them"
echo "  $DEMO_OUT/run/metrics.jsonl                      loss, lr, grad norm per step"
