#!/usr/bin/env bash
# make interop: ctuner's LoRA tools against diffusers + peft (docs/lora.md).
# Trains an adapter on the tiny FLUX.1-dev pipeline (tests/data/flux_pipe/dev),
# exports it (lora export --format comfyui) and merges it (lora merge); then
# scripts/lora_tools_golden.py checks all three with diffusers and writes a
# fresh golden, tests/test_lora_tools.c runs on it, and the committed set
# (tests/data/lora_tools) is re-checked against diffusers.
# Usage: scripts/lora_tools_interop.sh path/to/ctuner WORKDIR [--write tests/data/lora_tools]
set -eu
CT=$1 W=$2 OUT=${4:-}
PIPE=tests/data/flux_pipe/dev
rm -rf "$W" && mkdir -p "$W/set"
"$CT" dataset synth --out "$W/data" --count 8 --seed 5 --size 32x32 >/dev/null
cat > "$W/backend.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$W/data", "caption_strategy": "textfile", "crop": false}]
JSON
# a large learning rate, so the adapter changes the images (21 dB from the base's)
OMP_NUM_THREADS=2 "$CT" train --pretrained_model_name_or_path=$PIPE --model_flavour=dev \
  --data_backend_config="$W/backend.json" --resolution=32 --aspect_bucket_alignment=8 \
  --train_batch_size=2 --output_dir="$W/out" --max_train_steps=6 --checkpoint_step_interval=6 \
  --learning_rate=3e-2 --model_type=lora --lora_rank=2 --lora_alpha=3 --lora_init_type=gaussian \
  --flux_lora_target=all+ffs --lora_dropout=0 --disable_validation=true \
  --disable_progress_bar=true >/dev/null 2>"$W/train.err" || { tail -5 "$W/train.err"; exit 1; }
S=$W/set
cp "$W/out/pytorch_lora_weights.safetensors" "$S/"
"$CT" lora export --format comfyui --pretrained $PIPE --lora "$S/pytorch_lora_weights.safetensors" \
  --out "$S/comfyui.safetensors" >/dev/null
"$CT" lora merge --pretrained $PIPE --lora "$S/pytorch_lora_weights.safetensors" --out "$W/merged" >/dev/null
py=$(scripts/py_deps.sh diffusers)
$py scripts/lora_tools_golden.py --adapter "$S/pytorch_lora_weights.safetensors" \
  --kohya "$S/comfyui.safetensors" --merged "$W/merged" --out "$S/golden.safetensors"
CT_LORA_TOOLS_DATA=$(cd "$S" && pwd) "$(dirname "$CT")/ct_tests" lora_tools
# the committed set: diffusers still computes its golden from its files
C=tests/data/lora_tools
"$CT" lora merge --pretrained $PIPE --lora $C/pytorch_lora_weights.safetensors --out "$W/merged-c" >/dev/null
$py scripts/lora_tools_golden.py --adapter $C/pytorch_lora_weights.safetensors \
  --kohya $C/comfyui.safetensors --merged "$W/merged-c" --check $C/golden.safetensors
if [ "${3:-}" = --write ] && [ -n "$OUT" ]; then
  mkdir -p "$OUT" && cp "$S"/*.safetensors "$OUT/" && echo "wrote $OUT"
fi
