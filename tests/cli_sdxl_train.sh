#!/usr/bin/env bash
# End-to-end: `ctuner train --model_family sdxl` on the tiny
# StableDiffusionXLPipeline directory diffusers saved (tests/data/sdxl_pipe,
# scripts/sdxl_tiny_pipeline.py): the U-net's full fine-tune trains (loss
# finite, lower at the end), its checkpoints hold unet/ in diffusers' layout
# and output_dir/pipeline is the trained pipeline (every tensor of the source
# U-net, trained; it trains again from there); a resumed run ends bit for bit
# where an uninterrupted one does (EMA too); one step equals diffusers'
# UNet2DConditionModel + DDPMScheduler on the same inputs (the goldens of
# scripts/sdxl_train_golden.py: epsilon with min-SNR; v_prediction with
# offset noise, input perturbation, a dropped caption and a random crop);
# 2 ranks ZeRO-1 equal 1 rank; model_type lora trains peft adapters on the
# frozen U-net (checkpoints and output_dir hold pytorch_lora_weights.safetensors
# alone, resume bit for bit, init_lora, regularisation data's target the
# U-net's own prediction); validation images (and TensorBoard's) are the pipeline's
# sampler over the training U-net (the same seed, the same bytes; zero
# adapters: `ctuner sample`'s image); what the U-net cannot do yet is refused
# by name.
# Usage: tests/cli_sdxl_train.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
P=tests/data/sdxl_pipe
G=tests/data/sdxl_train
"$CT" dataset synth --out "$tmp/data" --count 8 --seed 5 --size 32x32 >/dev/null || { echo "FAIL - synth"; exit 1; }
"$CT" dataset synth --out "$tmp/data2" --count 8 --seed 7 --size 48x40 >/dev/null || { echo "FAIL - synth"; exit 1; }
cat > "$tmp/backend.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile", "crop": false}]
JSON
cat > "$tmp/backend2.json" <<JSON
[{"id": "shapes2", "type": "local", "instance_data_dir": "$tmp/data2", "caption_strategy": "textfile", "crop": true, "crop_style": "random", "crop_aspect": "square"}]
JSON
COMMON=(--model_family=sdxl --pretrained_model_name_or_path=$P --data_backend_config="$tmp/backend.json" --resolution=32
  --aspect_bucket_alignment=8 --train_batch_size=2 --disable_progress_bar=true --seed=3 --learning_rate=1e-3 --num_threads=2)

# the tensors (name dtype shape) of a safetensors file, sorted
keys() {
  python3 - "$1" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
for k in sorted(h):
    if k != "__metadata__":
        print(k, h[k]["dtype"], h[k]["shape"])
PY
}

# ---- 12 steps, EMA, checkpoints every 6: trains, the final pipeline ----
"$CT" train "${COMMON[@]}" --output_dir="$tmp/a" --max_train_steps=12 --checkpoint_step_interval=6 --use_ema=true \
  > "$tmp/a.out" 2> "$tmp/a.err"; rc=$?
[ $rc -eq 0 ] && grep -q "sdxl: text 77 x 80 + pooled 40" "$tmp/a.err" && ls "$tmp/a/cache/text/"*.st >/dev/null 2>&1 &&
  ls "$tmp/a/cache/vae/shapes/"* >/dev/null 2>&1 &&
  ok "trains 12 steps; text (77 x 80 + pooled 40) and latents cached" || bad "train: rc=$rc $(tail -5 "$tmp/a.err")"
python3 - "$tmp/a/metrics.jsonl" <<'PY' && ok "loss finite every step and lower over the last 4 steps than the first 4" || bad "loss: $(grep -o '"loss": [^,]*' "$tmp/a/metrics.jsonl" | tr '\n' ' ')"
import json, math, sys
L = [json.loads(l)["loss"] for l in open(sys.argv[1]) if '"loss"' in l and '"step"' in l]
assert len(L) == 12 and all(math.isfinite(x) for x in L), L
assert sum(L[-4:]) < sum(L[:4]), L
PY
[ -f "$tmp/a/checkpoint-6/unet/config.json" ] && [ -f "$tmp/a/checkpoint-12/unet/diffusion_pytorch_model.safetensors" ] &&
  [ -f "$tmp/a/checkpoint-12/ema.safetensors" ] && ok "each checkpoint holds unet/ (diffusers layout) and the EMA" ||
  bad "checkpoint: $(ls -R "$tmp/a/checkpoint-12" | head)"
keys $P/unet/diffusion_pytorch_model.safetensors > "$tmp/src.keys"
keys "$tmp/a/pipeline/unet/diffusion_pytorch_model.safetensors" > "$tmp/out.keys"
[ -f "$tmp/a/pipeline/model_index.json" ] && [ -d "$tmp/a/pipeline/text_encoder_2" ] && [ -d "$tmp/a/pipeline/tokenizer_2" ] &&
  [ -d "$tmp/a/pipeline/vae" ] && [ -d "$tmp/a/pipeline/scheduler" ] && cmp -s "$tmp/src.keys" "$tmp/out.keys" &&
  ! cmp -s $P/unet/diffusion_pytorch_model.safetensors "$tmp/a/pipeline/unet/diffusion_pytorch_model.safetensors" &&
  ok "output_dir/pipeline: a StableDiffusionXLPipeline directory, its unet/ every tensor of the source ($(wc -l < "$tmp/src.keys")), trained" ||
  bad "pipeline: $(ls -la "$tmp/a/pipeline"); $(diff "$tmp/src.keys" "$tmp/out.keys" | head -5)"
"$CT" train "${COMMON[@]}" --pretrained_model_name_or_path="$tmp/a/pipeline" --output_dir="$tmp/p" --max_train_steps=1 \
  --checkpoint_step_interval=0 > /dev/null 2> "$tmp/p.err" &&
  ok "the trained pipeline trains again (its U-net loads with no missing or unexpected tensor)" || bad "retrain: $(tail -3 "$tmp/p.err")"

# ---- resume: 6 steps, then on to 12 from checkpoint-6: run a's files bit for bit ----
"$CT" train "${COMMON[@]}" --output_dir="$tmp/b" --max_train_steps=6 --checkpoint_step_interval=6 --use_ema=true \
  > /dev/null 2> "$tmp/b.err" &&
  "$CT" train "${COMMON[@]}" --output_dir="$tmp/b" --max_train_steps=12 --checkpoint_step_interval=6 --use_ema=true \
    > /dev/null 2>> "$tmp/b.err"; rc=$?
same=1
for f in unet/diffusion_pytorch_model.safetensors optimizer.safetensors ema.safetensors; do
  cmp -s "$tmp/a/checkpoint-12/$f" "$tmp/b/checkpoint-12/$f" || same=0
done
[ $rc -eq 0 ] && [ $same -eq 1 ] && grep -q "resumed from .*checkpoint-6" "$tmp/b.err" &&
  ok "resume: 6 + 6 steps give run a's U-net, optimizer state and EMA bit for bit" || bad "resume: rc=$rc same=$same $(tail -3 "$tmp/b.err")"

# ---- model_type lora: peft adapters on the frozen U-net ----
LORA=(--model_type=lora --lora_rank=4 --lora_alpha=4 --learning_rate=1e-2)
src_sum=$(cksum < $P/unet/diffusion_pytorch_model.safetensors)
"$CT" train "${COMMON[@]}" "${LORA[@]}" --output_dir="$tmp/la" --max_train_steps=12 --checkpoint_step_interval=6 --use_ema=true \
  > /dev/null 2> "$tmp/la.err"; rc=$?
[ $rc -eq 0 ] && grep -q "sdxl: LoRA on the U-net of .* rank 4, alpha 4" "$tmp/la.err" &&
  grep -q "lora_dropout 0.1 is not applied" "$tmp/la.err" &&
  ok "model_type lora trains 12 steps (SimpleTuner's default lora_dropout: one warning)" || bad "lora: rc=$rc $(tail -5 "$tmp/la.err")"
python3 - "$tmp/la/metrics.jsonl" <<'PY' && ok "LoRA: loss finite every step and lower over the last 4 steps than the first 4" || bad "lora loss: $(grep -o '"loss": [^,]*' "$tmp/la/metrics.jsonl" | tr '\n' ' ')"
import json, math, sys
L = [json.loads(l)["loss"] for l in open(sys.argv[1]) if '"loss"' in l and '"step"' in l]
assert len(L) == 12 and all(math.isfinite(x) for x in L), L
assert sum(L[-4:]) < sum(L[:4]), L
PY
keys "$tmp/la/checkpoint-12/pytorch_lora_weights.safetensors" > "$tmp/la.keys"
nk=$(wc -l < "$tmp/la.keys")
[ -f "$tmp/la/checkpoint-6/pytorch_lora_weights.safetensors" ] && [ -f "$tmp/la/checkpoint-12/ema.safetensors" ] &&
  [ ! -e "$tmp/la/checkpoint-12/unet" ] && [ ! -e "$tmp/la/pipeline" ] && [ "$nk" -gt 0 ] &&
  ! grep -qv '^unet\..*\.lora_[AB]\.weight F32 ' "$tmp/la.keys" &&
  cmp -s "$tmp/la/checkpoint-12/pytorch_lora_weights.safetensors" "$tmp/la/pytorch_lora_weights.safetensors" &&
  [ "$(cksum < $P/unet/diffusion_pytorch_model.safetensors)" = "$src_sum" ] &&
  ok "LoRA checkpoints hold the adapter alone ($nk unet.*.lora_A/B tensors, no unet/), output_dir has it; the U-net file untouched" ||
  bad "lora checkpoint: $(ls "$tmp/la" "$tmp/la/checkpoint-12"); $(grep -v '^unet\..*\.lora_[AB]\.weight F32 ' "$tmp/la.keys" | head -3)"
python3 - "$tmp/la/pytorch_lora_weights.safetensors" <<'PY' && ok "LoRA: every lora_B trained away from its zero init" || bad "lora_B still zero"
import array, json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
B = [k for k in h if k.endswith("lora_B.weight")]
assert B
for k in B:
    a, e = h[k]["data_offsets"]
    assert any(v != 0 for v in array.array("f", b[8 + n + a:8 + n + e])), k
PY
"$CT" train "${COMMON[@]}" "${LORA[@]}" --output_dir="$tmp/lb" --max_train_steps=6 --checkpoint_step_interval=6 --use_ema=true \
  > /dev/null 2> "$tmp/lb.err" &&
  "$CT" train "${COMMON[@]}" "${LORA[@]}" --output_dir="$tmp/lb" --max_train_steps=12 --checkpoint_step_interval=6 --use_ema=true \
    > /dev/null 2>> "$tmp/lb.err"; rc=$?
same=1
for f in pytorch_lora_weights.safetensors optimizer.safetensors ema.safetensors; do
  cmp -s "$tmp/la/checkpoint-12/$f" "$tmp/lb/checkpoint-12/$f" || same=0
done
[ $rc -eq 0 ] && [ $same -eq 1 ] && grep -q "resumed from .*checkpoint-6" "$tmp/lb.err" &&
  ok "LoRA resume: 6 + 6 steps give run la's adapter, optimizer state and EMA bit for bit" || bad "lora resume: rc=$rc same=$same $(tail -3 "$tmp/lb.err")"
"$CT" train "${COMMON[@]}" "${LORA[@]}" --output_dir="$tmp/li" --max_train_steps=1 --checkpoint_step_interval=0 \
  --init_lora="$tmp/la/pytorch_lora_weights.safetensors" --learning_rate=0 > /dev/null 2> "$tmp/li.err"; rc=$?
[ $rc -eq 0 ] && cmp -s "$tmp/la/pytorch_lora_weights.safetensors" "$tmp/li/pytorch_lora_weights.safetensors" &&
  ok "init_lora: the adapters start from the file (learning rate 0 saves it back byte for byte)" || bad "init_lora: rc=$rc $(tail -3 "$tmp/li.err")"

# is_regularisation_data: the target is the U-net's own prediction, adapters detached; B = 0 at
# the start, so the loss is exactly 0, no gradient reaches the adapters and B stays zero
cat > "$tmp/reg.json" <<JSON
[{"id": "prior", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile", "crop": false, "is_regularisation_data": true}]
JSON
"$CT" train "${COMMON[@]}" "${LORA[@]}" --data_backend_config="$tmp/reg.json" --output_dir="$tmp/lr" --max_train_steps=3 \
  --checkpoint_step_interval=0 > /dev/null 2> "$tmp/lr.err"; rc=$?
python3 - "$tmp/lr" <<'PY' && [ $rc -eq 0 ] &&
import array, json, struct, sys
L = [(x["loss"], x["grad_norm"]) for x in map(json.loads, open(sys.argv[1] + "/metrics.jsonl")) if "loss" in x]
assert len(L) == 3 and all(l == 0 and g == 0 for l, g in L), L
b = open(sys.argv[1] + "/pytorch_lora_weights.safetensors", "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
for k, v in h.items():
    if k.endswith("lora_B.weight"):
        a, e = v["data_offsets"]
        assert not any(array.array("f", b[8 + n + a:8 + n + e])), k
PY
  ok "LoRA on regularisation data: loss and gradient exactly 0 each step, every lora_B still zero" ||
  bad "regularisation: rc=$rc $(tail -3 "$tmp/lr.err"); $(grep -o '"loss": [^,]*' "$tmp/lr/metrics.jsonl" | tr '\n' ' ')"

# ---- validation images: StableDiffusionXLPipeline over the training U-net ----
VAL=(--validation_prompt="a red circle" --validation_step_interval=1 --validation_num_inference_steps=3
  --validation_resolution=32x24 --validation_seed=11)
"$CT" train "${COMMON[@]}" "${LORA[@]}" "${VAL[@]}" --output_dir="$tmp/v1" --max_train_steps=2 --checkpoint_step_interval=0 \
  --report_to=tensorboard --tracker_project_name=sdxl > /dev/null 2> "$tmp/v1.err" &&
  "$CT" train "${COMMON[@]}" "${LORA[@]}" "${VAL[@]}" --output_dir="$tmp/v2" --max_train_steps=2 --checkpoint_step_interval=0 \
    > /dev/null 2> "$tmp/v2.err"; rc=$?
V=validation_images/step_2_validation_0_32x24.png
[ $rc -eq 0 ] && file "$tmp/v1/validation_images/step_1_validation_0_32x24.png" | grep -q "PNG image data, 32 x 24" &&
  file "$tmp/v1/$V" | grep -q "PNG image data, 32 x 24" && [ -f "$tmp/v1/validation_images/step_2_grid.png" ] &&
  cmp -s "$tmp/v1/$V" "$tmp/v2/$V" && ! grep -q "validation_prompt has no effect" "$tmp/v1.err" &&
  ok "LoRA run with validation_prompt: 32x24 PNGs each step and a grid; the same seed, the same image bytes" ||
  bad "validation: rc=$rc $(ls "$tmp/v1/validation_images" 2>&1 | head -5) $(tail -3 "$tmp/v1.err")"
/usr/bin/python3 scripts/tb_read.py --reader builtin "$tmp/v1/logs/sdxl" > "$tmp/v1.tb" 2>&1
grep -q '^image validation/grid: step 2 ' "$tmp/v1.tb" && grep -q '^image validation/.*step 1 .*32x24 png decodes' "$tmp/v1.tb" &&
  ok "report_to tensorboard: the validation images and grid as TensorBoard images" ||
  bad "tensorboard images: $(grep '^image' "$tmp/v1.tb" | head -5)"
# learning rate 0: the adapters add nothing (B = 0), so the image is `ctuner sample`'s of the
# pipeline with SimpleTuner's validation defaults (negative prompt, guidance 7.5)
"$CT" train "${COMMON[@]}" "${LORA[@]}" "${VAL[@]}" --learning_rate=0 --output_dir="$tmp/v0" --max_train_steps=1 \
  --checkpoint_step_interval=0 > /dev/null 2> "$tmp/v0.err" &&
  "$CT" sample --pretrained $P --prompt "a red circle" --steps 3 --width 32 --height 24 --seed 11 --guidance_scale 7.5 \
    --negative_prompt "blurry, cropped, ugly" --out "$tmp/s0.png" > /dev/null 2>&1; rc=$?
[ $rc -eq 0 ] && cmp -s "$tmp/v0/validation_images/step_1_validation_0_32x24.png" "$tmp/s0.png" &&
  ! cmp -s "$tmp/v1/$V" "$tmp/s0.png" &&
  ok "validation = \`ctuner sample\` of the pipeline when the adapters are zero; trained adapters change the image" ||
  bad "validation vs sample: rc=$rc $(tail -3 "$tmp/v0.err")"
"$CT" train "${COMMON[@]}" "${LORA[@]}" "${VAL[@]}" --learning_rate=0 --output_dir="$tmp/vd" --max_train_steps=1 \
  --checkpoint_step_interval=0 --validation_noise_scheduler=ddim --validation_negative_prompt=blurry > /dev/null 2> "$tmp/vd.err" &&
  "$CT" sample --pretrained $P --prompt "a red circle" --steps 3 --width 32 --height 24 --seed 11 --guidance_scale 7.5 \
    --negative_prompt blurry --scheduler ddim --out "$tmp/sd.png" > /dev/null 2>&1; rc=$?
[ $rc -eq 0 ] && cmp -s "$tmp/vd/validation_images/step_1_validation_0_32x24.png" "$tmp/sd.png" &&
  ! cmp -s "$tmp/sd.png" "$tmp/s0.png" && ! grep -q "validation_noise_scheduler" "$tmp/vd.err" &&
  ok "validation_noise_scheduler ddim, validation_negative_prompt: \`ctuner sample --scheduler ddim --negative_prompt\`'s image" ||
  bad "validation ddim: rc=$rc $(grep -i warn "$tmp/vd.err" | tail -3)"
"$CT" train "${COMMON[@]}" "${LORA[@]}" "${VAL[@]}" --output_dir="$tmp/vu" --max_train_steps=1 \
  --checkpoint_step_interval=0 --validation_noise_scheduler=unipc > /dev/null 2> "$tmp/vu.err"; rc=$?
[ $rc -eq 0 ] && [ "$(grep -c "validation_noise_scheduler unipc has no effect" "$tmp/vu.err")" = 1 ] &&
  ok "validation_noise_scheduler unipc: one warning, the pipeline's scheduler samples" || bad "unipc: rc=$rc $(tail -3 "$tmp/vu.err")"
"$CT" train "${COMMON[@]}" "${VAL[@]}" --output_dir="$tmp/vf" --max_train_steps=1 --checkpoint_step_interval=0 \
  --validation_guidance_rescale=0.5 --use_ema=true > /dev/null 2> "$tmp/vf.err"; rc=$?
[ $rc -eq 0 ] && [ -f "$tmp/vf/validation_images/step_1_validation_0_32x24.png" ] &&
  [ -f "$tmp/vf/validation_images/step_1_validation-ema_0_32x24.png" ] && ! grep -q "validation_guidance_rescale" "$tmp/vf.err" &&
  ok "full fine-tune with EMA: live and EMA validation images; validation_guidance_rescale applies (no warning)" ||
  bad "full validation: rc=$rc $(ls "$tmp/vf/validation_images" 2>&1 | head) $(tail -3 "$tmp/vf.err")"

# ---- one step against diffusers (goldens of scripts/sdxl_train_golden.py) ----
check_golden() { # golden dump
  python3 - "$1" "$2" <<'PY'
import array, json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        a, e = v["data_offsets"]
        out[k] = (v["shape"], array.array("f", b[8 + n + a:8 + n + e]))
    return out
g, d = load(sys.argv[1]), load(sys.argv[2])
def rel(x, y):
    if x[0] != y[0]:
        return float("inf")
    m = max(max(abs(v) for v in y[1]), 1e-12)
    return max(abs(float(p) - float(q)) for p, q in zip(x[1], y[1])) / m
bad = []
for k in ("latents", "noise", "noise_in", "timesteps", "encoder_hidden_states", "text_embeds", "time_ids"):
    if rel(d[k], g[k]) > 1e-5:
        bad.append(k)
for k, r in (("noisy_latents", "ref_noisy_latents"), ("target", "ref_target"), ("model_pred", "ref_model_pred"), ("loss", "ref_loss")):
    e = rel(d[k], g[r])
    print(f"{k} {e:.1e}", end=", ")
    if not e <= 1e-4:
        bad.append(k)
print(f"loss {d['loss'][1][0]:.6f} (diffusers {g['ref_loss'][1][0]:.6f})", end="")
if bad:
    print(" differ:", bad)
sys.exit(1 if bad else 0)
PY
}
CTUNER_SDXL_DUMP="$tmp/d1.st" "$CT" train "${COMMON[@]}" --output_dir="$tmp/g1" --max_train_steps=1 --checkpoint_step_interval=0 \
  --snr_gamma=5 > /dev/null 2> "$tmp/g1.err"; rc=$?
r=$(check_golden $G/eps_snr5.safetensors "$tmp/d1.st") && [ $rc -eq 0 ] &&
  ok "epsilon, snr_gamma 5: one step = diffusers' (x_t, target, U-net, min-SNR loss): $r" || bad "epsilon golden: rc=$rc $r $(tail -2 "$tmp/g1.err")"
CTUNER_SDXL_DUMP="$tmp/d2.st" "$CT" train "${COMMON[@]}" --data_backend_config="$tmp/backend2.json" --output_dir="$tmp/g2" \
  --max_train_steps=1 --checkpoint_step_interval=0 --snr_gamma=5 --prediction_type=v_prediction --offset_noise=true \
  --noise_offset_probability=1 --input_perturbation=0.1 --caption_dropout_probability=0.7 > /dev/null 2> "$tmp/g2.err"; rc=$?
r=$(check_golden $G/v_offset_perturb.safetensors "$tmp/d2.st") && [ $rc -eq 0 ] &&
  ok "v_prediction, offset noise, input perturbation, a dropped caption, a random crop: one step = diffusers': $r" ||
  bad "v golden: rc=$rc $r $(tail -2 "$tmp/g2.err")"

# ---- 2 ranks ZeRO-1, batch 1 each = 1 rank batch 2 (the same samples) ----
if command -v mpirun >/dev/null 2>&1; then
  "$CT" train "${COMMON[@]}" --output_dir="$tmp/s1" --max_train_steps=2 --checkpoint_step_interval=0 > /dev/null 2> "$tmp/s1.err"
  ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0 mpirun --oversubscribe --allow-run-as-root -np 2 "$CT" train "${COMMON[@]}" \
    --train_batch_size=1 --num_threads=1 --zero_stage=1 --output_dir="$tmp/z" --max_train_steps=2 --checkpoint_step_interval=0 \
    > /dev/null 2> "$tmp/z.err"; rc=$?
  python3 - "$tmp/s1/metrics.jsonl" "$tmp/z/metrics.jsonl" <<'PY' && [ $rc -eq 0 ] &&
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p) if '"step"' in l] for p in sys.argv[1:3])
assert len(a) == len(b) == 2 and all(abs(x - y) <= 1e-4 * abs(x) for x, y in zip(a, b)), (a, b)
PY
    ok "2 ranks ZeRO-1 (batch 1 each): the losses of 1 rank with batch 2" || bad "zero1: rc=$rc $(tail -3 "$tmp/z.err")"
  "$CT" train "${COMMON[@]}" "${LORA[@]}" --output_dir="$tmp/s1l" --max_train_steps=2 --checkpoint_step_interval=0 > /dev/null 2> "$tmp/s1l.err"
  ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0 mpirun --oversubscribe --allow-run-as-root -np 2 "$CT" train "${COMMON[@]}" "${LORA[@]}" \
    --train_batch_size=1 --num_threads=1 --zero_stage=1 --output_dir="$tmp/zl" --max_train_steps=2 --checkpoint_step_interval=0 \
    "${VAL[@]}" > /dev/null 2> "$tmp/zl.err"; rc=$?
  python3 - "$tmp/s1l/metrics.jsonl" "$tmp/zl/metrics.jsonl" <<'PY' && [ $rc -eq 0 ] && [ -f "$tmp/zl/pytorch_lora_weights.safetensors" ] &&
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p) if '"step"' in l] for p in sys.argv[1:3])
assert len(a) == len(b) == 2 and all(abs(x - y) <= 1e-4 * abs(x) for x, y in zip(a, b)), (a, b)
PY
    [ -f "$tmp/zl/$V" ] && ok "LoRA, 2 ranks ZeRO-1 (batch 1 each): the losses of 1 rank with batch 2; rank 0 writes the validation images" || bad "lora zero1: rc=$rc $(tail -3 "$tmp/zl.err")"
else
  skip "no mpirun: 2 ranks ZeRO-1 (full and LoRA)"
fi

# ---- refused by name, before anything is made ----
refused() { # what message args...
  local what=$1 msg=$2
  shift 2
  "$CT" train "${COMMON[@]}" --output_dir="$tmp/r" --max_train_steps=1 "$@" > "$tmp/r.out" 2>&1; local rc=$?
  [ $rc -ne 0 ] && grep -q "$msg" "$tmp/r.out" && [ ! -e "$tmp/r/checkpoint-1" ] && ok "refused: $what" ||
    bad "$what: rc=$rc $(tail -2 "$tmp/r.out")"
}
echo '{"algo": "lora", "multiplier": 1.0, "linear_dim": 4, "linear_alpha": 1}' > "$tmp/lyco.json"
refused "lora_type lycoris" "model_family sdxl: lora_type lycoris" --model_type=lora --lora_type=lycoris --lycoris_config="$tmp/lyco.json"
refused "use_dora" "model_family sdxl: use_dora" --model_type=lora --lora_dropout=0 --use_dora=true
refused "lora_dropout 0.1" "model_family sdxl: lora_dropout 0.1" --model_type=lora --lora_dropout=0.1
refused "base_model_precision int8-quanto" "model_family sdxl: base_model_precision" --model_type=lora --base_model_precision=int8-quanto
refused "a validation size the U-net cannot take" "SDXL validation images need sides that are multiples of 4" \
  --validation_prompt=x --validation_resolution=30x24
refused "zero_stage 2" "model_family sdxl: zero_stage 2 shards" --zero_stage=2
refused "mixed_precision bf16" "model_family sdxl: mixed_precision bf16" --mixed_precision=bf16
refused "gradient_checkpointing" "model_family sdxl: gradient_checkpointing is not yet" --gradient_checkpointing=true
refused "prediction_type flow_matching" "prediction_type flow_matching does not go with model_family sdxl" --prediction_type=flow_matching
finish
