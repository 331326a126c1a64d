#!/usr/bin/env bash
# The MMDiT in the latent space of a VAE that ctuner trains itself
# (examples/vae_latent, docs/vae.md): 1. the demo's synthetic dataset, 2. a
# small AutoencoderKL (model_type vae), 3. its held-out reconstruction PSNR,
# 4. the demo's MMDiT trained on that VAE's latents (codec vae), 5. held-out
# prompts sampled and judged with `ctuner eval synth`.
# Usage: scripts/demo_vae.sh [path/to/ctuner]   (DEMO_OUT, default demo-output)
set -euo pipefail
CT=${1:-build/ctuner}
cd "$(dirname "$0")/.."
export DEMO_OUT=${DEMO_OUT:-demo-output}
start=$(date +%s)
mkdir -p "$DEMO_OUT"
marker="$DEMO_OUT/data/.complete-2000-seed1-64x64"
if [ ! -f "$marker" ]; then
  echo "== 1/5 synthetic dataset: $DEMO_OUT/data"
  rm -rf "$DEMO_OUT/data"
  "$CT" dataset synth --out "$DEMO_OUT/data" --count 2000 --seed 1 --size 64x64
  touch "$marker"
fi
echo "== 2/5 training the VAE (examples/vae_latent/vae.json; $DEMO_OUT/vae)"
"$CT" train --config examples/vae_latent/vae.json --resume_from_checkpoint=none --disable_progress_bar=true
echo "== 3/5 its reconstruction of 256 held-out images"
rm -rf "$DEMO_OUT/vae_heldout"
"$CT" dataset synth --out "$DEMO_OUT/vae_heldout" --count 256 --seed 99 --size 32x32 >/dev/null
"$CT" eval vae --vae "$DEMO_OUT/vae/vae" --images "$DEMO_OUT/vae_heldout" --grid "$DEMO_OUT/vae_heldout_grid.png" |
  tee "$DEMO_OUT/vae_eval.json"
echo "== 4/5 training the MMDiT on its latents (examples/vae_latent/mmdit.json; $DEMO_OUT/latent_run)"
"$CT" train --config examples/vae_latent/mmdit.json --resume_from_checkpoint=none
echo "== 5/5 sampling and judging 48 held-out prompts"
"$CT" dataset prompts --held-out --count 48 --seed 7 > "$DEMO_OUT/heldout_prompts.txt"
rm -rf "$DEMO_OUT/latent_heldout"
"$CT" sample --checkpoint "latest:$DEMO_OUT/latent_run" --ema --prompts-file "$DEMO_OUT/heldout_prompts.txt" \
  --out-dir "$DEMO_OUT/latent_heldout"
"$CT" eval synth --images "$DEMO_OUT/latent_heldout" | tee "$DEMO_OUT/latent_eval.json"
echo "demo-vae finished in $(( $(date +%s) - start )) s: $DEMO_OUT/vae_eval.json, $DEMO_OUT/latent_eval.json"
