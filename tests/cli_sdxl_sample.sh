#!/usr/bin/env bash
# `ctuner sample --pretrained DIR` of a StableDiffusionXLPipeline (docs/sdxl.md)
# on the tiny pipeline tests/data/sdxl_pipe: the family read from
# model_index.json, a PNG of the requested size, a progress line per step, the
# same seed giving the same image; sizes, schedulers and options it does not
# take refused by name (the pixels against diffusers: tests/test_sdxl_sample.c).
# Usage: tests/cli_sdxl_sample.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"

P=tests/data/sdxl_pipe
run() { "$CT" sample --pretrained "$P" --prompt "a red square" --steps 3 --width 32 --height 24 "$@"; }
run --out "$tmp/a.png" --negative_prompt blurry --scheduler dpm++2m --guidance_rescale 0.5 \
  > "$tmp/out" 2> "$tmp/err"; rc=$?
[ $rc -eq 0 ] && grep -q '"width": 32, "height": 24, "steps": 3' "$tmp/out" &&
  grep -q '"scheduler": "dpm++2m", "negative_prompt": "blurry"' "$tmp/out" &&
  grep -q "step 3/3" "$tmp/err" && file "$tmp/a.png" | grep -q "PNG image data, 32 x 24" &&
  ok "sdxl pipeline: a 32x24 PNG, the settings echoed, progress per step" ||
  bad "rc=$rc $(cat "$tmp/out" "$tmp/err")"
run --model_family sdxl --out "$tmp/b.png" --negative_prompt blurry --scheduler dpm++2m \
  --guidance_rescale 0.5 > "$tmp/out" 2>&1; rc=$?
[ $rc -eq 0 ] && cmp -s "$tmp/a.png" "$tmp/b.png" && ok "--model_family sdxl: the same image again" ||
  bad "rc=$rc $(cat "$tmp/out")"
run --out "$tmp/c.png" --width 30 > "$tmp/out" 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q "image size 30x24 must be positive multiples of 4" "$tmp/out" && [ ! -e "$tmp/c.png" ] &&
  ok "a width the U-net cannot take: refused" || bad "rc=$rc $(cat "$tmp/out")"
run --out "$tmp/c.png" --scheduler unipc > "$tmp/out" 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q "sampler 'unipc' is not offered for SDXL" "$tmp/out" &&
  ok "--scheduler unipc: refused by name" || bad "rc=$rc $(cat "$tmp/out")"
run --out "$tmp/c.png" --guidance_rescale 1.5 > "$tmp/out" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "guidance_rescale must be in \[0, 1\]" "$tmp/out" &&
  ok "--guidance_rescale 1.5: refused" || bad "rc=$rc $(cat "$tmp/out")"
run --out "$tmp/c.png" --lora x.safetensors > "$tmp/out" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "does not take --lora" "$tmp/out" && ok "--lora on SDXL: refused (not yet)" ||
  bad "rc=$rc $(cat "$tmp/out")"
run --out "$tmp/c.png" --model_family flux > "$tmp/out" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "is a StableDiffusionXLPipeline, not model_family flux" "$tmp/out" &&
  ok "--model_family flux on an SDXL pipeline: refused" || bad "rc=$rc $(cat "$tmp/out")"
"$CT" sample --pretrained tests/data/flux_pipe/dev --prompt a --out "$tmp/d.png" --negative_prompt b \
  > "$tmp/out" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "negative_prompt is for an SDXL pipeline" "$tmp/out" &&
  ok "--negative_prompt on FLUX.1: refused" || bad "rc=$rc $(cat "$tmp/out")"
finish
