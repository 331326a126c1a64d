#!/usr/bin/env bash
# model_type vae end to end (docs/vae.md): a small AutoencoderKL trained by
# `ctuner train` on synthetic images — checkpoints in diffusers' layout, the
# validation grid and PSNR, latent statistics written into config.json, an
# exact resume, 2 ranks x batch 2 == 1 rank x batch 4, `ctuner eval vae` on
# held-out images, and the configuration errors.
# Usage: tests/cli_vae.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"
MPIRUN=(mpirun --oversubscribe --allow-run-as-root)
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
PY=/usr/bin/python3

"$CT" dataset synth --out "$tmp/data" --count 32 --seed 5 --size 16x16 >/dev/null || { echo "FAIL - synth"; exit 1; }
"$CT" dataset synth --out "$tmp/held" --count 8 --seed 99 --size 16x16 >/dev/null || { echo "FAIL - synth"; exit 1; }
cat > "$tmp/backend.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile", "crop": false}]
JSON
cat > "$tmp/vae.json" <<JSON
{"_class_name": "AutoencoderKL", "block_out_channels": [8, 16], "layers_per_block": 1, "latent_channels": 4,
 "norm_num_groups": 4}
JSON
cat > "$tmp/base.json" <<JSON
{"--model_type": "vae", "--vae_config": "$tmp/vae.json", "--resolution": 16, "--aspect_bucket_alignment": 8,
 "--data_backend_config": "$tmp/backend.json", "--train_batch_size": 4, "--learning_rate": 2e-3, "--seed": 3,
 "--max_train_steps": 12, "--checkpoint_step_interval": 6, "--validation_step_interval": 6,
 "--disable_progress_bar": true, "--vae_stats_images": 16}
JSON

if out=$("$CT" train --config "$tmp/base.json" --output_dir="$tmp/a" 2>"$tmp/a.err"); then
  ok "trained 12 steps: $(echo "$out" | tail -1 | cut -c1-100)"
else
  bad "vae training failed: $(tail -3 "$tmp/a.err")"
fi
[ -f "$tmp/a/checkpoint-6/.guard" ] && [ -f "$tmp/a/checkpoint-12/vae/diffusion_pytorch_model.safetensors" ] &&
  [ -f "$tmp/a/checkpoint-12/vae/config.json" ] && [ -f "$tmp/a/checkpoint-12/optimizer.safetensors" ] &&
  ok "checkpoints hold the VAE in diffusers' layout and the optimizer state" || bad "checkpoint files: $(ls -R "$tmp/a" | head -20)"
[ -f "$tmp/a/validation_images/step_000012_reconstruction.png" ] && grep -q '"validation_psnr"' "$tmp/a/metrics.jsonl" &&
  ok "validation grid and PSNR" || bad "no validation output"
if r=$("$PY" - "$tmp/a/vae/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
assert c["_class_name"] == "AutoencoderKL" and c["block_out_channels"] == [8, 16] and c["latent_channels"] == 4
assert c["scaling_factor"] > 0 and c["scaling_factor"] != 0.18215 and c["shift_factor"] != 0, c
print(f"scaling_factor {c['scaling_factor']:.4g}, shift_factor {c['shift_factor']:.4g}")
PY
); then ok "latent statistics in the saved config.json: $r"; else bad "saved config: $r"; fi

# exact resume: 6 steps, then 6 more from checkpoint-6 == the 12 uninterrupted steps
"$CT" train --config "$tmp/base.json" --output_dir="$tmp/b" --max_train_steps=6 >/dev/null 2>&1 &&
  "$CT" train --config "$tmp/base.json" --output_dir="$tmp/b" --resume_from_checkpoint=latest >/dev/null 2>"$tmp/b.err" ||
  bad "resume runs failed: $(tail -3 "$tmp/b.err")"
cat > "$tmp/losses.py" <<'PY'
import json, sys
def losses(d):
    return [json.loads(l)["loss"] for l in open(d + "/metrics.jsonl") if '"loss"' in l]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
tol = float(sys.argv[3])
err = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)) if a and len(a) == len(b) else float("inf")
print(f"{len(a)} steps, max relative difference {err:.3g}")
sys.exit(0 if err <= tol else 1)
PY
r=$("$PY" "$tmp/losses.py" "$tmp/b" "$tmp/a" 0) && ok "resume from checkpoint-6 reproduces the uninterrupted losses ($r)" ||
  bad "resume differs: $r"

# 2 ranks x batch 2 == 1 rank x batch 4 (the same global batches)
if "${MPIRUN[@]}" -np 2 -x OMP_NUM_THREADS=1 "$CT" train --config "$tmp/base.json" --output_dir="$tmp/n2" \
    --train_batch_size=2 --max_train_steps=6 --checkpoint_step_interval=0 >/dev/null 2>"$tmp/n2.err" &&
  OMP_NUM_THREADS=1 "$CT" train --config "$tmp/base.json" --output_dir="$tmp/n1" --max_train_steps=6 \
    --checkpoint_step_interval=0 >/dev/null 2>&1; then
  r=$("$PY" "$tmp/losses.py" "$tmp/n2" "$tmp/n1" 1e-5) && ok "2 ranks x batch 2 == 1 rank x batch 4 ($r)" ||
    bad "2 ranks differ: $r"
else
  bad "2-rank vae training failed: $(tail -3 "$tmp/n2.err")"
fi

# held-out reconstruction
if r=$("$CT" eval vae --vae "$tmp/a/vae" --images "$tmp/held" --grid "$tmp/grid.png" 2>&1); then
  echo "$r" | "$PY" -c "import json,sys; d=json.loads(sys.stdin.read()); sys.exit(0 if d['images']==8 and d['psnr']>5 else 1)" &&
    [ -f "$tmp/grid.png" ] && ok "ctuner eval vae on 8 held-out images: $r" || bad "eval vae: $r"
else
  bad "eval vae failed: $r"
fi

# the trained VAE as the MMDiT's codec: latents cached through it (tagged by
# its digest), validation and `ctuner sample` decoding through it, and
# vae_cache_disable (encoding per step) giving the same losses as the cache
cat > "$tmp/mm.json" <<JSON
{"--preset": "tiny", "--codec": "vae", "--pretrained_vae_model_name_or_path": "$tmp/a/vae", "--resolution": 16,
 "--aspect_bucket_alignment": 8, "--data_backend_config": "$tmp/backend.json", "--train_batch_size": 2,
 "--max_train_steps": 6, "--checkpoint_step_interval": 0, "--learning_rate": 1e-3, "--seed": 4,
 "--disable_progress_bar": true, "--validation_prompt": "a red circle", "--validation_num_inference_steps": 2}
JSON
if "$CT" train --config "$tmp/mm.json" --output_dir="$tmp/m1" >/dev/null 2>"$tmp/m1.err"; then
  entry=$(ls "$tmp/m1/cache/vae/shapes/"*.st | head -1)
  grep -aq '"codec":"vae:\|"codec": "vae:' "$entry" && ok "MMDiT on the VAE's latents: trained; cache entries tagged with the VAE's digest" ||
    bad "cache entry not tagged vae: $(head -c 200 "$entry" | tr -dc '[:print:]')"
  [ -n "$(ls "$tmp/m1/validation_images/"*.png 2>/dev/null)" ] && ok "validation images decoded through the VAE" ||
    bad "no validation images: $(tail -3 "$tmp/m1.err")"
  # the checkpoint carries its VAE: sampling works with the original directory gone
  cp -r "$tmp/a/vae" "$tmp/vae_saved" && rm -rf "$tmp/a/vae"
  if [ -f "$tmp/m1/checkpoint-6/vae/diffusion_pytorch_model.safetensors" ] &&
    "$CT" sample --checkpoint "latest:$tmp/m1" --prompt "a red circle" --steps 2 --out "$tmp/s.png" >/dev/null 2>"$tmp/s.err" &&
    "$PY" -c "from PIL import Image; import sys; sys.exit(0 if Image.open('$tmp/s.png').size == (16, 16) else 1)"; then
    ok "ctuner sample decodes through the checkpoint's own copy of the VAE (16x16 image, original VAE removed)"
  else
    bad "sample with the VAE codec: $(tail -3 "$tmp/s.err")"
  fi
else
  bad "MMDiT with codec vae failed: $(tail -3 "$tmp/m1.err")"
fi
[ -d "$tmp/vae_saved" ] && cp -r "$tmp/vae_saved" "$tmp/a/vae"
printf '[{"id": "shapes", "type": "local", "instance_data_dir": "%s", "caption_strategy": "textfile", "crop": false, "vae_cache_disable": true}]\n' \
  "$tmp/data" > "$tmp/backend_nocache.json"
if "$CT" train --config "$tmp/mm.json" --output_dir="$tmp/m2" --data_backend_config="$tmp/backend_nocache.json" \
    --disable_validation=true >/dev/null 2>"$tmp/m2.err" &&
  "$CT" train --config "$tmp/mm.json" --output_dir="$tmp/m3" --disable_validation=true >/dev/null 2>&1; then
  r=$("$PY" "$tmp/losses.py" "$tmp/m2" "$tmp/m3" 0) && ok "vae_cache_disable (encoding per step) == the latent cache ($r)" ||
    bad "vae_cache_disable differs: $r"
else
  bad "vae_cache_disable run failed: $(tail -3 "$tmp/m2.err")"
fi

# configuration errors
out=$("$CT" train --config "$tmp/base.json" --output_dir="$tmp/e" --vae_config=none 2>&1)
rc=$?
[ $rc = 2 ] && echo "$out" | grep -q "model_type vae needs vae_config" && ok "model_type vae without a VAE: exit 2 and its reason" ||
  bad "missing vae_config: exit $rc: $out"
echo '{"block_out_channels": [8, 12], "norm_num_groups": 8}' > "$tmp/bad.json"
out=$("$CT" train --config "$tmp/base.json" --output_dir="$tmp/e2" --vae_config="$tmp/bad.json" 2>&1)
rc=$?
[ $rc != 0 ] && echo "$out" | grep -q "block_out_channels\[1\] = 12 is not a positive multiple of norm_num_groups 8" &&
  ok "a bad VAE config.json names the key" || bad "bad vae config: exit $rc: $out"
exit $fail
