#!/usr/bin/env bash
# Live (make interop): an SDXL run of ctuner against diffusers from PyPI.
# Trains 2 steps on the tiny pipeline (tests/data/sdxl_pipe) with the step
# dump (CTUNER_SDXL_DUMP), checks that step against UNet2DConditionModel +
# DDPMScheduler (scripts/sdxl_train_golden.py check), then loads the run's
# output_dir/pipeline with StableDiffusionXLPipeline.from_pretrained: no
# missing or unexpected U-net key, and its weights are the checkpoint's.
# Usage: scripts/sdxl_trained_interop.sh path/to/ctuner WORKDIR
set -eu
CT=$1
W=$2
py=$(scripts/py_deps.sh diffusers)
rm -rf "$W" && mkdir -p "$W"
"$CT" dataset synth --out "$W/data" --count 4 --seed 5 --size 32x32 >/dev/null
cat > "$W/backend.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$W/data", "caption_strategy": "textfile", "crop": false}]
JSON
CTUNER_SDXL_DUMP="$W/step.st" "$CT" train --model_family=sdxl --pretrained_model_name_or_path=tests/data/sdxl_pipe \
  --data_backend_config="$W/backend.json" --resolution=32 --aspect_bucket_alignment=8 --train_batch_size=2 \
  --disable_progress_bar=true --seed=11 --learning_rate=1e-3 --snr_gamma=5 --prediction_type=v_prediction \
  --output_dir="$W/run" --max_train_steps=2 2> "$W/train.err"
"$py" scripts/sdxl_train_golden.py check "$W/step.st" tests/data/sdxl_pipe
"$py" - "$W/run" <<'PY'
import sys
import torch
from diffusers import StableDiffusionXLPipeline, UNet2DConditionModel
from safetensors.torch import load_file
run = sys.argv[1]
pipe = StableDiffusionXLPipeline.from_pretrained(run + "/pipeline")
_, info = UNet2DConditionModel.from_pretrained(run + "/pipeline", subfolder="unet", output_loading_info=True)
assert not info["missing_keys"] and not info["unexpected_keys"], info
ck = load_file(run + "/checkpoint-2/unet/diffusion_pytorch_model.safetensors")
sd = pipe.unet.state_dict()
assert set(ck) == set(sd), set(ck) ^ set(sd)
assert all(torch.equal(ck[k], sd[k].float()) for k in ck)
print(f"sdxl interop: StableDiffusionXLPipeline loads the trained pipeline, {len(ck)} U-net tensors = checkpoint-2's")
PY
