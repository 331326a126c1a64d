#!/usr/bin/env bash
# A LoRA end to end on the tiny preset (docs/lora.md): synthetic data, a base
# from three full fine-tuning steps (a stand-in for a pretrained transformer),
# 20 LoRA steps, and the adapter file diffusers loads.
# Usage: examples/lora/run.sh [path/to/ctuner] [OUT]
set -euo pipefail
CT=${1:-build/ctuner}
export LORA_OUT=${2:-/tmp/ctuner-lora}
rm -rf "$LORA_OUT" && mkdir -p "$LORA_OUT"
"$CT" dataset synth --out "$LORA_OUT/data" --count 16 --seed 5 --size 16x16 >/dev/null
cat > "$LORA_OUT/multidatabackend.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$LORA_OUT/data", "caption_strategy": "textfile", "crop": false}]
JSON
"$CT" train --preset=tiny --model_type=full --max_train_steps=3 --train_batch_size=2 \
  --data_backend_config="$LORA_OUT/multidatabackend.json" --resolution=16 --aspect_bucket_alignment=8 \
  --learning_rate=1e-3 --disable_validation=true --output_dir="$LORA_OUT/base" >/dev/null
export LORA_BASE="$LORA_OUT/base/checkpoint-3/model.safetensors"
"$CT" train --config examples/lora/config.json
ls -l "$LORA_OUT/run/pytorch_lora_weights.safetensors"
