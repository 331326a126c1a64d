#!/usr/bin/env bash
# Live (make interop): an SDXL run of ctuner against diffusers from PyPI.
# Trains 2 steps on the tiny pipeline (tests/data/sdxl_pipe) with the step
# dump (CTUNER_SDXL_DUMP), checks that step against UNet2DConditionModel +
# DDPMScheduler (scripts/sdxl_train_golden.py check), then loads the run's
# output_dir/pipeline with StableDiffusionXLPipeline.from_pretrained: no
# missing or unexpected U-net key, and its weights are the checkpoint's. A
# model_type lora run's output_dir/pytorch_lora_weights.safetensors loads with
# StableDiffusionXLPipeline.load_lora_weights: no missing or unexpected key
# (diffusers' warnings fail the check), every adapter tensor the file's.
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
"$CT" train --model_family=sdxl --model_type=lora --lora_rank=4 --lora_dropout=0 \
  --pretrained_model_name_or_path=tests/data/sdxl_pipe --data_backend_config="$W/backend.json" --resolution=32 \
  --aspect_bucket_alignment=8 --train_batch_size=2 --disable_progress_bar=true --seed=11 --learning_rate=1e-2 \
  --output_dir="$W/lora" --max_train_steps=2 2> "$W/lora.err"
"$py" - "$W/lora/pytorch_lora_weights.safetensors" <<'PY'
import logging, sys
import torch
from diffusers import StableDiffusionXLPipeline
from safetensors.torch import load_file
path = sys.argv[1]
pipe = StableDiffusionXLPipeline.from_pretrained("tests/data/sdxl_pipe")
msgs = []
class H(logging.Handler):
    def emit(self, r):
        msgs.append(r.getMessage())
lg = logging.getLogger("diffusers")
h = H(level=logging.WARNING)
lg.addHandler(h)
try:
    pipe.load_lora_weights(path, adapter_name="ct")
finally:
    lg.removeHandler(h)
# the text encoders' "No LoRA keys associated to CLIPTextModel..." notes are expected
# (a U-net-only adapter, as SimpleTuner's SDXL LoRA without train_text_encoder)
bad = [m for m in msgs if "unexpected keys" in m.lower() or "missing keys" in m.lower()]
assert not bad, bad
f = load_file(path)
sd = pipe.unet.state_dict()
n = 0
for k, v in f.items():
    assert k.startswith("unet.") and k.endswith((".lora_A.weight", ".lora_B.weight")), k
    mod, ab = k[len("unet."):-len(".lora_A.weight")], k[-len("lora_A.weight"):-len(".weight")]
    q = f"{mod}.{ab}.ct.weight"
    assert q in sd, q
    assert torch.equal(sd[q].float(), v), q
    n += 1
assert n and any(v.abs().max() > 0 for k, v in f.items() if "lora_B" in k)
print(f"sdxl interop: StableDiffusionXLPipeline.load_lora_weights loads the trained LoRA, no missing or unexpected key, {n} adapter tensors = the file's")
PY
