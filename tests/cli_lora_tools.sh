#!/usr/bin/env bash
# LoRA tools end to end (docs/lora.md): a model_type lora run's checkpoint
# samples as its base with its adapter (= sample --checkpoint BASE --lora FILE,
# bit for bit; --lora_scale 0 = the base; --ema); lora merge writes a diffusers
# directory whose adapted tensors (and only those) moved (checkpoint export
# of the LoRA checkpoint writes the same); lora export
# --format comfyui writes kohya keys, which sample --lora and lora merge read
# back as the peft file; bad input is refused naming it.
# (The numbers against diffusers: tests/test_lora_tools.c.)
# Usage: tests/cli_lora_tools.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
export OMP_NUM_THREADS=2
. "$(dirname "$0")/lib/shapes.sh"
shapes_fixture 8
common=(--data_backend_config="$tmp/backend.json" --resolution=16 --aspect_bucket_alignment=8
  --seed=7 --preset=tiny --optimizer=adamw --learning_rate=1e-2 --train_batch_size=2
  --disable_progress_bar=true --disable_validation=true)
"$CT" train "${common[@]}" --max_train_steps=3 --output_dir="$tmp/full" >/dev/null 2>"$tmp/e" ||
  { echo "FAIL - base: $(tail -3 "$tmp/e")"; exit 1; }
B=$tmp/full/checkpoint-3
"$CT" train "${common[@]}" --max_train_steps=2 --output_dir="$tmp/lora" --model_type=lora \
  --lora_rank=4 --lora_alpha=8 --flux_lora_target=all --lora_dropout=0 --use_ema=true \
  --ema_decay=0.5 --pretrained_model_path="$B/model.safetensors" >/dev/null 2>"$tmp/e" ||
  { echo "FAIL - lora run: $(tail -3 "$tmp/e")"; exit 1; }
L=$tmp/lora/checkpoint-2
A=$L/pytorch_lora_weights.safetensors
s=(--prompt "red" --steps 2 --width 16 --height 16)

"$CT" sample --checkpoint "$L" "${s[@]}" --out "$tmp/run.png" >/dev/null 2>"$tmp/e" &&
  "$CT" sample --checkpoint "$B" --lora "$A" "${s[@]}" --out "$tmp/base_lora.png" >/dev/null &&
  "$CT" sample --checkpoint "$B" "${s[@]}" --out "$tmp/base.png" >/dev/null &&
  "$CT" sample --checkpoint "$L" --lora_scale 0 "${s[@]}" --out "$tmp/run0.png" >/dev/null &&
  "$CT" sample --checkpoint "$L" --ema "${s[@]}" --out "$tmp/ema.png" >/dev/null ||
  bad "sampling a LoRA checkpoint: $(tail -2 "$tmp/e")"
if cmp -s "$tmp/run.png" "$tmp/base_lora.png" && cmp -s "$tmp/run0.png" "$tmp/base.png" &&
  ! cmp -s "$tmp/run.png" "$tmp/base.png" && [ -s "$tmp/ema.png" ]; then
  ok "a LoRA run's checkpoint samples its base + adapter (= --checkpoint BASE --lora FILE; scale 0 = base; --ema)"
else
  bad "LoRA checkpoint sampling differs from base + adapter"
fi

if "$CT" lora merge --checkpoint "$L" --out "$tmp/merged" >"$tmp/o" 2>"$tmp/e" &&
  "$CT" checkpoint export --checkpoint "$B" --format diffusers --out "$tmp/base_d" >/dev/null &&
  /usr/bin/python3 - "$tmp/merged" "$tmp/base_d" <<'PY'; then
import json, struct, sys
import numpy as np
def load(d):
    b = open(d + "/diffusion_pytorch_model.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], np.float32)
            for k, v in h.items() if k != "__metadata__"}
m, b = load(sys.argv[1]), load(sys.argv[2])
moved = sorted(k for k in b if not np.array_equal(m[k], b[k]))
adapted = ("to_q.", "to_k.", "to_v.", "add_q_proj.", "add_k_proj.", "add_v_proj.", "to_out.0.",
           "to_add_out.")  # flux_lora_target all; weights only
want = sorted(k for k in b if k.endswith(".weight") and any(a in k for a in adapted))
sys.exit(0 if set(m) == set(b) and moved == want else 1)
PY
  ok "lora merge: a diffusers directory; exactly the adapted weights moved ($(grep -o '"adapters": [0-9]*' "$tmp/o"))"
else
  bad "lora merge: $(tail -2 "$tmp/e")"
fi
"$CT" checkpoint export --checkpoint "$L" --format diffusers --out "$tmp/exported" >/dev/null 2>"$tmp/e" &&
  diff -r "$tmp/exported" "$tmp/merged" >/dev/null &&
  ok "checkpoint export of a LoRA run's checkpoint writes the merged model (= lora merge)" ||
  bad "checkpoint export of a LoRA checkpoint: $(tail -2 "$tmp/e")"

if "$CT" lora export --format comfyui --checkpoint "$L" --out "$tmp/k.safetensors" >/dev/null 2>"$tmp/e" &&
  /usr/bin/python3 - "$tmp/k.safetensors" <<'PY'; then
import json, struct, sys
b = open(sys.argv[1], "rb").read()
h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
keys = [k for k in h if k != "__metadata__"]
mods = {k.rsplit(".", 2)[0] if k.endswith(".weight") else k.rsplit(".", 1)[0] for k in keys}
ok = all(k.startswith("lora_unet_") for k in keys) and len(keys) == 3 * len(mods)
ok &= "lora_unet_double_blocks_0_img_attn_qkv" in mods
ok &= h["lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight"]["shape"][0] == 12  # q, k, v x 4
sys.exit(0 if ok else 1)
PY
  ok "lora export --format comfyui: kohya keys (down, up, alpha per BFL weight; qkv rank 3 x 4)"
else
  bad "lora export: $(tail -2 "$tmp/e")"
fi
# the kohya file read back (ct_lora_merge_any): sample and merge it as the peft file
"$CT" sample --checkpoint "$B" --lora "$tmp/k.safetensors" "${s[@]}" --out "$tmp/kohya.png" \
  >/dev/null 2>"$tmp/e" && /usr/bin/python3 - "$tmp/kohya.png" "$tmp/base_lora.png" <<'PY' &&
import sys
import numpy as np
from PIL import Image
a, b = (np.asarray(Image.open(p), np.int16) for p in sys.argv[1:])
sys.exit(0 if a.shape == b.shape and np.abs(a - b).max() <= 1 else 1)  # float32 rounding: 1 level
PY
  ok "sample --lora of the kohya export = of the peft file (pixels within 1 level)" ||
  bad "sample --lora kohya: $(tail -2 "$tmp/e")"
if "$CT" lora merge --checkpoint "$B" --lora "$tmp/k.safetensors" --out "$tmp/merged_k" >"$tmp/o" \
  2>"$tmp/e" && grep -q '"layout": "kohya/bfl/lycoris"' "$tmp/o" &&
  /usr/bin/python3 - "$tmp/merged_k" "$tmp/merged" >"$tmp/w" <<'PY'; then
import json, struct, sys
import numpy as np
def load(d):
    b = open(d + "/diffusion_pytorch_model.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], np.float32)
            for k, v in h.items() if k != "__metadata__"}
k, p = load(sys.argv[1]), load(sys.argv[2])
worst = max(float(np.abs(k[n] - p[n]).max() / max(np.abs(p[n]).max(), 1e-30)) for n in p)
print(worst)
sys.exit(0 if set(k) == set(p) and worst < 1e-6 else 1)
PY
  ok "lora merge of the kohya export = of the peft file (worst $(cat "$tmp/w") rel.)"
else
  bad "lora merge kohya: $(tail -2 "$tmp/e")"
fi

# errors name the problem
expect() { # exit-code grep-pattern what -- command...
  local code=$1 pat=$2 what=$3
  shift 4
  "$@" >/dev/null 2>"$tmp/e"
  local rc=$?
  if [ $rc -eq "$code" ] && grep -q -- "$pat" "$tmp/e"; then ok "$what"; else
    bad "$what: exit $rc, $(tail -2 "$tmp/e")"
  fi
}
other=tests/data/lora/all/pytorch_lora_weights.safetensors
expect 1 "another model\|not an adapter" "an adapter for another model is refused, naming the file" -- \
  "$CT" sample --checkpoint "$B" --lora "$other" "${s[@]}" --out "$tmp/x.png"
expect 1 "not a peft adapter file" "lora export of a kohya file says it is one already" -- \
  "$CT" lora export --format comfyui --checkpoint "$B" --lora "$tmp/k.safetensors" --out "$tmp/k2.safetensors"
expect 2 "lora_scale" "a lora_scale that is not a number is refused" -- \
  "$CT" lora merge --checkpoint "$L" --lora_scale nan --out "$tmp/m3"
expect 2 "lora_scale" "sample --lora_scale inf is refused" -- \
  "$CT" sample --checkpoint "$L" --lora_scale inf "${s[@]}" --out "$tmp/x.png"
expect 1 "no adapter" "merge without an adapter says so" -- \
  "$CT" lora merge --checkpoint "$B" --out "$tmp/m4"
expect 2 "comfyui" "export names its format" -- \
  "$CT" lora export --format bfl --checkpoint "$L" --out "$tmp/x.safetensors"
exit $fail
