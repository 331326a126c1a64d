#!/usr/bin/env bash
# FLUX.1 Kontext from the command line (docs/kontext.md): `ctuner sample
# --image REF` on the tiny FLUX.1 pipeline (tests/data/flux_pipe/dev) with the
# reference of tests/data/flux_kontext; the pipeline's sizes (max_area,
# _auto_resize) refused or adjusted by name; a Kontext training run refused by
# name (its image pairs are not yet loaded). Values against diffusers'
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

"$CT" train --pretrained_model_name_or_path=$P --model_flavour=kontext --output_dir="$tmp/o" > /dev/null 2> "$tmp/tr.err"; rc=$?
[ $rc -ne 0 ] && grep -q "model_flavour kontext: training on image pairs" "$tmp/tr.err" && [ ! -e "$tmp/o" ] &&
  ok "train --model_flavour kontext: refused by name before anything opens" || bad "train: rc=$rc $(cat "$tmp/tr.err")"
finish
