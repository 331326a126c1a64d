#!/usr/bin/env bash
# FLUX.1 Kontext from the command line (docs/kontext.md): `ctuner sample
# --image REF` on the tiny FLUX.1 pipeline (tests/data/flux_pipe/dev) with the
# reference of tests/data/flux_kontext; the pipeline's sizes (max_area,
# _auto_resize) refused or adjusted by name; training on image pairs
# (conditioning_data, reference_strict and _loose): full and LoRA, loss finite, resume
# bit for bit, 2 ranks ZeRO-1, the unpaired image skipped and counted; what is not done yet
# refused by name. Values against diffusers'
# FluxKontextPipeline: tests/test_flux_pipe.c; live: make interop.
# Usage: tests/cli_kontext.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
P=tests/data/flux_pipe/dev
REF=tests/data/flux_kontext/ref.png
S=(sample --pretrained $P --flavour kontext --prompt "make the square blue" --width 32 --height 32 --steps 2)

"$CT" "${S[@]}" --image $REF --no_auto_resize --max_area 1024 --out "$tmp/k.png" > "$tmp/k.out" 2> "$tmp/k.err"; rc=$?
"$CT" "${S[@]}" --max_area 1024 --out "$tmp/t.png" > "$tmp/t.out" 2> "$tmp/t.err" || rc=1
[ $rc -eq 0 ] && [ -s "$tmp/k.png" ] && ! cmp -s "$tmp/k.png" "$tmp/t.png" && grep -q '"images": 1' "$tmp/k.out" &&
  ok "sample --image: an image conditioned on the reference (another than without it)" ||
  bad "sample --image: rc=$rc $(cat "$tmp/k.err" "$tmp/t.err")"

"$CT" "${S[@]}" --image $REF --max_area 1024 --out "$tmp/r.png" > /dev/null 2> "$tmp/r.err"; rc=$?
[ $rc -ne 0 ] && grep -q "is 24x32; FluxKontextPipeline would resize it to 880x1184" "$tmp/r.err" &&
  grep -q "PREFERRED_KONTEXT_RESOLUTIONS" "$tmp/r.err" && [ ! -e "$tmp/r.png" ] &&
  ok "the pipeline's _auto_resize: a reference it would resize refused by name" || bad "auto resize: rc=$rc $(cat "$tmp/r.err")"

"$CT" "${S[@]}" --image $REF --no_auto_resize --max_area 576 --out "$tmp/m.png" > "$tmp/m.out" 2> "$tmp/m.err"; rc=$?
[ $rc -eq 0 ] && grep -q "height and width adjusted to 24 and 24 for --max_area 576" "$tmp/m.err" &&
  grep -q '"width": 24, "height": 24' "$tmp/m.out" &&
  ok "max_area: the output size adjusted as the pipeline does, with its warning" || bad "max_area: rc=$rc $(cat "$tmp/m.err")"

"$CT" sample --checkpoint "$tmp/none" --image $REF --prompt x --out "$tmp/n.png" > /dev/null 2> "$tmp/n.err"; rc=$?
[ $rc -eq 2 ] && grep -q -- "--image (FLUX.1 Kontext) needs --pretrained" "$tmp/n.err" &&
  ok "--image without --pretrained: refused" || bad "--image alone: rc=$rc $(cat "$tmp/n.err")"

"$CT" "${S[@]}" --max_area 576 --out "$tmp/t2.png" > "$tmp/t2.out" 2> "$tmp/t2.err"; rc=$?
[ $rc -eq 0 ] && grep -q "adjusted to 24 and 24" "$tmp/t2.err" && grep -q '"width": 24' "$tmp/t2.out" &&
  ok "--flavour kontext without --image: max_area still sets the size, as the pipeline" || bad "no image: rc=$rc $(cat "$tmp/t2.err")"
"$CT" sample --pretrained $P --prompt x --out "$tmp/x.png" --max_area 576 > /dev/null 2> "$tmp/x.err"; rc=$?
[ $rc -eq 2 ] && grep -q "they need --image or --flavour kontext" "$tmp/x.err" &&
  ok "--max_area outside Kontext: refused, not ignored" || bad "max_area alone: rc=$rc $(cat "$tmp/x.err")"

# ---- training on image pairs (docs/kontext.md): conditioning_data, reference_strict ----
# 4 edits 32x32, references for 3: other shapes and colours, 48x48 (reference_strict
# resizes each into its edit's placement; seed 7 draws PNG/JPEG as seed 5 does)
"$CT" dataset synth --out "$tmp/edits" --count 4 --seed 5 --size 32x32 > /dev/null || bad "synth"
"$CT" dataset synth --out "$tmp/refs" --count 4 --seed 7 --size 48x48 > /dev/null && rm "$tmp/refs"/000003.*
ls "$tmp/refs"/000002.jpg "$tmp/edits"/000002.jpg > /dev/null || bad "synth: the file names do not pair"
cat > "$tmp/pairs.json" <<JSON
[{"id": "edits", "type": "local", "instance_data_dir": "$tmp/edits", "caption_strategy": "textfile", "conditioning_data": "refs"},
 {"id": "refs", "type": "local", "instance_data_dir": "$tmp/refs", "dataset_type": "conditioning", "conditioning_type": "reference_strict"}]
JSON
cat > "$tmp/plain.json" <<JSON
[{"id": "edits", "type": "local", "instance_data_dir": "$tmp/edits", "caption_strategy": "textfile"}]
JSON
TR=(train --pretrained_model_name_or_path=$P --resolution=32 --aspect_bucket_alignment=8 --train_batch_size=1
  --disable_progress_bar=true --seed=3 --learning_rate=1e-3 --num_threads=2 --checkpoint_step_interval=1 --disable_validation=true)
K=("${TR[@]}" --model_flavour=kontext --data_backend_config="$tmp/pairs.json")
finite() { grep -q '"last_loss": [0-9]' "$1" && ! grep -qiE 'loss (nan|inf)|"last_loss": -?(nan|inf)' "$1"; }
tensors() { "$CT" model convert --from "$1" --to "$2" --layout bfl > /dev/null; }

"$CT" "${K[@]}" --output_dir="$tmp/ka" --max_train_steps=2 > "$tmp/ka.out" 2> "$tmp/ka.err"; rc=$?
[ $rc -eq 0 ] && finite "$tmp/ka.out" && grep -q '"images": 3, "images_skipped": 1' "$tmp/ka.out" &&
  grep -q "000003.png has no usable reference in conditioning dataset 'refs'" "$tmp/ka.err" &&
  grep -q "1 without a reference" "$tmp/ka.err" && grep -q "reference latents (the VAE's mean) of 'refs'" "$tmp/ka.err" &&
  ls "$tmp/ka/cache/vae/refs/"*.st > /dev/null 2>&1 &&
  ok "kontext full: 2 steps on image pairs, loss finite, the unpaired image skipped and counted, references cached" ||
  bad "kontext full: rc=$rc $(tail -5 "$tmp/ka.err")"
"$CT" cache --pretrained_model_name_or_path=$P --model_flavour=kontext --data_backend_config="$tmp/pairs.json" \
  --resolution=32 --aspect_bucket_alignment=8 --num_threads=2 --output_dir="$tmp/kc" > "$tmp/kc.out" 2> "$tmp/kc.err"; rc=$?
[ $rc -eq 0 ] && grep -q '"images": 3, "processed": 4' "$tmp/kc.out" && grep -q '"unpaired": 1}' "$tmp/kc.out" &&
  [ "$(ls "$tmp/kc/cache/vae/refs/"*.st | wc -l)" = 3 ] &&
  ok "ctuner cache: the references' latents cached beside the edits', the unpaired image in skipped" ||
  bad "cache: rc=$rc $(cat "$tmp/kc.out") $(tail -3 "$tmp/kc.err")"
"$CT" "${K[@]}" --output_dir="$tmp/kb" --max_train_steps=1 > /dev/null 2> "$tmp/kb.err" &&
  "$CT" "${K[@]}" --output_dir="$tmp/kb" --max_train_steps=2 > /dev/null 2>> "$tmp/kb.err"; rc=$?
tensors "$tmp/ka/checkpoint-2/transformer" "$tmp/ka.bfl" && tensors "$tmp/kb/checkpoint-2/transformer" "$tmp/kb.bfl" &&
  tensors $P "$tmp/orig.bfl"
[ $rc -eq 0 ] && cmp -s "$tmp/ka.bfl" "$tmp/kb.bfl" && ! cmp -s "$tmp/ka.bfl" "$tmp/orig.bfl" &&
  ok "kontext full: resumed 1 + 1 steps end bit for bit where 2 steps do (and the weights trained)" ||
  bad "kontext full resume: rc=$rc $(tail -3 "$tmp/kb.err")"
# the reference reaches the model: the same 3 targets (same names, samples, noise and
# timesteps) without references (plain FLUX.1 dev) give another first loss
cp -r "$tmp/edits" "$tmp/edits3" && rm "$tmp/edits3"/000003.*
cat > "$tmp/plain3.json" <<JSON
[{"id": "edits", "type": "local", "instance_data_dir": "$tmp/edits3", "caption_strategy": "textfile"}]
JSON
"$CT" "${TR[@]}" --model_flavour=dev --data_backend_config="$tmp/plain3.json" --output_dir="$tmp/kd" --max_train_steps=2 \
  > "$tmp/kd.out" 2> "$tmp/kd.err"; rc=$?
[ $rc -eq 0 ] && ! cmp -s <(grep '^step 1/' "$tmp/ka.out" | cut -d' ' -f1-6) <(grep '^step 1/' "$tmp/kd.out" | cut -d' ' -f1-6) &&
  ok "kontext: the first step's loss differs from plain FLUX.1 on the same targets (the reference tokens count)" ||
  bad "kontext vs dev: rc=$rc $(grep '^step 1/' "$tmp/ka.out" "$tmp/kd.out")"

# the trained pipeline (output_dir/pipeline) samples with a reference, unlike the pipeline it came from
"$CT" "${S[@]}" --pretrained "$tmp/ka/pipeline" --image $REF --no_auto_resize --max_area 1024 --out "$tmp/ks.png" > "$tmp/ks.out" 2> "$tmp/ks.err"; rc=$?
[ $rc -eq 0 ] && [ -s "$tmp/ks.png" ] && ! cmp -s "$tmp/ks.png" "$tmp/k.png" && grep -q "\"pretrained\": \"$tmp/ka/pipeline\"" "$tmp/ks.out" &&
  ok "sample --image from the trained Kontext pipeline: an image, another than the untrained pipeline's" ||
  bad "sample trained: rc=$rc $(tail -3 "$tmp/ks.err")"

# reference_loose: the references at their own dataset's size (resolution 16: 16x16 beside 32x32)
sed 's/"reference_strict"/"reference_loose", "resolution": 16, "resolution_type": "pixel"/' "$tmp/pairs.json" > "$tmp/loose.json"
"$CT" "${TR[@]}" --model_flavour=kontext --data_backend_config="$tmp/loose.json" --output_dir="$tmp/kl" --max_train_steps=1 \
  > "$tmp/kl.out" 2> "$tmp/kl.err"; rc=$?
[ $rc -eq 0 ] && finite "$tmp/kl.out" && grep -q '"images": 3' "$tmp/kl.out" &&
  ! cmp -s <(grep '^step 1/' "$tmp/ka.out" | cut -d' ' -f1-6) <(grep '^step 1/' "$tmp/kl.out" | cut -d' ' -f1-6) &&
  ok "kontext reference_loose: trains with references of their own size (another loss than strict's)" ||
  bad "kontext loose: rc=$rc $(tail -3 "$tmp/kl.err")"

L=(--model_type=lora --lora_rank=4)
"$CT" "${K[@]}" "${L[@]}" --output_dir="$tmp/la" --max_train_steps=2 > "$tmp/la.out" 2> "$tmp/la.err"; rc=$?
"$CT" "${K[@]}" "${L[@]}" --output_dir="$tmp/lb" --max_train_steps=1 > /dev/null 2> "$tmp/lb.err" &&
  "$CT" "${K[@]}" "${L[@]}" --output_dir="$tmp/lb" --max_train_steps=2 > /dev/null 2>> "$tmp/lb.err"; rc2=$?
W=pytorch_lora_weights.safetensors
[ $rc -eq 0 ] && [ $rc2 -eq 0 ] && finite "$tmp/la.out" && [ -s "$tmp/la/checkpoint-2/$W" ] &&
  cmp -s "$tmp/la/checkpoint-2/$W" "$tmp/lb/checkpoint-2/$W" &&
  ok "kontext LoRA (standard): 2 steps, loss finite, resumed 1 + 1 steps bit for bit" ||
  bad "kontext lora: rc=$rc/$rc2 $(tail -3 "$tmp/la.err" "$tmp/lb.err")"

# a quantised base (int8-quanto) under the LoRA: the same forward with reference tokens
"$CT" "${K[@]}" "${L[@]}" --base_model_precision=int8-quanto --output_dir="$tmp/lq" --max_train_steps=1 \
  > "$tmp/lq.out" 2> "$tmp/lq.err"; rc=$?
[ $rc -eq 0 ] && finite "$tmp/lq.out" && grep -q "base_model_precision int8-quanto" "$tmp/lq.err" &&
  ok "kontext LoRA over an int8-quanto base: trains, loss finite" || bad "kontext quant: rc=$rc $(tail -3 "$tmp/lq.err")"

# 2 ranks, ZeRO-1: every rank pairs the same images (discovery of the references is collective)
if command -v mpirun > /dev/null; then
  ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0 mpirun --oversubscribe --allow-run-as-root -np 2 "$CT" "${K[@]}" \
    --num_threads=1 --zero_stage=1 --output_dir="$tmp/km" --max_train_steps=2 > "$tmp/km.out" 2> "$tmp/km.err"; rc=$?
  [ $rc -eq 0 ] && finite "$tmp/km.out" && grep -q '"images": 3, "images_skipped": 1' "$tmp/km.out" &&
    ok "kontext on 2 ranks with ZeRO-1: trains, loss finite" || bad "kontext 2 ranks: rc=$rc $(tail -3 "$tmp/km.err")"
else
  skip "kontext on 2 ranks: no mpirun"
fi

# ---- what is not there: warned once, or refused by name before training ----
"$CT" "${K[@]}" --output_dir="$tmp/kv" --max_train_steps=1 --disable_validation=false --validation_prompt="make it blue" \
  --validation_resolution=32 --validation_num_inference_steps=1 > /dev/null 2> "$tmp/kv.err"; rc=$?
[ $rc -eq 0 ] && [ "$(grep -c "validation images are sampled without a reference image" "$tmp/kv.err")" = 1 ] &&
  ok "kontext validation: sampled without a reference, warned once" || bad "validation: rc=$rc $(tail -3 "$tmp/kv.err")"
"$CT" "${TR[@]}" --model_flavour=kontext --data_backend_config="$tmp/plain.json" --output_dir="$tmp/r1" > /dev/null 2> "$tmp/r1.err"; rc=$?
[ $rc -ne 0 ] && grep -q "dataset 'edits' has no conditioning_data: FLUX.1 Kontext training" "$tmp/r1.err" &&
  ok "kontext without conditioning_data: refused by name" || bad "no pairs: rc=$rc $(tail -2 "$tmp/r1.err")"
"$CT" "${TR[@]}" --model_flavour=dev --data_backend_config="$tmp/pairs.json" --output_dir="$tmp/r2" > /dev/null 2> "$tmp/r2.err"; rc=$?
[ $rc -ne 0 ] && grep -q "conditioning_data \"refs\": model_family flux (model_flavour dev) takes no reference images" "$tmp/r2.err" &&
  ok "conditioning_data outside Kontext: refused by name (the pairs would be ignored)" || bad "dev pairs: rc=$rc $(tail -2 "$tmp/r2.err")"
cp -r $P "$tmp/kpipe" && sed -i 's/"FluxPipeline"/"FluxKontextPipeline"/' "$tmp/kpipe/model_index.json"
"$CT" bench memory --plan --pretrained "$tmp/kpipe" > "$tmp/bp.out" 2> "$tmp/bp.err"; rc=$?
[ $rc -eq 0 ] && [ "$(grep -c "the plan counts the target's image tokens only, not the reference tokens" "$tmp/bp.err")" = 1 ] &&
  ok "bench memory --plan of a FluxKontextPipeline: the reference tokens not planned, said once" ||
  bad "bench plan: rc=$rc $(cat "$tmp/bp.err")"
"$CT" "${K[@]}" --zero_stage=2 --output_dir="$tmp/r3" > /dev/null 2> "$tmp/r3.err"; rc=$?
[ $rc -ne 0 ] && grep -q "model_flavour kontext with zero_stage 2 is not implemented yet" "$tmp/r3.err" &&
  ok "kontext with ZeRO-2: refused by name" || bad "zero2: rc=$rc $(tail -2 "$tmp/r3.err")"
sed 's/reference_strict/controlnet/' "$tmp/pairs.json" > "$tmp/cn.json"
"$CT" "${TR[@]}" --model_flavour=kontext --data_backend_config="$tmp/cn.json" --output_dir="$tmp/r4" > /dev/null 2> "$tmp/r4.err"; rc=$?
[ $rc -ne 0 ] && grep -q '"controlnet": conditioning datasets of this type (ControlNet, masks) are not' "$tmp/r4.err" &&
  ok "conditioning_type controlnet: refused by name" || bad "controlnet: rc=$rc $(tail -2 "$tmp/r4.err")"
finish
