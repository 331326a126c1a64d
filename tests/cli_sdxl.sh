#!/usr/bin/env bash
# The model-family registry from the command line (docs/models.md): SimpleTuner's
# families ctuner does not have are refused by name by `config check`, listing
# those it has; a FLUX flavour not offered (fluxbooru) too; model_family sdxl is
# trained by `ctuner train` from a pipeline directory (tests/cli_sdxl_train.sh),
# and without one it stops before opening anything, naming the key.
# Usage: tests/cli_sdxl.sh path/to/ctuner
. "$(dirname "$0")/lib/common.sh"

echo '{"model_type": "full"}' > "$tmp/c.json"
"$CT" config check "$tmp/c.json" --model_family=sd3 > "$tmp/out" 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q "model_family 'sd3' is one of SimpleTuner's families, not yet in ctuner; ctuner has \"flux\" or \"sdxl\"" "$tmp/out" &&
  ok "sd3: refused by name, the families listed" || bad "rc=$rc $(cat "$tmp/out")"
"$CT" config check "$tmp/c.json" --model_flavour=fluxbooru > "$tmp/out" 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q "model_flavour 'fluxbooru' is one of SimpleTuner's FLUX.1 flavours, not yet in ctuner" "$tmp/out" &&
  ok "flux flavour fluxbooru: refused by name" || bad "rc=$rc $(cat "$tmp/out")"
"$CT" config check "$tmp/c.json" --model_family=sdxl --model_flavour=schnell > "$tmp/out" 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q "model_flavour must be none, base-1.0, refiner-1.0, base-0.9 or refiner-0.9 (model_family sdxl), got 'schnell'" "$tmp/out" &&
  ok "sdxl with a FLUX flavour: refused, the sdxl flavours listed" || bad "rc=$rc $(cat "$tmp/out")"
"$CT" train --model_family=sdxl --output_dir="$tmp/o" > "$tmp/out" 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q "model_family sdxl needs pretrained_model_name_or_path" "$tmp/out" && [ ! -e "$tmp/o" ] &&
  ok "train sdxl without a pipeline: stops before anything is made, naming the key" || bad "rc=$rc $(cat "$tmp/out"); $(ls "$tmp")"
finish
