#!/usr/bin/env bash
# make interop: train the tiny FLUX.1-dev pipeline (tests/data/flux_pipe/dev)
# a few steps with ctuner, then diffusers loads every checkpoint's
# transformer/ and the final output_dir/pipeline (scripts/flux_trained_check.py).
# Usage: scripts/flux_trained_interop.sh path/to/ctuner WORKDIR
set -eu
CT=$1 W=$2
rm -rf "$W" && mkdir -p "$W"
"$CT" dataset synth --out "$W/data" --count 8 --seed 5 --size 32x32 >/dev/null
cat > "$W/backend.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$W/data", "caption_strategy": "textfile", "crop": false}]
JSON
"$CT" train --pretrained_model_name_or_path=tests/data/flux_pipe/dev --model_flavour=dev \
  --data_backend_config="$W/backend.json" --resolution=32 --aspect_bucket_alignment=8 --train_batch_size=2 \
  --output_dir="$W/out" --max_train_steps=4 --checkpoint_step_interval=2 --learning_rate=1e-3 \
  --mixed_precision=bf16 --disable_validation=true --disable_progress_bar=true >/dev/null
py=$(scripts/py_deps.sh diffusers)
$py scripts/flux_trained_check.py "$W/out"
