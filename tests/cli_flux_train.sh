#!/usr/bin/env bash
# End-to-end: `ctuner train` from the tiny FluxPipeline directories diffusers
# saved (tests/data/flux_pipe, scripts/flux_tiny_pipeline.py): dev (guidance,
# BF16, sharded) with validation, checkpoints and the final pipeline, whose
# transformer/ loads back (`model convert`) with trained weights; a resumed
# run ends bit for bit where an uninterrupted one does; 2 ranks ZeRO-3 (each
# rank reads its range of the sharded transformer); schnell (T5 256 tokens);
# the transformer from a BFL file (pretrained_transformer_model_name_or_path);
# `ctuner sample --pretrained` from the run's checkpoint and its pipeline/;
# and bad input: a hub id, a broken copy with every problem in one message.
# Each run is 1-2 steps: the 512 T5 tokens dominate a step (Release ~10 s of
# CPU in all, 26 s wall here under load; ASan 43 s of CPU, 2m50 wall under load).
# Numbers against diffusers: tests/test_flux_pipe.c; live: make interop.
# Usage: tests/cli_flux_train.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
MPIRUN=(mpirun --oversubscribe --allow-run-as-root)
P=tests/data/flux_pipe
"$CT" dataset synth --out "$tmp/data" --count 8 --seed 5 --size 32x32 >/dev/null || { echo "FAIL - synth"; exit 1; }
cat > "$tmp/backend.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile", "crop": false}]
JSON
COMMON=(--data_backend_config="$tmp/backend.json" --resolution=32 --aspect_bucket_alignment=8
  --train_batch_size=1 --disable_progress_bar=true --seed=3 --learning_rate=1e-3 --num_threads=2)
# the safetensors data of a transformer directory, tensor by tensor (the header's order may differ)
tensors() { "$CT" model convert --from "$1" --to "$2" --layout bfl >/dev/null; }

# ---- dev: 2 steps, checkpoints every step, validation at the end ----
"$CT" train --pretrained_model_name_or_path=$P/dev --model_flavour=dev "${COMMON[@]}" --output_dir="$tmp/a" \
  --max_train_steps=2 --checkpoint_step_interval=1 --flux_guidance_value=3.5 --validation_prompt="a red circle" \
  --validation_resolution=32 --validation_num_inference_steps=1 > "$tmp/a.out" 2> "$tmp/a.err"; rc=$?
[ $rc -eq 0 ] && grep -q "text encoders freed after caching" "$tmp/a.err" && ok "dev: trains 2 steps, encoders freed after caching" ||
  bad "dev: rc=$rc $(tail -5 "$tmp/a.err")"
ls "$tmp/a/cache/text/"*-T512-*.st >/dev/null 2>&1 && ok "dev: text cache of 512 T5 tokens (model_flavour dev)" || bad "no T512 cache entries"
[ -f "$tmp/a/checkpoint-1/transformer/config.json" ] && [ -f "$tmp/a/checkpoint-2/transformer/diffusion_pytorch_model.safetensors" ] &&
  ok "dev: each checkpoint holds transformer/ (diffusers layout)" || bad "checkpoint transformer/ missing: $(ls -R "$tmp/a" | head -30)"
ls "$tmp/a/validation_images/"*.png >/dev/null 2>&1 && ok "dev: validation image written" || bad "no validation image"
[ -f "$tmp/a/pipeline/model_index.json" ] && [ -d "$tmp/a/pipeline/text_encoder_2" ] && cmp -s "$tmp/a/pipeline/transformer/config.json" $P/dev/transformer/config.json &&
  ok "dev: output_dir/pipeline is a FluxPipeline directory (transformer/ trained, the rest linked)" || bad "pipeline: $(ls -la "$tmp/a/pipeline")"
tensors "$tmp/a/pipeline" "$tmp/a.bfl" && tensors $P/dev "$tmp/orig.bfl" && ! cmp -s "$tmp/a.bfl" "$tmp/orig.bfl" &&
  ok "dev: the saved transformer loads back (model convert) and differs from the pipeline's" || bad "saved transformer does not load or did not train"

# ---- checkpoint export of a pipeline run: diffusers directory and BFL file hold its transformer ----
"$CT" checkpoint export --checkpoint "latest:$tmp/a" --format diffusers --max_shard_size 100K --out "$tmp/exp_dif" >/dev/null &&
  "$CT" checkpoint export --checkpoint "$tmp/a/checkpoint-2" --out "$tmp/exp.safetensors" >/dev/null &&
  "$CT" model convert --from "$tmp/a/checkpoint-2/transformer" --layout bfl \
    --to "$tmp/ref.bfl" >/dev/null && tensors "$tmp/exp_dif" "$tmp/exp_dif.bfl" &&
  "$CT" model convert --from "$tmp/exp.safetensors" --axes_dims_rope 4,6,6 --layout bfl --to "$tmp/exp_bfl.bfl" >/dev/null &&
  cmp -s "$tmp/exp_dif.bfl" "$tmp/ref.bfl" && cmp -s "$tmp/exp_bfl.bfl" "$tmp/ref.bfl" &&
  [ -f "$tmp/exp_dif/diffusion_pytorch_model.safetensors.index.json" ] &&
  ok "checkpoint export --format diffusers (sharded) and bfl: the checkpoint's float32 weights, tensor for tensor" ||
  bad "checkpoint export of a pipeline run: $(ls "$tmp/exp_dif" 2>&1 | head -3)"

# ---- resume: 1 step, then on to 2 from checkpoint-1: the same weights as run a ----
# (the first part names the same transformer through SimpleTuner's override keys)
"$CT" train --pretrained_model_name_or_path=$P/dev --model_flavour=dev "${COMMON[@]}" --output_dir="$tmp/b" \
  --pretrained_transformer_model_name_or_path=$P/dev --pretrained_transformer_subfolder=transformer --max_train_steps=1 --checkpoint_step_interval=1 --flux_guidance_value=3.5 --disable_validation=true > /dev/null 2> "$tmp/b.err" &&
"$CT" train --pretrained_model_name_or_path=$P/dev --model_flavour=dev "${COMMON[@]}" --output_dir="$tmp/b" \
  --max_train_steps=2 --checkpoint_step_interval=1 --flux_guidance_value=3.5 --disable_validation=true > /dev/null 2>> "$tmp/b.err"; rc=$?
tensors "$tmp/b/checkpoint-2/transformer" "$tmp/b.bfl"
[ $rc -eq 0 ] && cmp -s "$tmp/a.bfl" "$tmp/b.bfl" && ok "resume: 1 + 1 steps give run a's transformer bit for bit" ||
  bad "resume: rc=$rc $(tail -3 "$tmp/b.err")"

# ---- 2 ranks, ZeRO-3: each rank loads its range of the sharded diffusers transformer ----
ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0 "${MPIRUN[@]}" -np 2 "$CT" train --pretrained_model_name_or_path=$P/dev --model_flavour=dev "${COMMON[@]}" \
  --train_batch_size=1 --num_threads=1 --zero_stage=3 --output_dir="$tmp/z" --max_train_steps=1 --checkpoint_step_interval=1 \
  --disable_validation=true > "$tmp/z.out" 2> "$tmp/z.err"; rc=$?
[ $rc -eq 0 ] && tensors "$tmp/z/checkpoint-1/transformer" "$tmp/z.bfl" && ! cmp -s "$tmp/z.bfl" "$tmp/orig.bfl" &&
  [ ! -e "$tmp/z/checkpoint-1/model.safetensors" ] && [ ! -e "$tmp/a/checkpoint-1/model.safetensors" ] &&
  ok "2 ranks ZeRO-3: trains; its transformer/ (float32: the checkpoint's only copy of the weights) loads back" ||
  bad "zero3: rc=$rc $(ls "$tmp/z/checkpoint-1") $(tail -5 "$tmp/z.err")"
# resuming at ZeRO-3 reads each rank's range of that transformer/
ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0 "${MPIRUN[@]}" -np 2 "$CT" train --pretrained_model_name_or_path=$P/dev --model_flavour=dev "${COMMON[@]}" \
  --train_batch_size=1 --num_threads=1 --zero_stage=3 --output_dir="$tmp/z" --max_train_steps=2 --checkpoint_step_interval=1 \
  --disable_validation=true > "$tmp/z2.out" 2> "$tmp/z2.err"; rc=$?
[ $rc -eq 0 ] && grep -q "resum" "$tmp/z2.err" && tensors "$tmp/z/checkpoint-2/transformer" "$tmp/z2.bfl" &&
  ! cmp -s "$tmp/z.bfl" "$tmp/z2.bfl" && ok "2 ranks ZeRO-3: resumes from the checkpoint's transformer/ and trains on" ||
  bad "zero3 resume: rc=$rc $(grep -i resum "$tmp/z2.err" | head -2) $(tail -3 "$tmp/z2.err")"

# ---- bf16: the float32 master weights (model.safetensors) beside a bf16 transformer/ ----
"$CT" train --pretrained_model_name_or_path=$P/dev --model_flavour=dev "${COMMON[@]}" --output_dir="$tmp/h" --mixed_precision=bf16 \
  --max_train_steps=1 --checkpoint_step_interval=1 --disable_validation=true > /dev/null 2> "$tmp/h.err"; rc=$?
[ $rc -eq 0 ] && [ -f "$tmp/h/checkpoint-1/model.safetensors" ] &&
  grep -q '"dtype":"BF16"' "$tmp/h/checkpoint-1/transformer/diffusion_pytorch_model.safetensors" &&
  ok "bf16: the checkpoint keeps float32 masters (model.safetensors) and a bf16 transformer/" ||
  bad "bf16 pipeline run: rc=$rc $(ls "$tmp/h/checkpoint-1") $(tail -3 "$tmp/h.err")"

# ---- CLIP-L, T5 stored int8 (text_encoder_{1,2}_precision): trains; its embeddings name other cache files ----
"$CT" train --pretrained_model_name_or_path=$P/dev --model_flavour=dev "${COMMON[@]}" --output_dir="$tmp/q" \
  --text_encoder_1_precision=int8-quanto --text_encoder_2_precision=int8-torchao --max_train_steps=1 --checkpoint_step_interval=0 \
  --disable_validation=true > /dev/null 2> "$tmp/q.err"; rc=$?
qa=$(ls "$tmp/a/cache/text/" | sed -n 's/.*\(T512-[0-9a-f]*\).*/\1/p' | sort -u)
qq=$(ls "$tmp/q/cache/text/" | sed -n 's/.*\(T512-[0-9a-f]*\).*/\1/p' | sort -u)
[ $rc -eq 0 ] && grep -q "CLIP-L int8-quanto .*T5 int8-torchao" "$tmp/q.err" && [ -n "$qq" ] && [ "$qa" != "$qq" ] &&
  ok "CLIP-L int8-quanto + T5 int8-torchao: trains, its text cache is another ($qq vs $qa)" ||
  bad "T5 int8: rc=$rc $qa $qq $(tail -3 "$tmp/q.err")"

# ---- LoRA on the pipeline's transformer, 2 ranks: ZeRO-3 (each rank reads its byte range of the
# sharded BF16 transformer as the frozen base, gathered per block) = ZeRO-2 (the base whole), bit for bit
for s in 2 3; do
  ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0 "${MPIRUN[@]}" -np 2 "$CT" train --pretrained_model_name_or_path=$P/dev \
    --model_flavour=dev "${COMMON[@]}" --num_threads=1 --zero_stage=$s --output_dir="$tmp/l$s" --max_train_steps=2 \
    --checkpoint_step_interval=0 --model_type=lora --lora_rank=2 --flux_lora_target=all --lora_dropout=0 \
    --disable_validation=true > /dev/null 2> "$tmp/l$s.err" || bad "lora zero $s: $(tail -3 "$tmp/l$s.err")"
done
cmp -s "$tmp/l2/pytorch_lora_weights.safetensors" "$tmp/l3/pytorch_lora_weights.safetensors" &&
  grep -q "frozen base sharded by bytes" "$tmp/l3.err" &&
  ok "LoRA on the pipeline, 2 ranks: ZeRO-3 with the base sharded = ZeRO-2, adapter file bit for bit" ||
  bad "lora pipeline zero3 vs zero2: $(grep -i "frozen\|error" "$tmp/l3.err" | head -3)"

# ---- schnell: no guidance, 256 T5 tokens; the transformer from a BFL file ----
"$CT" train --pretrained_model_name_or_path=$P/schnell --model_flavour=schnell "${COMMON[@]}" --output_dir="$tmp/s" \
  --pretrained_vae_model_name_or_path=$P/dev \
  --max_train_steps=1 --checkpoint_step_interval=0 --disable_validation=true > /dev/null 2> "$tmp/s.err"; rc=$?
[ $rc -eq 0 ] && ls "$tmp/s/cache/text/"*-T256-*.st >/dev/null 2>&1 && grep -q "flux_fast_schedule" "$tmp/s.err" &&
  grep -q "codec vae: $P/dev/vae" "$tmp/s.err" &&
  ok "schnell: trains with 256 T5 tokens (the VAE of pretrained_vae_model_name_or_path), says what differs from SimpleTuner" ||
  bad "schnell: rc=$rc $(tail -3 "$tmp/s.err")"
"$CT" train --pretrained_model_name_or_path=$P/dev --pretrained_transformer_model_name_or_path="$tmp/orig.bfl" --model_flavour=dev \
  "${COMMON[@]}" --output_dir="$tmp/f" --max_train_steps=1 --checkpoint_step_interval=1 --flux_guidance_value=3.5 \
  --disable_validation=true > /dev/null 2> "$tmp/f.err"; rc=$?
tensors "$tmp/f/checkpoint-1/transformer" "$tmp/f.bfl"
tensors "$tmp/a/checkpoint-1/transformer" "$tmp/a1.bfl"
[ $rc -eq 0 ] && cmp -s "$tmp/f.bfl" "$tmp/a1.bfl" && ok "a BFL transformer file trains to run a's weights bit for bit" ||
  bad "bfl override: rc=$rc $(tail -3 "$tmp/f.err")"

# ---- sampling as FluxPipeline (values: tests/test_flux_pipe.c against diffusers) ----
"$CT" sample --pretrained $P/dev --checkpoint "latest:$tmp/a" --prompt "a red circle" --out "$tmp/s1.png" \
  --width 32 --height 32 --steps 1 > "$tmp/s.out" 2> "$tmp/s.err"; rc=$?
"$CT" sample --pretrained "$tmp/a/pipeline" --prompt "a red circle" --out "$tmp/s2.png" --width 32 --height 32 \
  --steps 1 >> "$tmp/s.out" 2>> "$tmp/s.err" || rc=1
"$CT" sample --pretrained $P/dev --prompt "a red circle" --out "$tmp/s0.png" --width 32 --height 32 --steps 1 \
  >> "$tmp/s.out" 2>> "$tmp/s.err" || rc=1
[ $rc -eq 0 ] && cmp -s "$tmp/s1.png" "$tmp/s2.png" && ! cmp -s "$tmp/s0.png" "$tmp/s1.png" &&
  ok "sample --pretrained: the run's last checkpoint and its output pipeline give the same image, the base another" ||
  bad "sample: rc=$rc $(cat "$tmp/s.err")"
# validation uses the pipeline's own scheduler config (here a copy whose
# dynamic shift and terminal differ from FLUX.1's): a 1-step run's validation
# image is what sample --pretrained gives from its pipeline/ with the same settings
cp -rL $P/dev "$tmp/devs"
sed -i 's/"max_shift": 1.15/"max_shift": 2.5/; s/"shift_terminal": null/"shift_terminal": 0.3/' "$tmp/devs/scheduler/scheduler_config.json"
"$CT" train --pretrained_model_name_or_path="$tmp/devs" --model_flavour=dev "${COMMON[@]}" --output_dir="$tmp/v" \
  --max_train_steps=1 --checkpoint_step_interval=1 --validation_prompt="a red circle" --validation_resolution=32 \
  --validation_num_inference_steps=3 --validation_seed=7 --validation_guidance=3.5 > "$tmp/v.out" 2> "$tmp/v.err" &&
  "$CT" sample --pretrained "$tmp/v/pipeline" --prompt "a red circle" --out "$tmp/v.png" --width 32 --height 32 \
    --steps 3 --seed 7 --guidance 3.5 >> "$tmp/s.out" 2>> "$tmp/v.err"; rc=$?
val=$(ls "$tmp/v/validation_images/"*.png 2>/dev/null | grep -v grid | head -1)
[ $rc -eq 0 ] && [ -n "$val" ] && /usr/bin/python3 -c '
import sys; from PIL import Image
a, b = (Image.open(f).convert("RGB").tobytes() for f in sys.argv[1:])
sys.exit(0 if a == b else 1)' "$val" "$tmp/v.png" &&
  ok "validation samples with the pipeline's scheduler (its shift_terminal, max_shift): the pixels of sample --pretrained" ||
  bad "validation vs sample: rc=$rc val=$val $(ls "$tmp/v/validation_images") $(tail -3 "$tmp/v.err")"
"$CT" sample --checkpoint "latest:$tmp/a" --prompt x --out "$tmp/s3.png" 2> "$tmp/err"; rc=$?
[ $rc -ne 0 ] && grep -q "ctuner sample --pretrained" "$tmp/err" && ok "sample --checkpoint of a pipeline run says to add --pretrained" ||
  bad "sample without --pretrained: rc=$rc $(cat "$tmp/err")"

# ---- bad input ----
mkdir -p "$tmp/hf"
HF_HUB_OFFLINE=1 HF_HUB_CACHE="$tmp/hf" "$CT" train --pretrained_model_name_or_path=black-forest-labs/FLUX.1-dev "${COMMON[@]}" --output_dir="$tmp/x" 2> "$tmp/err"; rc=$?
[ $rc -ne 0 ] && grep -q "pretrained_model_name_or_path 'black-forest-labs/FLUX.1-dev'.*$tmp/hf/models--black-forest-labs--FLUX.1-dev.*HF_HUB_OFFLINE" "$tmp/err" &&
  ok "a hub id not in the cache, offline: refused, names the cache it looked in (tests/cli_hub.sh downloads)" || bad "hub id: rc=$rc $(cat "$tmp/err")"
cp -rL $P/dev "$tmp/broken"
rm -rf "$tmp/broken/text_encoder_2"
sed -i 's/"joint_attention_dim": 64/"joint_attention_dim": 48/' "$tmp/broken/transformer/config.json"
"$CT" train --pretrained_model_name_or_path="$tmp/broken" --preset=tiny "${COMMON[@]}" --output_dir="$tmp/x" 2> "$tmp/err"; rc=$?
grep -q "text_encoder_2: missing" "$tmp/err" && grep -q "context_embedder.weight in diffusion_pytorch_model-0000[12]-of-00002.safetensors" "$tmp/err" &&
  grep -q "preset does not go with a FLUX.1 pipeline" "$tmp/err" && [ $rc -ne 0 ] &&
  ok "a broken pipeline: missing part, wrongly shaped tensor (with its file) and a conflicting key in one message" ||
  bad "broken: rc=$rc $(cat "$tmp/err")"
exit $fail
